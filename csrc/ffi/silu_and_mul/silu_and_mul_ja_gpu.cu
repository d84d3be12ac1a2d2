// XLA FFI handler for SiLU-and-mul on the GPU (CUDA or ROCm builds only).
#include "activation/silu_and_mul_gpu.cuh"
#include "silu_and_mul_common.h"
#include "../gpu_handler_traits.h"

namespace ffi = xla::ffi;

const char* ja_silu_and_mul_gpu(const JaSiluAndMulArgs* a, void* stream) {
  switch (ja::DType(a->dtype)) {
    case ja::DType::kF32: return ja::silu_and_mul_gpu<float>(*a, stream);
    case ja::DType::kBF16: return ja::silu_and_mul_gpu<ja::bf16_t>(*a, stream);
    case ja::DType::kF16: return ja::silu_and_mul_gpu<ja::f16_t>(*a, stream);
    case ja::DType::kF8E4M3: break;  // a storage type only (ja/dtype.h)
  }
  return ja_error("silu_and_mul: unsupported dtype id %d", a->dtype);
}

static ffi::Error silu_and_mul_gpu(ja_stream_t stream, ffi::AnyBuffer x, ffi::RemainingArgs poison,
                                   ffi::Result<ffi::AnyBuffer> out) {
  if (auto e = ja::check_poison(poison, 1); e.failure()) return e;
  JaSiluAndMulArgs a{};
  if (auto e = ja::silu_and_mul_args(x, *out, &a); e.failure()) return e;
  return ja::from_kernel(ja_silu_and_mul_gpu(&a, stream));
}

JA_FFI_HANDLER(JaSiluAndMulGpu);
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaSiluAndMulGpu, silu_and_mul_gpu,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<ja_stream_t>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .RemainingArgs()
                                  .Ret<ffi::AnyBuffer>(),
                              JA_GPU_HANDLER_TRAITS);
