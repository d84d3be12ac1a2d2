// The entry point of the Hopper (sm_90a) attention backward: whether it takes a call, and which kernel runs it
// (sm90/bwd_kernel.cuh: head dims up to 128; sm90/bwd_kernel_d256.cuh: 192 and 256), between the preprocess and
// the dQ conversion of sm90/bwd_passes.cuh.
#pragma once
#include "ja/kernels/mha.h"
#include "mha/sm90/bwd_passes.cuh"
#include "mha/sm90/bwd_kernel.cuh"
#include "mha/sm90/bwd_kernel_d256.cuh"  // head dims 192, 256: the head dim split over the warpgroups
#include "mha/sm90/dims.h"

namespace ja {
namespace mha_sm90 {

// Runs the whole backward (preprocess, this kernel, dQ conversion) when the Hopper kernel
// applies: sets *handled and returns the launch status; otherwise leaves *handled = 0 and the
// caller takes the mma.sync / SIMT path. It does not apply on another device, to empty shapes,
// to unaligned pointers, to sizes past int32, to head dims this instance does not cover
// (sm90/dims.h) or to features it does not handle (kBwdFeatures).
template <typename T, int D, bool CAUSAL>
const char* mha_bwd_sm90(const JaMhaBwdArgs& a, void* stream, int* handled) {
  *handled = 0;
  if (!bwd_sm90_applies<D>(a) || !device_is_sm90()) return nullptr;
  *handled = 1;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const bool feat = a.p.softcap > 0.0f || a.p.alibi != nullptr;
  if constexpr (D == 256) {
    const int kd = sm90_bwd_kernel_head_dim(a.p.head_dim, a.p.head_dim_v);
    return bwd_run<T, 64, CAUSAL>(a, s, [&]() -> const char* {
      if (kd == 192 && a.p.head_dim_v <= 128)
        return feat ? mha_bwd_sm90_d256_launch<T, 192, 128, CAUSAL, true>(a, s)
                    : mha_bwd_sm90_d256_launch<T, 192, 128, CAUSAL, false>(a, s);
      if (kd == 192)
        return feat ? mha_bwd_sm90_d256_launch<T, 192, 192, CAUSAL, true>(a, s)
                    : mha_bwd_sm90_d256_launch<T, 192, 192, CAUSAL, false>(a, s);
      return feat ? mha_bwd_sm90_d256_launch<T, 256, 256, CAUSAL, true>(a, s)
                  : mha_bwd_sm90_d256_launch<T, 256, 256, CAUSAL, false>(a, s);
    });
  } else {
    constexpr int kBN = BwdTraits<typename CutlassType<T>::type, D>::BN;
    return bwd_run<T, kBN, CAUSAL>(a, s, [&]() -> const char* {
      return feat ? mha_bwd_sm90_launch<T, D, CAUSAL, true>(a, s) : mha_bwd_sm90_launch<T, D, CAUSAL, false>(a, s);
    });
  }
}

}  // namespace mha_sm90
}  // namespace ja
