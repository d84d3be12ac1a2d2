// XLA FFI handler for the flash-attention forward on the CPU (always built).
#include "mha_fwd_common.h"

namespace ffi = xla::ffi;

JA_DEFINE_FFI_API_VERSION()

static ffi::Error mha_fwd_cpu(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::RemainingArgs poison,
                              ffi::Result<ffi::AnyBuffer> o, ffi::Result<ffi::AnyBuffer> lse,
                              ffi::Result<ffi::AnyBuffer> ws, bool causal, float scale) {
  return ja::mha_fwd_call(q, k, v, poison, *o, *lse, *ws, causal, scale,
                          [](const JaMhaFwdArgs* a) { return ja_mha_fwd_cpu(a); });
}

JA_FFI_HANDLER(JaMhaFwdCpu);
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaMhaFwdCpu, mha_fwd_cpu,
                              ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>()
                                  .RemainingArgs().Ret<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>()
                                  .Attr<bool>("causal").Attr<float>("scale"));
