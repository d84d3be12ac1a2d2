// XLA FFI handler for the flash-attention backward on the GPU (CUDA or ROCm builds only).
#include "ja/gpu.h"
#include "mha_bwd_common.h"
#include "../gpu_handler_traits.h"

namespace ffi = xla::ffi;

static ffi::Error mha_bwd_gpu(ja_stream_t stream, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                              ffi::AnyBuffer o, ffi::AnyBuffer dout, ffi::AnyBuffer lse, ffi::AnyBuffer rows,
                              ffi::AnyBuffer cols, ffi::AnyBuffer alibi, ffi::AnyBuffer bias, ffi::AnyBuffer seed,
                              ffi::RemainingArgs poison, ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk,
                              ffi::Result<ffi::AnyBuffer> dv, ffi::Result<ffi::AnyBuffer> dbias,
                              ffi::Result<ffi::AnyBuffer> dq_accum, ffi::Result<ffi::AnyBuffer> delta,
                              ffi::Result<ffi::AnyBuffer> sync, int32_t mask, float scale, float softcap,
                              float dropout_p, bool deterministic, int32_t implementation) {
  return ja::mha_bwd_call({q, k, v, o, dout, lse, rows, cols, alibi, bias, seed}, poison,
                          {*dq, *dk, *dv, *dbias, *dq_accum, *delta, *sync},
                          {mask, scale, softcap, dropout_p, implementation}, deterministic,
                          [stream](const JaMhaBwdArgs* a, int32_t impl) { return ja_mha_bwd_gpu(a, stream, impl); });
}

JA_FFI_HANDLER(JaMhaBwdGpu);
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaMhaBwdGpu, mha_bwd_gpu,
                              JA_MHA_BWD_BINDING(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<ja_stream_t>>()),
                              JA_GPU_HANDLER_TRAITS);
