// XLA FFI handler for the flash-attention backward on the CPU (always built).
#include "mha_bwd_common.h"

namespace ffi = xla::ffi;

JA_DEFINE_FFI_API_VERSION()

static ffi::Error mha_bwd_cpu(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer o,
                              ffi::AnyBuffer dout, ffi::AnyBuffer lse, ffi::AnyBuffer rows, ffi::AnyBuffer cols,
                              ffi::AnyBuffer alibi, ffi::AnyBuffer bias, ffi::AnyBuffer seed, ffi::RemainingArgs poison,
                              ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk,
                              ffi::Result<ffi::AnyBuffer> dv, ffi::Result<ffi::AnyBuffer> dbias,
                              ffi::Result<ffi::AnyBuffer> dq_accum, ffi::Result<ffi::AnyBuffer> delta,
                              ffi::Result<ffi::AnyBuffer> sync, int32_t mask, float scale, float softcap,
                              float dropout_p, bool deterministic, int32_t implementation) {
  return ja::mha_bwd_call(
      {q, k, v, o, dout, lse, rows, cols, alibi, bias, seed}, poison, {*dq, *dk, *dv, *dbias, *dq_accum, *delta, *sync},
      {mask, scale, softcap, dropout_p, implementation}, deterministic,
      [](const JaMhaBwdArgs* a, int32_t) { return ja_mha_bwd_cpu(a); },
      /*host_memory=*/true);
}

JA_FFI_HANDLER(JaMhaBwdCpu);
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaMhaBwdCpu, mha_bwd_cpu, JA_MHA_BWD_BINDING(ffi::Ffi::Bind()));
