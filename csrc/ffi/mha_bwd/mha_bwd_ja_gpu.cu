// XLA FFI handler for the flash-attention backward on the GPU (CUDA or ROCm builds only).
#include "ja/gpu.h"
#include "mha_bwd_common.h"
#include "../gpu_handler_traits.h"

namespace ffi = xla::ffi;

static ffi::Error mha_bwd_gpu(ja_stream_t stream, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                              ffi::AnyBuffer o, ffi::AnyBuffer dout, ffi::AnyBuffer lse, ffi::RemainingArgs poison,
                              ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk,
                              ffi::Result<ffi::AnyBuffer> dv, ffi::Result<ffi::AnyBuffer> dq_accum,
                              ffi::Result<ffi::AnyBuffer> delta, bool causal, float scale) {
  return ja::mha_bwd_call(q, k, v, o, dout, lse, poison, *dq, *dk, *dv, *dq_accum, *delta, causal, scale,
                          [stream](const JaMhaBwdArgs* a) { return ja_mha_bwd_gpu(a, stream); });
}

JA_FFI_HANDLER(JaMhaBwdGpu);
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaMhaBwdGpu, mha_bwd_gpu,
                              ffi::Ffi::Bind().Ctx<ffi::PlatformStream<ja_stream_t>>().Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().RemainingArgs()
                                  .Ret<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>()
                                  .Attr<bool>("causal").Attr<float>("scale"),
                              JA_GPU_HANDLER_TRAITS);
