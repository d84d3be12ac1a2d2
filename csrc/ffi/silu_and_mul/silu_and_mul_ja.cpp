// XLA FFI handler for SiLU-and-mul on the CPU (always built).
#include "activation/silu_and_mul_cpu.h"
#include "silu_and_mul_common.h"

namespace ffi = xla::ffi;

JA_DEFINE_FFI_API_VERSION()

const char* ja_silu_and_mul_cpu(const JaSiluAndMulArgs* a) {
  switch (ja::DType(a->dtype)) {
    case ja::DType::kF32: return ja::silu_and_mul_cpu<float>(*a);
    case ja::DType::kBF16: return ja::silu_and_mul_cpu<ja::bf16_t>(*a);
    case ja::DType::kF16: return ja::silu_and_mul_cpu<ja::f16_t>(*a);
    case ja::DType::kF8E4M3: break;  // a storage type only (ja/dtype.h)
  }
  return ja_error("silu_and_mul: unsupported dtype id %d", a->dtype);
}

static ffi::Error silu_and_mul_cpu(ffi::AnyBuffer x, ffi::RemainingArgs poison, ffi::Result<ffi::AnyBuffer> out) {
  if (auto e = ja::check_poison(poison, 1); e.failure()) return e;
  JaSiluAndMulArgs a{};
  if (auto e = ja::silu_and_mul_args(x, *out, &a); e.failure()) return e;
  return ja::from_kernel(ja_silu_and_mul_cpu(&a));
}

JA_FFI_HANDLER(JaSiluAndMulCpu);
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaSiluAndMulCpu, silu_and_mul_cpu,
                              ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().RemainingArgs().Ret<ffi::AnyBuffer>());
