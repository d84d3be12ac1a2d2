// Calls each portable GPU attention kernel ran, counted for the tests (tests/ops/test_attention_gpu_paths.py
// checks that a call it sends to one kernel ran there): libmha_fwd.so exports them as
// ja_mha_fwd_gpu_path_calls(path) and libmha_bwd.so as ja_mha_bwd_gpu_path_calls(path).
// A plain C++ header: the CUDA/HIP instances and the host-compiled dispatch share these counters.
#pragma once
#include <atomic>
#include <cstdint>

namespace ja {

// Forward: kPathSimt, kPathMma (mma.sync), kPathDecode (split-KV); backward: kPathSimt, kPathMma.
enum MhaGpuPath : int { kPathSimt = 0, kPathMma = 1, kPathDecode = 2, kPathCount = 3 };

inline std::atomic<int64_t>& mha_gpu_path_calls(int path) {
  static std::atomic<int64_t> calls[kPathCount];
  return calls[path >= 0 && path < kPathCount ? path : 0];
}

inline int64_t mha_gpu_path_count(int path) {
  return path >= 0 && path < kPathCount ? mha_gpu_path_calls(path).load(std::memory_order_relaxed) : -1;
}

}  // namespace ja
