// Flash-attention forward on the GPU (CUDA and HIP from this one source): the dispatch between the
// portable kernels.
//
// mha_fwd_gpu sends a call to the first kernel that handles all of its features (common/gpu.cuh):
// the split-KV decode kernel for few query rows per kv head (decode/fwd.cuh), then the mma.sync
// kernel (mma/fwd.cuh), both bfloat16/float16 on CUDA; then the SIMT kernel (simt/fwd.cuh: float32, HIP, and
// bias and dropout everywhere). A call that names a family (implementation=) runs there or is refused, naming why;
// ja_mha_fwd_gpu_path_calls(path) counts the calls each kernel ran (common/gpu_calls.h).
#pragma once
#include "ja/kernels/mha.h"
#include "mha/common/gpu.cuh"
#include "mha/common/gpu_calls.h"
#include "mha/decode/fwd.cuh"
#include "mha/mma/fwd.cuh"
#include "mha/simt/fwd.cuh"

namespace ja {
namespace mha_gpu {

// Runs `launch` and counts the call on `path` when it succeeded.
template <typename Launch>
const char* counted(int path, Launch&& launch) {
  const char* err = launch();
  if (!err) mha_gpu_path_calls(path).fetch_add(1, std::memory_order_relaxed);
  return err;
}

}  // namespace mha_gpu

// impl: the family the call asked for (JaMhaImpl; the entry point has taken SM90 and refused CPU): AUTO takes the
// first kernel that runs the call, a named one runs it or says why not.
template <typename T, int D, bool CAUSAL>
const char* mha_fwd_gpu(const JaMhaFwdArgs& a, void* stream, int32_t impl) {
  const ja_stream_t s = static_cast<ja_stream_t>(stream);
  if (a.p.batch == 0 || a.p.seq_q == 0 || a.p.heads_q == 0) return nullptr;
  if (const char* e = mha_gpu::check_problem<D>("mha_fwd", a.p)) return e;
  if (!mha_gpu::aligned16(a.q) || !mha_gpu::aligned16(a.k) || !mha_gpu::aligned16(a.v) || !mha_gpu::aligned16(a.o))
    return ja_error("mha_fwd: q, k, v and o must be 16-byte aligned on the GPU");
  const bool any = impl == JA_MHA_IMPL_AUTO;
#if JA_HAS_WARP_MMA
  // 16-bit inputs on the matrix units; float32 keeps the SIMT kernel (exact float32 products).
  // Few query rows per kv head (decode): split-KV over the keys (decode/fwd.cuh).
  if constexpr (mha_gpu::use_mma<T>()) {
    if (impl == JA_MHA_IMPL_DECODE || (any && mha_gpu::decode_applies(a))) {
      const char* why = mha_gpu::decode_refusal<T, D>(a);
      if (!why) return mha_gpu::counted(kPathDecode, [&] { return mha_gpu::mha_decode_launch<T, D, CAUSAL>(a, s); });
      if (!any) return mha_gpu::refuse_forced("mha_fwd", impl, why);
    }
    if (any || impl == JA_MHA_IMPL_MMA) {
      const char* f = mha_unhandled_feature(a.p, mha_gpu::kFwdMmaFeatures);
      if (!f) return mha_gpu::counted(kPathMma, [&] { return mha_gpu::mha_fwd_mma_launch<T, D, CAUSAL>(a, s); });
      if (!any) return mha_gpu::refuse_forced("mha_fwd", impl, ja_error("it does not handle %s", f));
    }
  }
#endif
  if (impl == JA_MHA_IMPL_DECODE || impl == JA_MHA_IMPL_MMA)
    return mha_gpu::refuse_forced("mha_fwd", impl, "its kernels run bfloat16 and float16 on CUDA's matrix units only");
  return mha_gpu::counted(kPathSimt, [&] { return mha_gpu::mha_fwd_simt_launch<T, D>(a, s); });
}

}  // namespace ja
