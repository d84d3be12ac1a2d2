// XLA FFI handler for the flash-attention forward on the CPU (always built).
#include "mha_fwd_common.h"

namespace ffi = xla::ffi;

JA_DEFINE_FFI_API_VERSION()

static ffi::Error mha_fwd_cpu(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer rows,
                              ffi::AnyBuffer alibi, ffi::AnyBuffer bias, ffi::AnyBuffer seed, ffi::RemainingArgs poison,
                              ffi::Result<ffi::AnyBuffer> o, ffi::Result<ffi::AnyBuffer> lse,
                              ffi::Result<ffi::AnyBuffer> ws, int32_t mask, float scale, float softcap, float dropout_p,
                              int32_t implementation) {
  return ja::mha_fwd_call(
      {q, k, v, rows, alibi, bias, seed}, poison, *o, *lse, *ws, {mask, scale, softcap, dropout_p, implementation},
      [](const JaMhaFwdArgs* a, int32_t) { return ja_mha_fwd_cpu(a); }, /*host_memory=*/true);
}

JA_FFI_HANDLER(JaMhaFwdCpu);
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaMhaFwdCpu, mha_fwd_cpu, JA_MHA_FWD_BINDING(ffi::Ffi::Bind()));
