// XLA FFI handlers for RMSNorm on the GPU (CUDA or ROCm builds only).
#include "ja/gpu.h"
#include "rmsnorm_common.h"
#include "../gpu_handler_traits.h"

namespace ffi = xla::ffi;

static ffi::Error rmsnorm_gpu(ja_stream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer w, ffi::RemainingArgs poison,
                              ffi::Result<ffi::AnyBuffer> out, float eps) {
  if (auto e = ja::check_poison(poison, 1); e.failure()) return e;
  JaRmsNormArgs a{};
  if (auto e = ja::rmsnorm_args(x, nullptr, w, *out, nullptr, eps, &a); e.failure()) return e;
  return ja::from_kernel(ja_rmsnorm_fwd_gpu(&a, stream));
}

static ffi::Error rmsnorm_add_gpu(ja_stream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer residual, ffi::AnyBuffer w,
                                  ffi::RemainingArgs poison, ffi::Result<ffi::AnyBuffer> out,
                                  ffi::Result<ffi::AnyBuffer> residual_out, float eps) {
  if (auto e = ja::check_poison(poison, 2); e.failure()) return e;
  JaRmsNormArgs a{};
  if (auto e = ja::rmsnorm_args(x, &residual, w, *out, &*residual_out, eps, &a); e.failure()) return e;
  return ja::from_kernel(ja_rmsnorm_fwd_gpu(&a, stream));
}

JA_FFI_HANDLER(JaRmsNormFwdGpu);
JA_FFI_HANDLER(JaRmsNormFwdAddGpu);

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaRmsNormFwdGpu, rmsnorm_gpu,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<ja_stream_t>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .RemainingArgs()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<float>("eps"),
                              JA_GPU_HANDLER_TRAITS);
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaRmsNormFwdAddGpu, rmsnorm_add_gpu,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<ja_stream_t>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .RemainingArgs()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<float>("eps"),
                              JA_GPU_HANDLER_TRAITS);
