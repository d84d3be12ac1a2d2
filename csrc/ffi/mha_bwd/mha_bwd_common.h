// Argument checks shared by the CPU and GPU mha_bwd handlers.
#pragma once
#include "../mha_args.h"

namespace ja {

// Inputs q, k, v, o, dout (q's dtype), lse (float32 [b, hq, sq]); results dq,
// dk, dv and the float32 workspace dq_accum [b, sq, hq, d] and delta [b, hq, sq].
inline ffi::Error mha_bwd_args(const ffi::AnyBuffer& q, const ffi::AnyBuffer& k, const ffi::AnyBuffer& v,
                               const ffi::AnyBuffer& o, const ffi::AnyBuffer& dout, const ffi::AnyBuffer& lse,
                               ffi::AnyBuffer& dq, ffi::AnyBuffer& dk, ffi::AnyBuffer& dv, ffi::AnyBuffer& dq_accum,
                               ffi::AnyBuffer& delta, bool causal, float scale, JaMhaBwdArgs* a) {
  MhaShape s{};
  if (auto e = mha_shape("mha_bwd", q, k, v, scale, &s); e.failure()) return e;
  const std::vector<int64_t> q_dims{s.batch, s.seq_q, s.heads_q, s.head_dim};
  const std::vector<int64_t> kv_dims{s.batch, s.seq_k, s.heads_kv, s.head_dim};
  const std::vector<int64_t> row_dims{s.batch, s.heads_q, s.seq_q};
  const auto dt = q.element_type(), f32 = ffi::DataType::F32;
  const struct {
    const char* name;
    const ffi::AnyBuffer& buf;
    ffi::DataType dt;
    const std::vector<int64_t>& dims;
  } expected[] = {{"o", o, dt, q_dims},       {"dout", dout, dt, q_dims},   {"lse", lse, f32, row_dims},
                  {"dq", dq, dt, q_dims},     {"dk", dk, dt, kv_dims},      {"dv", dv, dt, kv_dims},
                  {"dq_accum", dq_accum, f32, q_dims}, {"delta", delta, f32, row_dims}};
  for (const auto& x : expected)
    if (auto e = mha_expect("mha_bwd", x.name, x.buf, x.dt, x.dims); e.failure()) return e;
  *a = JaMhaBwdArgs{};
  a->p = mha_dense_problem(s, causal, scale);
  a->deterministic = 0;
  a->q = q.untyped_data(), a->k = k.untyped_data(), a->v = v.untyped_data(), a->o = o.untyped_data();
  a->dout = dout.untyped_data(), a->lse = static_cast<const float*>(lse.untyped_data());
  a->dq = dq.untyped_data(), a->dk = dk.untyped_data(), a->dv = dv.untyped_data();
  a->dq_accum = static_cast<float*>(dq_accum.untyped_data()), a->delta = static_cast<float*>(delta.untyped_data());
  return ffi::Error::Success();
}

// The whole handler body for either platform: checks, then launch(&args).
template <typename Launch>
ffi::Error mha_bwd_call(const ffi::AnyBuffer& q, const ffi::AnyBuffer& k, const ffi::AnyBuffer& v,
                        const ffi::AnyBuffer& o, const ffi::AnyBuffer& dout, const ffi::AnyBuffer& lse,
                        const ffi::RemainingArgs& poison, ffi::AnyBuffer& dq, ffi::AnyBuffer& dk, ffi::AnyBuffer& dv,
                        ffi::AnyBuffer& dq_accum, ffi::AnyBuffer& delta, bool causal, float scale,
                        Launch&& launch) {
  if (auto e = check_poison(poison, 5); e.failure()) return e;
  JaMhaBwdArgs a{};
  if (auto e = mha_bwd_args(q, k, v, o, dout, lse, dq, dk, dv, dq_accum, delta, causal, scale, &a); e.failure())
    return e;
  return from_kernel(launch(&a));
}

}  // namespace ja
