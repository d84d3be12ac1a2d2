// Argument checks shared by the mha_fwd and mha_bwd FFI handlers (CPU and GPU).
//
// The Python op validates first and gives the friendlier error; these checks
// guard the C ABI against any other caller (a hand-written ffi_call), so a bad
// shape is an InvalidArgument error, never an out-of-bounds access.
#pragma once
#include <cmath>
#include <string>
#include <vector>

#include "ja/ffi_util.h"
#include "ja/kernels/mha.h"
#include "ja/kernels/mha_features.h"

namespace ja {

struct MhaShape {
  int32_t dtype;
  int64_t batch, seq_q, seq_k, heads_q, heads_kv, head_dim;
};

inline std::string shape_text(const ffi::AnyBuffer& b) {
  std::string s = "(";
  const auto dims = b.dimensions();
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + (dims.size() == 1 ? ",)" : ")");
}

// The problem of a dense (causal or not) call with head_dim_v == head_dim and no other feature.
inline JaMhaProblem mha_dense_problem(const MhaShape& s, bool causal, float scale) {
  JaMhaProblem p{};
  p.dtype = s.dtype;
  p.batch = s.batch, p.seq_q = s.seq_q, p.seq_k = s.seq_k, p.heads_q = s.heads_q, p.heads_kv = s.heads_kv;
  p.head_dim = p.head_dim_v = s.head_dim;
  p.mask = causal ? kMaskCausal : kMaskNone;
  p.scale = scale;
  return p;
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
  return s + ")";
}

// `buf` must have dtype `dt` (float32 or q's) and exactly the dims `want`.
inline ffi::Error mha_expect(const char* op, const char* name, const ffi::AnyBuffer& buf, ffi::DataType dt,
                             const std::vector<int64_t>& want) {
  if (buf.element_type() != dt)
    return invalid(std::string(op) + ": " + name + " has the wrong dtype (expected " +
                   (dt == ffi::DataType::F32 ? "float32" : "q's dtype") + ")");
  if (!has_dims(buf, want))
    return invalid(std::string(op) + ": " + name + " has shape " + shape_text(buf) + ", expected " +
                   dims_text(want));
  return ffi::Error::Success();
}

// q [b, sq, hq, d], k and v [b, sk, hkv, d], one supported dtype, hq % hkv == 0.
inline ffi::Error mha_shape(const char* op, const ffi::AnyBuffer& q, const ffi::AnyBuffer& k,
                            const ffi::AnyBuffer& v, float scale, MhaShape* s) {
  DType dt;
  if (!to_dtype(q.element_type(), &dt)) return invalid(std::string(op) + ": q must be float32, bfloat16 or float16");
  if (k.element_type() != q.element_type() || v.element_type() != q.element_type())
    return invalid(std::string(op) + ": q, k and v must share one dtype");
  if (q.dimensions().size() != 4 || k.dimensions().size() != 4 || v.dimensions().size() != 4)
    return invalid(std::string(op) + ": q, k and v must have rank 4 [batch, seq, heads, head_dim]; got q " +
                   shape_text(q) + ", k " + shape_text(k) + ", v " + shape_text(v));
  const auto qd = q.dimensions(), kd = k.dimensions();
  *s = MhaShape{int32_t(dt), qd[0], qd[1], kd[1], qd[2], kd[2], qd[3]};
  if (!has_dims(k, {s->batch, s->seq_k, s->heads_kv, s->head_dim}) || !has_dims(v, {kd[0], kd[1], kd[2], kd[3]}))
    return invalid(std::string(op) + ": k " + shape_text(k) + " and v " + shape_text(v) +
                   " must both be [batch, seq_k, heads_kv, head_dim] with q's batch and head_dim (q " +
                   shape_text(q) + ")");
  if (s->heads_kv <= 0 || s->heads_q % s->heads_kv != 0)
    return invalid(std::string(op) + ": heads_q (" + std::to_string(s->heads_q) +
                   ") must be a multiple of heads_kv (" + std::to_string(s->heads_kv) + ")");
  if (!std::isfinite(scale)) return invalid(std::string(op) + ": scale must be a finite float");
  return ffi::Error::Success();
}

}  // namespace ja
