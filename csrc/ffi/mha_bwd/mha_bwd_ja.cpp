// XLA FFI handler for the flash-attention backward on the CPU (always built).
#include "mha_bwd_common.h"

namespace ffi = xla::ffi;

JA_DEFINE_FFI_API_VERSION()

static ffi::Error mha_bwd_cpu(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer o,
                              ffi::AnyBuffer dout, ffi::AnyBuffer lse, ffi::RemainingArgs poison,
                              ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk,
                              ffi::Result<ffi::AnyBuffer> dv, ffi::Result<ffi::AnyBuffer> dq_accum,
                              ffi::Result<ffi::AnyBuffer> delta, bool causal, float scale) {
  return ja::mha_bwd_call(q, k, v, o, dout, lse, poison, *dq, *dk, *dv, *dq_accum, *delta, causal, scale,
                          [](const JaMhaBwdArgs* a) { return ja_mha_bwd_cpu(a); });
}

JA_FFI_HANDLER(JaMhaBwdCpu);
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaMhaBwdCpu, mha_bwd_cpu,
                              ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().RemainingArgs()
                                  .Ret<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>()
                                  .Attr<bool>("causal").Attr<float>("scale"));
