// Argument checks shared by the CPU and GPU RMSNorm handlers.
#pragma once
#include "ja/ffi_util.h"
#include "ja/kernels/rmsnorm.h"

namespace ja {

// Validates shapes and dtypes and fills the kernel arguments. residual and
// residual_out are null for plain rms_norm.
inline ffi::Error rmsnorm_args(const ffi::AnyBuffer& x, const ffi::AnyBuffer* residual, const ffi::AnyBuffer& w,
                               ffi::AnyBuffer& out, ffi::AnyBuffer* residual_out, float eps, JaRmsNormArgs* a) {
  DType dt;
  if (!to_dtype(x.element_type(), &dt)) return invalid("rms_norm: x must be float32, bfloat16 or float16");
  if (w.element_type() != x.element_type() || (residual && residual->element_type() != x.element_type()))
    return invalid("rms_norm: x, residual and weight must share one dtype; cast them to x.dtype");
  if (x.dimensions().size() < 1) return invalid("rms_norm: x must have rank >= 1");
  const int64_t hidden = last_dim(x);
  if (int64_t(w.element_count()) != hidden)
    return invalid("rms_norm: weight has " + std::to_string(w.element_count()) +
                   " elements but x's last dimension is " + std::to_string(hidden));
  if (residual && residual->element_count() != x.element_count())
    return invalid("rms_norm_with_add: residual and x must have the same shape");
  if (!(eps >= 0.0f)) return invalid("rms_norm: eps must be a non-negative float");
  *a = JaRmsNormArgs{int32_t(dt),
                     leading_rows(x),
                     hidden,
                     x.untyped_data(),
                     residual ? residual->untyped_data() : nullptr,
                     w.untyped_data(),
                     out.untyped_data(),
                     residual_out ? residual_out->untyped_data() : nullptr,
                     eps};
  return ffi::Error::Success();
}

}  // namespace ja
