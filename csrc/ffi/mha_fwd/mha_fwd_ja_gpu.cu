// XLA FFI handler for the flash-attention forward on the GPU (CUDA or ROCm builds only).
#include "ja/gpu.h"
#include "mha_fwd_common.h"
#include "../gpu_handler_traits.h"

namespace ffi = xla::ffi;

static ffi::Error mha_fwd_gpu(ja_stream_t stream, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                              ffi::AnyBuffer rows, ffi::AnyBuffer alibi, ffi::AnyBuffer bias, ffi::AnyBuffer seed,
                              ffi::RemainingArgs poison, ffi::Result<ffi::AnyBuffer> o, ffi::Result<ffi::AnyBuffer> lse,
                              ffi::Result<ffi::AnyBuffer> ws, int32_t mask, float scale, float softcap, float dropout_p,
                              int32_t implementation) {
  return ja::mha_fwd_call({q, k, v, rows, alibi, bias, seed}, poison, *o, *lse, *ws,
                          {mask, scale, softcap, dropout_p, implementation},
                          [stream](const JaMhaFwdArgs* a, int32_t impl) { return ja_mha_fwd_gpu(a, stream, impl); });
}

JA_FFI_HANDLER(JaMhaFwdGpu);
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaMhaFwdGpu, mha_fwd_gpu,
                              JA_MHA_FWD_BINDING(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<ja_stream_t>>()),
                              JA_GPU_HANDLER_TRAITS);
