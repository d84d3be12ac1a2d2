// Argument checks shared by the CPU and GPU mha_fwd handlers.
#pragma once
#include "../mha_args.h"

namespace ja {

// q, k, v in; o [b, sq, hq, d] (q's dtype) and lse float32 [b, hq, sq] out, and a float32
// workspace of any shape (the Python op sizes it for the split-KV decode path; it may be empty).
inline ffi::Error mha_fwd_args(const ffi::AnyBuffer& q, const ffi::AnyBuffer& k, const ffi::AnyBuffer& v,
                               ffi::AnyBuffer& o, ffi::AnyBuffer& lse, ffi::AnyBuffer& ws, bool causal, float scale,
                               JaMhaFwdArgs* a) {
  MhaShape s{};
  if (auto e = mha_shape("mha_fwd", q, k, v, scale, &s); e.failure()) return e;
  if (auto e = mha_expect("mha_fwd", "o", o, q.element_type(), {s.batch, s.seq_q, s.heads_q, s.head_dim});
      e.failure())
    return e;
  if (auto e = mha_expect("mha_fwd", "lse", lse, ffi::DataType::F32, {s.batch, s.heads_q, s.seq_q}); e.failure())
    return e;
  if (ws.element_type() != ffi::DataType::F32) return invalid("mha_fwd: the workspace must be float32");
  *a = JaMhaFwdArgs{mha_dense_problem(s, causal, scale), q.untyped_data(), k.untyped_data(), v.untyped_data(),
                    o.untyped_data(), static_cast<float*>(lse.untyped_data()), ws.untyped_data(),
                    int64_t(ws.size_bytes())};
  return ffi::Error::Success();
}

// The whole handler body for either platform: checks, then launch(&args).
template <typename Launch>
ffi::Error mha_fwd_call(const ffi::AnyBuffer& q, const ffi::AnyBuffer& k, const ffi::AnyBuffer& v,
                        const ffi::RemainingArgs& poison, ffi::AnyBuffer& o, ffi::AnyBuffer& lse, ffi::AnyBuffer& ws,
                        bool causal, float scale, Launch&& launch) {
  if (auto e = check_poison(poison, 3); e.failure()) return e;
  JaMhaFwdArgs a{};
  if (auto e = mha_fwd_args(q, k, v, o, lse, ws, causal, scale, &a); e.failure()) return e;
  return from_kernel(launch(&a));
}

}  // namespace ja
