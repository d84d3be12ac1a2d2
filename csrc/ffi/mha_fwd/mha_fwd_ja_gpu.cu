// XLA FFI handler for the flash-attention forward on the GPU (CUDA or ROCm builds only).
#include "ja/gpu.h"
#include "mha_fwd_common.h"
#include "../gpu_handler_traits.h"

namespace ffi = xla::ffi;

static ffi::Error mha_fwd_gpu(ja_stream_t stream, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                              ffi::RemainingArgs poison, ffi::Result<ffi::AnyBuffer> o,
                              ffi::Result<ffi::AnyBuffer> lse, ffi::Result<ffi::AnyBuffer> ws, bool causal,
                              float scale) {
  return ja::mha_fwd_call(q, k, v, poison, *o, *lse, *ws, causal, scale,
                          [stream](const JaMhaFwdArgs* a) { return ja_mha_fwd_gpu(a, stream); });
}

JA_FFI_HANDLER(JaMhaFwdGpu);
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaMhaFwdGpu, mha_fwd_gpu,
                              ffi::Ffi::Bind().Ctx<ffi::PlatformStream<ja_stream_t>>().Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().RemainingArgs()
                                  .Ret<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>()
                                  .Attr<bool>("causal").Attr<float>("scale"),
                              JA_GPU_HANDLER_TRAITS);
