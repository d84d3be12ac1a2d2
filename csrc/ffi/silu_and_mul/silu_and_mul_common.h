// Argument checks shared by the CPU and GPU SiLU-and-mul handlers.
#pragma once
#include "ja/ffi_util.h"
#include "ja/kernels/activation.h"

namespace ja {

inline ffi::Error silu_and_mul_args(const ffi::AnyBuffer& x, ffi::AnyBuffer& out, JaSiluAndMulArgs* a) {
  DType dt;
  if (!to_dtype(x.element_type(), &dt)) return invalid("silu_and_mul: x must be float32, bfloat16 or float16");
  if (out.element_type() != x.element_type()) return invalid("silu_and_mul: out dtype must match x");
  if (x.dimensions().size() < 1) return invalid("silu_and_mul: x must have rank >= 1");
  const int64_t width = last_dim(x);
  if (width % 2 != 0)
    return invalid("silu_and_mul: x's last dimension (" + std::to_string(width) +
                   ") must be even: it holds [gate | up] halves");
  *a = JaSiluAndMulArgs{int32_t(dt), leading_rows(x), width / 2, x.untyped_data(), out.untyped_data()};
  return ffi::Error::Success();
}

}  // namespace ja
