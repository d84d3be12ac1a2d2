// Flash-attention backward on the GPU (CUDA and HIP from this one source): the dispatch between the
// portable kernels (the preprocess, dK/dV/dQ and dQ conversion of simt/bwd.cuh's header).
//
// mha_bwd_gpu sends a call to the mma.sync kernels (mma/bwd.cuh, bfloat16/float16 on CUDA) where
// they handle its features, else to the SIMT ones (float32, HIP, and bias and dropout everywhere), or to the family
// the call names (implementation=); ja_mha_bwd_gpu_path_calls(path) counts the calls each ran.
#pragma once
#include <algorithm>
#include <initializer_list>

#include "ja/kernels/mha.h"
#include "mha/common/gpu.cuh"
#include "mha/common/gpu_calls.h"
#include "mha/mma/bwd.cuh"
#include "mha/simt/bwd.cuh"

namespace ja {

// impl: the family the call asked for (JaMhaImpl; the entry point has taken SM90 and refused CPU): AUTO takes the
// mma.sync kernels where they run the call, a named family runs it or says why not.
template <typename T, int D, bool CAUSAL>
const char* mha_bwd_gpu(const JaMhaBwdArgs& a, void* stream, int32_t impl) {
  using mha_gpu::kThreads;
  const ja_stream_t s = static_cast<ja_stream_t>(stream);
  const JaMhaProblem& p = a.p;
  const int64_t q_rows = p.batch * p.seq_q * p.heads_q;
  if (q_rows == 0 && p.batch * p.seq_k * p.heads_kv == 0) return nullptr;
  if (const char* e = mha_gpu::check_problem<D>("mha_bwd", p)) return e;
  for (const void* ptr : {a.q, a.k, a.v, a.dout, static_cast<const void*>(a.dq), static_cast<const void*>(a.dk),
                          static_cast<const void*>(a.dv)})
    if (!mha_gpu::aligned16(ptr))
      return ja_error("mha_bwd: q, k, v, dout, dq, dk and dv must be 16-byte aligned on the GPU");
  if (impl == JA_MHA_IMPL_DECODE)
    return mha_gpu::refuse_forced("mha_bwd", impl,
                                  "the split-KV decode kernel is a forward; its calls' backward runs "
                                  "the default family");
  int path = kPathSimt;
#if JA_HAS_WARP_MMA
  if constexpr (mha_gpu::use_mma<T>()) {
    if (impl == JA_MHA_IMPL_AUTO || impl == JA_MHA_IMPL_MMA) {
      const char* f = mha_unhandled_feature(a, mha_gpu::kBwdMmaFeatures);
      if (!f) path = kPathMma;
      else if (impl == JA_MHA_IMPL_MMA)
        return mha_gpu::refuse_forced("mha_bwd", impl, ja_error("it does not handle %s", f));
    }
  }
#endif
  if (impl == JA_MHA_IMPL_MMA && path != kPathMma)
    return mha_gpu::refuse_forced("mha_bwd", impl, "its kernels run bfloat16 and float16 on CUDA's matrix units only");

  if (q_rows > 0) {
    const int64_t blocks = std::min<int64_t>((q_rows + mha_gpu::kTy - 1) / mha_gpu::kTy, mha_gpu::kMaxBlocks);
    mha_gpu::mha_bwd_preprocess<T, D><<<unsigned(blocks), kThreads, 0, s>>>(a);
    if (const char* e = mha_gpu::launch_status("mha_bwd (preprocess)")) return e;
  }
  if (a.dbias && q_rows > 0 && p.seq_k > 0) {  // the kernels write the visible pairs' dS only
    const ja_error_t e = ja_memset_async(a.dbias, 0, size_t(q_rows * p.seq_k) * sizeof(float), s);
    if (e != ja_success) return ja_error("mha_bwd: zeroing dbias failed: %s", ja_get_error_string(e));
  }
#if JA_HAS_WARP_MMA
  if constexpr (mha_gpu::use_mma<T>()) {
    if (path == kPathMma) {
      if (const char* e = mha_gpu::mha_bwd_mma_launch<T, D, CAUSAL>(a, s)) return e;
    }
  }
#endif
  if (path == kPathSimt) {
    if (const char* e = mha_gpu::mha_bwd_simt_launch<T, D>(a, s)) return e;
  }
  if (q_rows > 0 && !a.deterministic) {
    const int64_t n = q_rows * p.head_dim;
    const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, mha_gpu::kMaxBlocks);
    mha_gpu::mha_bwd_convert_dq<T><<<unsigned(blocks), kThreads, 0, s>>>(a.dq_accum, static_cast<T*>(a.dq), n);
    if (const char* e = mha_gpu::launch_status("mha_bwd (convert dQ)")) return e;
  }
  mha_gpu_path_calls(path).fetch_add(1, std::memory_order_relaxed);
  return nullptr;
}

}  // namespace ja
