// XLA FFI handlers for RMSNorm on the CPU (always built).
#include "rmsnorm_common.h"

namespace ffi = xla::ffi;

JA_DEFINE_FFI_API_VERSION()

static ffi::Error rmsnorm_cpu(ffi::AnyBuffer x, ffi::AnyBuffer w, ffi::RemainingArgs poison,
                              ffi::Result<ffi::AnyBuffer> out, float eps) {
  if (auto e = ja::check_poison(poison, 1); e.failure()) return e;
  JaRmsNormArgs a{};
  if (auto e = ja::rmsnorm_args(x, nullptr, w, *out, nullptr, eps, &a); e.failure()) return e;
  return ja::from_kernel(ja_rmsnorm_fwd_cpu(&a));
}

static ffi::Error rmsnorm_add_cpu(ffi::AnyBuffer x, ffi::AnyBuffer residual, ffi::AnyBuffer w,
                                  ffi::RemainingArgs poison, ffi::Result<ffi::AnyBuffer> out,
                                  ffi::Result<ffi::AnyBuffer> residual_out, float eps) {
  if (auto e = ja::check_poison(poison, 2); e.failure()) return e;
  JaRmsNormArgs a{};
  if (auto e = ja::rmsnorm_args(x, &residual, w, *out, &*residual_out, eps, &a); e.failure()) return e;
  return ja::from_kernel(ja_rmsnorm_fwd_cpu(&a));
}

JA_FFI_HANDLER(JaRmsNormFwdCpu);
JA_FFI_HANDLER(JaRmsNormFwdAddCpu);

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JaRmsNormFwdCpu, rmsnorm_cpu,
    ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().RemainingArgs().Ret<ffi::AnyBuffer>().Attr<float>(
        "eps"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaRmsNormFwdAddCpu, rmsnorm_add_cpu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .RemainingArgs()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<float>("eps"));
