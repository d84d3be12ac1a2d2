// Argument checks shared by the CPU and GPU mha_fwd handlers (docs/attention.md's FFI spec of ja_mha_fwd).
#pragma once
#include "../mha_args.h"

namespace ja {

// The operands of ja_mha_fwd before its RemainingArgs (the optional aliased output buffers).
struct MhaFwdOperands {
  const ffi::AnyBuffer &q, &k, &v, &rows, &alibi, &bias, &seed;
};

// q, k, v, rows, alibi, bias, seed in; o [b, sq, hq, dv] (q's dtype) and lse float32 [b, hq, sq] out, and a
// float32 workspace of any shape (the Python op sizes it for the GPU's split-KV decode path; it may be empty).
inline ffi::Error mha_fwd_args(const MhaFwdOperands& in, ffi::AnyBuffer& o, ffi::AnyBuffer& lse, ffi::AnyBuffer& ws,
                               const MhaAttrs& at, JaMhaFwdArgs* a) {
  MhaShape s{};
  if (auto e = mha_shape("mha_fwd", in.q, in.k, in.v, &s); e.failure()) return e;
  *a = JaMhaFwdArgs{};
  if (auto e = mha_problem("mha_fwd", s, at, in.rows, in.alibi, in.bias, in.seed, &a->p); e.failure()) return e;
  if (auto e = mha_expect("mha_fwd", "o", o, in.q.element_type(), {s.batch, s.seq_q, s.heads_q, s.head_dim_v});
      e.failure())
    return e;
  if (auto e = mha_expect("mha_fwd", "lse", lse, ffi::DataType::F32, {s.batch, s.heads_q, s.seq_q}); e.failure())
    return e;
  if (ws.element_type() != ffi::DataType::F32) return invalid("mha_fwd: the workspace ws must be float32");
  a->q = in.q.untyped_data(), a->k = in.k.untyped_data(), a->v = in.v.untyped_data();
  a->o = o.untyped_data(), a->lse = static_cast<float*>(lse.untyped_data());
  a->workspace = ws.untyped_data(), a->workspace_bytes = int64_t(ws.size_bytes());
  return ffi::Error::Success();
}

// The whole handler body for either platform: checks, then launch(&args, implementation). With the operands in host
// memory (the CPU), the rows of a ROWS mask are checked too.
template <typename Launch>
ffi::Error mha_fwd_call(const MhaFwdOperands& in, const ffi::RemainingArgs& poison, ffi::AnyBuffer& o,
                        ffi::AnyBuffer& lse, ffi::AnyBuffer& ws, const MhaAttrs& at, Launch&& launch,
                        bool host_memory = false) {
  if (auto e = check_poison(poison, 3); e.failure()) return e;
  if (const char* e = mha_impl_error("mha_fwd", at.implementation, !host_memory)) return from_kernel(e);
  JaMhaFwdArgs a{};
  if (auto e = mha_fwd_args(in, o, lse, ws, at, &a); e.failure()) return e;
  if (host_memory)
    if (auto e = mha_check_rows_host("mha_fwd", a.p); e.failure()) return e;
  return from_kernel(launch(&a, at.implementation));
}

}  // namespace ja

// The binding of ja_mha_fwd's operands, results and attributes, after the platform's context (if any).
#define JA_MHA_FWD_BINDING(bind)                        \
  bind.Arg<ffi::AnyBuffer>() /* q */                    \
      .Arg<ffi::AnyBuffer>() /* k */                    \
      .Arg<ffi::AnyBuffer>() /* v */                    \
      .Arg<ffi::AnyBuffer>() /* rows */                 \
      .Arg<ffi::AnyBuffer>() /* alibi */                \
      .Arg<ffi::AnyBuffer>() /* bias */                 \
      .Arg<ffi::AnyBuffer>() /* seed */.RemainingArgs() \
      .Ret<ffi::AnyBuffer>() /* o */                    \
      .Ret<ffi::AnyBuffer>() /* lse */                  \
      .Ret<ffi::AnyBuffer>() /* ws */                   \
      .Attr<int32_t>("mask")                            \
      .Attr<float>("scale")                             \
      .Attr<float>("softcap")                           \
      .Attr<float>("dropout_p")                         \
      .Attr<int32_t>("implementation")
