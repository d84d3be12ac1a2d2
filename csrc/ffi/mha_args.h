// Argument checks shared by the mha_fwd and mha_bwd FFI handlers (CPU and GPU): the operands and
// attributes of docs/attention.md's FFI spec, turned into the JaMhaProblem of ja/kernels/mha.h.
//
// The Python op validates first and gives the friendlier error; these checks guard the C ABI
// against any other caller (a hand-written ffi_call), so a bad shape, dtype or attribute is an
// InvalidArgument error naming the operand, never an out-of-bounds access. An optional operand
// that is absent is a shape-(0,) array of its dtype.
#pragma once
#include <cmath>
#include <string>
#include <vector>

#include "ja/ffi_util.h"
#include "ja/kernels/mha.h"
#include "ja/kernels/mha_check.h"
#include "ja/kernels/mha_features.h"

namespace ja {

inline std::string shape_text(const ffi::AnyBuffer& b) {
  std::string s = "(";
  const auto dims = b.dimensions();
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + (dims.size() == 1 ? ",)" : ")");
}

inline bool has_dims(const ffi::AnyBuffer& b, const std::vector<int64_t>& want) {
  const auto dims = b.dimensions();
  if (dims.size() != want.size()) return false;
  for (size_t i = 0; i < want.size(); ++i)
    if (dims[i] != want[i]) return false;
  return true;
}

inline std::string dims_text(const std::vector<int64_t>& d) {
  std::string s = "(";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + (d.size() == 1 ? ",)" : ")");
}

inline const char* type_text(ffi::DataType dt) {
  switch (dt) {
    case ffi::DataType::F32: return "float32";
    case ffi::DataType::S32: return "int32";
    case ffi::DataType::U32: return "uint32";
    default: return "q's dtype";
  }
}

inline std::string op_prefix(const char* op, const char* name) { return std::string(op) + ": " + name; }

// `buf` must have dtype `dt` and exactly the dims `want`.
inline ffi::Error mha_expect(const char* op, const char* name, const ffi::AnyBuffer& buf, ffi::DataType dt,
                             const std::vector<int64_t>& want) {
  if (buf.element_type() != dt)
    return invalid(op_prefix(op, name) + " has the wrong dtype (expected " + type_text(dt) + ")");
  if (!has_dims(buf, want))
    return invalid(op_prefix(op, name) + " has shape " + shape_text(buf) + ", expected " + dims_text(want));
  return ffi::Error::Success();
}

// An optional operand of dtype `dt`: absent (shape (0,)) or present; *present says which.
inline ffi::Error mha_optional(const char* op, const char* name, const ffi::AnyBuffer& buf, ffi::DataType dt,
                               bool* present) {
  if (buf.element_type() != dt)
    return invalid(op_prefix(op, name) + " has the wrong dtype (expected " + type_text(dt) + ")");
  *present = !has_dims(buf, {0});
  return ffi::Error::Success();
}

// One of the allowed leading sizes: 1 (broadcast) or `full`.
inline bool one_or(int64_t d, int64_t full) { return d == 1 || d == full; }

struct MhaShape {
  int32_t dtype;
  int64_t batch, seq_q, seq_k, heads_q, heads_kv, head_dim, head_dim_v;
};

// q [b, sq, hq, d], k [b, sk, hkv, d], v [b, sk, hkv, dv]: one supported dtype, k and v matching q.
inline ffi::Error mha_shape(const char* op, const ffi::AnyBuffer& q, const ffi::AnyBuffer& k, const ffi::AnyBuffer& v,
                            MhaShape* s) {
  DType dt;
  if (!to_dtype(q.element_type(), &dt)) return invalid(std::string(op) + ": q must be float32, bfloat16 or float16");
  if (k.element_type() != q.element_type() || v.element_type() != q.element_type())
    return invalid(std::string(op) + ": q, k and v must share one dtype");
  if (q.dimensions().size() != 4 || k.dimensions().size() != 4 || v.dimensions().size() != 4)
    return invalid(std::string(op) + ": q, k and v must have rank 4 [batch, seq, heads, head_dim]; got q " +
                   shape_text(q) + ", k " + shape_text(k) + ", v " + shape_text(v));
  const auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions();
  *s = MhaShape{int32_t(dt), qd[0], qd[1], kd[1], qd[2], kd[2], qd[3], vd[3]};
  if (!has_dims(k, {s->batch, s->seq_k, s->heads_kv, s->head_dim}))
    return invalid(std::string(op) + ": k " + shape_text(k) +
                   " must be [batch, seq_k, heads_kv, head_dim] with q's "
                   "batch and head_dim (q " +
                   shape_text(q) + ")");
  if (!has_dims(v, {s->batch, s->seq_k, s->heads_kv, s->head_dim_v}))
    return invalid(std::string(op) + ": v " + shape_text(v) +
                   " must be [batch, seq_k, heads_kv, head_dim_v] with k's "
                   "batch, seq_k and heads_kv (k " +
                   shape_text(k) + ")");
  return ffi::Error::Success();  // head dims and heads: mha_problem_error
}

// The attributes every handler takes (implementation: the kernel family, JaMhaImpl).
struct MhaAttrs {
  int32_t mask;
  float scale, softcap, dropout_p;
  int32_t implementation;
};

// The problem: shapes, attributes and the optional operands rows [rb, 3, sq] int32 (mask 2 only),
// alibi [ab, hq] float32, bias [bb, bh, sq, sk] float32 and seed [4] uint32 (dropout_p > 0 only); then the
// C ABI's own rules (mha_problem_error: head dims, heads, the attributes' values).
inline ffi::Error mha_problem(const char* op, const MhaShape& s, const MhaAttrs& at, const ffi::AnyBuffer& rows,
                              const ffi::AnyBuffer& alibi, const ffi::AnyBuffer& bias, const ffi::AnyBuffer& seed,
                              JaMhaProblem* p) {
  const std::string pre = std::string(op) + ": ";
  *p = JaMhaProblem{};
  p->dtype = s.dtype;
  p->batch = s.batch, p->seq_q = s.seq_q, p->seq_k = s.seq_k, p->heads_q = s.heads_q, p->heads_kv = s.heads_kv;
  p->head_dim = s.head_dim, p->head_dim_v = s.head_dim_v;
  p->mask = at.mask, p->scale = at.scale, p->softcap = at.softcap, p->dropout_p = at.dropout_p;

  bool has = false;
  if (auto e = mha_optional(op, "rows", rows, ffi::DataType::S32, &has); e.failure()) return e;
  if (has != (at.mask == kMaskRows)) {
    if (has)
      return invalid(pre + "rows " + shape_text(rows) + " is given but mask is " + std::to_string(at.mask) +
                     "; pass a shape-(0,) int32 array unless mask is 2 (rows)");
    return invalid(pre + "mask 2 (rows) needs rows int32 [1 or batch, 3, seq_q], got shape (0,)");
  }
  if (has) {
    const auto d = rows.dimensions();
    if (d.size() != 3 || !one_or(d[0], s.batch) || d[1] != 3 || d[2] != s.seq_q)
      return invalid(pre + "rows has shape " + shape_text(rows) + ", expected (1 or " + std::to_string(s.batch) +
                     ", 3, " + std::to_string(s.seq_q) + ") [rows_batch, lo/hi/diag, seq_q]");
    p->rows = static_cast<const int32_t*>(rows.untyped_data());
    p->rows_batch_stride = d[0] == 1 ? 0 : 3 * s.seq_q;
  }

  if (auto e = mha_optional(op, "alibi", alibi, ffi::DataType::F32, &has); e.failure()) return e;
  if (has) {
    const auto d = alibi.dimensions();
    if (d.size() != 2 || !one_or(d[0], s.batch) || d[1] != s.heads_q)
      return invalid(pre + "alibi has shape " + shape_text(alibi) + ", expected (1 or " + std::to_string(s.batch) +
                     ", " + std::to_string(s.heads_q) + ") [alibi_batch, heads_q] or (0,)");
    p->alibi = static_cast<const float*>(alibi.untyped_data());
    p->alibi_batch_stride = d[0] == 1 ? 0 : s.heads_q;
  }

  if (auto e = mha_optional(op, "bias", bias, ffi::DataType::F32, &has); e.failure()) return e;
  if (has) {
    const auto d = bias.dimensions();
    if (d.size() != 4 || !one_or(d[0], s.batch) || !one_or(d[1], s.heads_q) || d[2] != s.seq_q || d[3] != s.seq_k)
      return invalid(pre + "bias has shape " + shape_text(bias) + ", expected (1 or " + std::to_string(s.batch) +
                     ", 1 or " + std::to_string(s.heads_q) + ", " + std::to_string(s.seq_q) + ", " +
                     std::to_string(s.seq_k) + ") [bias_batch, bias_heads, seq_q, seq_k] or (0,)");
    p->bias = static_cast<const float*>(bias.untyped_data());
    p->bias_head_stride = d[1] == 1 ? 0 : s.seq_q * s.seq_k;
    p->bias_batch_stride = d[0] == 1 ? 0 : d[1] * s.seq_q * s.seq_k;
  }

  if (auto e = mha_optional(op, "seed", seed, ffi::DataType::U32, &has); e.failure()) return e;
  if (has != (at.dropout_p > 0.0f)) {
    if (has) return invalid(pre + "seed is given but dropout_p is 0; pass a shape-(0,) uint32 array");
    return invalid(pre + "dropout_p > 0 needs seed uint32 [4] (key lo, key hi, batch offset, head offset), got (0,)");
  }
  if (has) {
    if (!has_dims(seed, {4}))
      return invalid(pre + "seed has shape " + shape_text(seed) +
                     ", expected (4,) [key lo, key hi, batch offset, head offset]");
    p->seed = static_cast<const uint32_t*>(seed.untyped_data());
  }
  if (const char* e = mha_problem_error(op, *p)) return invalid(e);
  return ffi::Error::Success();
}

// The rows of a ROWS mask in host memory (the CPU handlers): each batch's lo and hi in [0, seq_k], lo <= hi, both
// non-decreasing (ja/kernels/mha.h); the kernels' tile skipping relies on it. With `cols` (the backward), each
// batch's q_lo_j and q_hi_j must be the first row with hi > j and the first row with lo > j.
inline ffi::Error mha_check_rows_host(const char* op, const JaMhaProblem& p, const int32_t* cols = nullptr,
                                      int64_t cols_batch_stride = 0) {
  if (p.mask != kMaskRows) return ffi::Error::Success();
  const std::string pre = std::string(op) + ": ";
  const int64_t nb = p.rows_batch_stride || (cols && cols_batch_stride) ? p.batch : 1;
  for (int64_t b = 0; b < nb; ++b) {
    const int32_t* lo = p.rows + b * p.rows_batch_stride;
    const int32_t* hi = lo + p.seq_q;
    for (int64_t i = 0; i < p.seq_q; ++i) {
      if (lo[i] < 0 || lo[i] > hi[i] || hi[i] > p.seq_k || (i && (lo[i] < lo[i - 1] || hi[i] < hi[i - 1])))
        return invalid(pre + "rows[" + std::to_string(b) + "] row " + std::to_string(i) + ": lo " +
                       std::to_string(lo[i]) + ", hi " + std::to_string(hi[i]) +
                       (i ? " (previous row " + std::to_string(lo[i - 1]) + ", " + std::to_string(hi[i - 1]) + ")"
                          : std::string()) +
                       "; need 0 <= lo <= hi <= seq_k = " + std::to_string(p.seq_k) + ", lo and hi non-decreasing");
    }
    if (!cols) continue;
    const int32_t* q_lo = cols + b * cols_batch_stride;
    const int32_t* q_hi = q_lo + p.seq_k;
    int64_t a = 0, e = 0;  // first row with hi > j, first row with lo > j
    for (int64_t j = 0; j < p.seq_k; ++j) {
      while (a < p.seq_q && hi[a] <= j) ++a;
      while (e < p.seq_q && lo[e] <= j) ++e;
      if (q_lo[j] != a || q_hi[j] != e)
        return invalid(pre + "cols[" + std::to_string(b) + "] key " + std::to_string(j) + ": q_lo " +
                       std::to_string(q_lo[j]) + ", q_hi " + std::to_string(q_hi[j]) + " disagree with rows (" +
                       std::to_string(a) + ", " + std::to_string(e) +
                       ": the first row with hi > j, the first with "
                       "lo > j)");
    }
  }
  return ffi::Error::Success();
}

}  // namespace ja
