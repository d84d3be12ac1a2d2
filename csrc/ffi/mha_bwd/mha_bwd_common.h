// Argument checks shared by the CPU and GPU mha_bwd handlers (docs/attention.md's FFI spec of ja_mha_bwd).
#pragma once
#include "../mha_args.h"

namespace ja {

// The operands of ja_mha_bwd before its RemainingArgs (the optional aliased output buffers).
struct MhaBwdOperands {
  const ffi::AnyBuffer &q, &k, &v, &o, &dout, &lse, &rows, &cols, &alibi, &bias, &seed;
};

// Its results: the gradients, then dbias and the workspaces.
struct MhaBwdResults {
  ffi::AnyBuffer &dq, &dk, &dv, &dbias, &dq_accum, &delta, &sync;
};

// Query tiles of JA_MHA_SYNC_TILE_ROWS rows: the unit of the deterministic GPU backward's sync words (mha.h).
inline int64_t mha_sync_words(int64_t batch, int64_t heads_q, int64_t seq_q) {
  return batch * heads_q * ((seq_q + JA_MHA_SYNC_TILE_ROWS - 1) / JA_MHA_SYNC_TILE_ROWS);
}

// Inputs q, k, v, o, dout (q's dtype), lse (float32 [b, hq, sq]), cols int32 [rb, 2, sk] (mask 2 only) and the
// forward's optional operands; results dq, dk, dv (q's dtype), dbias float32 [b, hq, sq, sk] or (0,) (only with a
// bias), the float32 workspaces dq_accum [b, sq, hq, d] and delta [b, hq, sq], and the int32 sync workspace
// [b * hq * ceil(sq / 64)] (deterministic) or (0,).
inline ffi::Error mha_bwd_args(const MhaBwdOperands& in, const MhaBwdResults& out, const MhaAttrs& at,
                               bool deterministic, JaMhaBwdArgs* a) {
  MhaShape s{};
  if (auto e = mha_shape("mha_bwd", in.q, in.k, in.v, &s); e.failure()) return e;
  *a = JaMhaBwdArgs{};
  if (auto e = mha_problem("mha_bwd", s, at, in.rows, in.alibi, in.bias, in.seed, &a->p); e.failure()) return e;
  const std::vector<int64_t> q_dims{s.batch, s.seq_q, s.heads_q, s.head_dim};
  const std::vector<int64_t> o_dims{s.batch, s.seq_q, s.heads_q, s.head_dim_v};
  const std::vector<int64_t> k_dims{s.batch, s.seq_k, s.heads_kv, s.head_dim};
  const std::vector<int64_t> v_dims{s.batch, s.seq_k, s.heads_kv, s.head_dim_v};
  const std::vector<int64_t> row_dims{s.batch, s.heads_q, s.seq_q};
  const auto dt = in.q.element_type(), f32 = ffi::DataType::F32;
  const struct {
    const char* name;
    const ffi::AnyBuffer& buf;
    ffi::DataType dt;
    const std::vector<int64_t>& dims;
  } expected[] = {{"o", in.o, dt, o_dims},
                  {"dout", in.dout, dt, o_dims},
                  {"lse", in.lse, f32, row_dims},
                  {"dq", out.dq, dt, q_dims},
                  {"dk", out.dk, dt, k_dims},
                  {"dv", out.dv, dt, v_dims},
                  {"dq_accum", out.dq_accum, f32, q_dims},
                  {"delta", out.delta, f32, row_dims}};
  for (const auto& x : expected)
    if (auto e = mha_expect("mha_bwd", x.name, x.buf, x.dt, x.dims); e.failure()) return e;

  bool has = false;
  if (auto e = mha_optional("mha_bwd", "cols", in.cols, ffi::DataType::S32, &has); e.failure()) return e;
  if (has != (at.mask == kMaskRows)) {
    if (has)
      return invalid("mha_bwd: cols " + shape_text(in.cols) + " is given but mask is " + std::to_string(at.mask) +
                     "; pass a shape-(0,) int32 array unless mask is 2 (rows)");
    return invalid("mha_bwd: mask 2 (rows) needs cols int32 [1 or batch, 2, seq_k], got shape (0,)");
  }
  if (has) {
    const auto d = in.cols.dimensions();
    if (d.size() != 3 || !one_or(d[0], s.batch) || d[1] != 2 || d[2] != s.seq_k)
      return invalid("mha_bwd: cols has shape " + shape_text(in.cols) + ", expected (1 or " + std::to_string(s.batch) +
                     ", 2, " + std::to_string(s.seq_k) + ") [cols_batch, q_lo/q_hi, seq_k]");
    a->cols = static_cast<const int32_t*>(in.cols.untyped_data());
    a->cols_batch_stride = d[0] == 1 ? 0 : 2 * s.seq_k;
  }

  if (auto e = mha_optional("mha_bwd", "dbias", out.dbias, f32, &has); e.failure()) return e;
  if (has) {
    if (!a->p.bias)
      return invalid("mha_bwd: dbias " + shape_text(out.dbias) +
                     " is asked for without a bias; "
                     "pass a shape-(0,) float32 result");
    if (auto e = mha_expect("mha_bwd", "dbias", out.dbias, f32, {s.batch, s.heads_q, s.seq_q, s.seq_k}); e.failure())
      return e;
    a->dbias = static_cast<float*>(out.dbias.untyped_data());
  }

  const int64_t words = mha_sync_words(s.batch, s.heads_q, s.seq_q);
  if (out.sync.element_type() != ffi::DataType::S32)
    return invalid("mha_bwd: sync has the wrong dtype (expected int32)");
  if (!has_dims(out.sync, {0}) && !has_dims(out.sync, {words}))
    return invalid("mha_bwd: sync has shape " + shape_text(out.sync) + ", expected (" + std::to_string(words) +
                   ",) [batch * heads_q * ceil(seq_q / 64)] or (0,)");
  if (deterministic && words > 0 && !has_dims(out.sync, {words}))
    return invalid("mha_bwd: deterministic needs sync int32 (" + std::to_string(words) +
                   ",) [batch * heads_q * ceil(seq_q / 64)], got (0,)");

  a->deterministic = deterministic ? 1 : 0;
  a->q = in.q.untyped_data(), a->k = in.k.untyped_data(), a->v = in.v.untyped_data(), a->o = in.o.untyped_data();
  a->dout = in.dout.untyped_data(), a->lse = static_cast<const float*>(in.lse.untyped_data());
  a->dq = out.dq.untyped_data(), a->dk = out.dk.untyped_data(), a->dv = out.dv.untyped_data();
  a->dq_accum = static_cast<float*>(out.dq_accum.untyped_data());
  a->delta = static_cast<float*>(out.delta.untyped_data());
  a->sync = has_dims(out.sync, {0}) ? nullptr : static_cast<int32_t*>(out.sync.untyped_data());
  a->sync_words = a->sync ? words : 0;
  return ffi::Error::Success();
}

// The whole handler body for either platform: checks, then launch(&args, implementation). With the operands in host
// memory (the CPU), the rows and cols of a ROWS mask are checked too.
template <typename Launch>
ffi::Error mha_bwd_call(const MhaBwdOperands& in, const ffi::RemainingArgs& poison, const MhaBwdResults& out,
                        const MhaAttrs& at, bool deterministic, Launch&& launch, bool host_memory = false) {
  if (auto e = check_poison(poison, 7); e.failure()) return e;
  if (const char* e = mha_impl_error("mha_bwd", at.implementation, !host_memory)) return from_kernel(e);
  JaMhaBwdArgs a{};
  if (auto e = mha_bwd_args(in, out, at, deterministic, &a); e.failure()) return e;
  if (host_memory)
    if (auto e = mha_check_rows_host("mha_bwd", a.p, a.cols, a.cols_batch_stride); e.failure()) return e;
  return from_kernel(launch(&a, at.implementation));
}

}  // namespace ja

// The binding of ja_mha_bwd's operands, results and attributes, after the platform's context (if any).
#define JA_MHA_BWD_BINDING(bind)                                                         \
  bind.Arg<ffi::AnyBuffer>() /* q */                                                     \
      .Arg<ffi::AnyBuffer>() /* k */                                                     \
      .Arg<ffi::AnyBuffer>() /* v */                                                     \
      .Arg<ffi::AnyBuffer>() /* o */                                                     \
      .Arg<ffi::AnyBuffer>() /* dout */                                                  \
      .Arg<ffi::AnyBuffer>() /* lse */                                                   \
      .Arg<ffi::AnyBuffer>() /* rows */                                                  \
      .Arg<ffi::AnyBuffer>() /* cols */                                                  \
      .Arg<ffi::AnyBuffer>() /* alibi */                                                 \
      .Arg<ffi::AnyBuffer>() /* bias */.Arg<ffi::AnyBuffer>() /* seed */.RemainingArgs() \
      .Ret<ffi::AnyBuffer>() /* dq */                                                    \
      .Ret<ffi::AnyBuffer>() /* dk */                                                    \
      .Ret<ffi::AnyBuffer>() /* dv */                                                    \
      .Ret<ffi::AnyBuffer>() /* dbias */                                                 \
      .Ret<ffi::AnyBuffer>() /* dq_accum */                                              \
      .Ret<ffi::AnyBuffer>() /* delta */                                                 \
      .Ret<ffi::AnyBuffer>() /* sync */                                                  \
      .Attr<int32_t>("mask")                                                             \
      .Attr<float>("scale")                                                              \
      .Attr<float>("softcap")                                                            \
      .Attr<float>("dropout_p")                                                          \
      .Attr<bool>("deterministic")                                                       \
      .Attr<int32_t>("implementation")
