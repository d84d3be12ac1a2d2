// The launch of the Hopper (sm_90a) attention forward (sm90/fwd_kernel.cuh): its parameters from a call, the
// kernel for the call's score terms and head dims, and the entry point that says whether it takes the call.
#pragma once
#include "ja/kernels/mha.h"
#include "mha/common/gpu.cuh"
#include "mha/decode/sizes.h"
#include "mha/sm90/common.cuh"
#include "mha/sm90/dims.h"
#include "mha/sm90/fwd_kernel.cuh"

namespace ja {
namespace mha_sm90 {

// Launches the (D, DV) kernel with the score's terms SOFTCAP and ALIBI (EMU: exp2 on the FMA pipe for every
// EMU-th column; the softcap kernels' default kSoftcapEmu).
template <typename T, int D, int DV, bool CAUSAL, bool SOFTCAP, bool ALIBI, int EMU = (SOFTCAP ? kSoftcapEmu : 0)>
const char* mha_fwd_sm90_launch(const JaMhaFwdArgs& a, cudaStream_t stream) {
  using Tr = Traits<typename CutlassType<T>::type, D, DV>;
  using Element = typename Tr::Element;
  const JaMhaProblem& pr = a.p;
  const int sq = int(pr.seq_q), sk = int(pr.seq_k), hq = int(pr.heads_q), hkv = int(pr.heads_kv), bt = int(pr.batch);
  const int d = int(pr.head_dim), dv = int(pr.head_dim_v);
  auto tensor = [&](const void* ptr, int seq, int dim, int heads) {
    return bshd_tensor<Element>(ptr, seq, dim, heads, bt);
  };
  const dim3 grid(unsigned((sq + Tr::kBlockM - 1) / Tr::kBlockM), unsigned(hq), unsigned(bt));
  const float u = SOFTCAP ? pr.softcap : pr.scale;  // the units of x (s = u x)
  typename Tr::Params p{make_tma_copy(SM90_TMA_LOAD{}, tensor(a.q, sq, d, hq), typename Tr::SmemLayoutQ{},
                                      Shape<Int<Tr::kBlockM>, Int<D>>{}, _1{}),
                        make_tma_copy(SM90_TMA_LOAD{}, tensor(a.k, sk, d, hkv), take<0, 2>(typename Tr::SmemLayoutK{}),
                                      Shape<Int<Tr::kBlockN>, Int<D>>{}, _1{}),
                        make_tma_copy(SM90_TMA_LOAD{}, tensor(a.v, sk, dv, hkv), take<0, 2>(typename Tr::SmemLayoutV{}),
                                      Shape<Int<Tr::kBlockN>, Int<DV>>{}, _1{}),
                        make_shape(sq, d, hq, bt),
                        make_shape(sk, d, hkv, bt),
                        make_shape(sk, dv, hkv, bt),
                        static_cast<Element*>(a.o),
                        a.lse,
                        int64_t(hq) * dv,
                        int64_t(sq) * hq * dv,
                        dv,
                        hq,
                        hq / hkv,
                        u * ja_log2e,
                        SOFTCAP ? pr.scale / pr.softcap : 0.0f,
                        ALIBI ? pr.alibi : nullptr,
                        pr.alibi_batch_stride,
                        ALIBI ? 1.0f / u : 0.0f,
                        pr,
                        causal_chunk(grid.x),  // read only by causal grids (grid_place)
                        static_cast<Element const*>(a.q),
                        static_cast<Element const*>(a.k),
                        static_cast<Element const*>(a.v)};
  return mha_gpu::launch_with_smem(mha_fwd_sm90_kernel<Tr, CAUSAL, SOFTCAP, ALIBI, EMU>, grid, Tr::kThreads,
                                   Tr::kSmemBytes, stream, p, "mha_fwd (sm90)");
}

// The launch of the (D, DV) kernel for the call's score terms.
template <typename T, int D, int DV, bool CAUSAL>
const char* mha_fwd_sm90_terms(const JaMhaFwdArgs& a, cudaStream_t s) {
  const bool softcap = a.p.softcap > 0.0f, alibi = a.p.alibi != nullptr;
  if (softcap && alibi) return mha_fwd_sm90_launch<T, D, DV, CAUSAL, true, true>(a, s);
  if (softcap) return mha_fwd_sm90_launch<T, D, DV, CAUSAL, true, false>(a, s);
  if (alibi) return mha_fwd_sm90_launch<T, D, DV, CAUSAL, false, true>(a, s);
  return mha_fwd_sm90_launch<T, D, DV, CAUSAL, false, false>(a, s);
}

// Runs the Hopper kernel when it applies: sets *handled and returns the launch status;
// otherwise leaves *handled = 0 and the caller takes the mma.sync / SIMT / decode path.
// It does not apply on another device, to empty shapes, to decode shapes the split-KV kernel
// runs (few query rows per kv head), to unaligned pointers, to sizes past int32, to head dims
// this instance does not cover (sm90/dims.h), or to features it does not handle (kFwdFeatures).
template <typename T, int D, bool CAUSAL>
const char* mha_fwd_sm90(const JaMhaFwdArgs& a, void* stream, int* handled) {
  *handled = 0;
  if (!sm90_applies<D>(a.p, kFwdFeatures)) return nullptr;
  if (!mha_gpu::aligned16(a.q) || !mha_gpu::aligned16(a.k) || !mha_gpu::aligned16(a.v) || !mha_gpu::aligned16(a.o))
    return nullptr;
  if (mha_gpu::decode_applies(a) && !mha_unhandled_feature(a.p, mha_gpu::kFwdDecodeFeatures)) return nullptr;
  if (!device_is_sm90()) return nullptr;
  *handled = 1;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int kd = sm90_fwd_kernel_head_dim(a.p.head_dim, a.p.head_dim_v);
  if constexpr (D == 256) {
    if (kd == 160) return mha_fwd_sm90_terms<T, 160, 160, CAUSAL>(a, s);
    if (kd == 192)
      return a.p.head_dim_v <= 128 ? mha_fwd_sm90_terms<T, 192, 128, CAUSAL>(a, s)
                                   : mha_fwd_sm90_terms<T, 192, 192, CAUSAL>(a, s);
  }
  if constexpr (D == 96) {
    if (kd == 80) return mha_fwd_sm90_terms<T, 80, 80, CAUSAL>(a, s);
  }
  return mha_fwd_sm90_terms<T, D, D, CAUSAL>(a, s);
}

}  // namespace mha_sm90
}  // namespace ja
