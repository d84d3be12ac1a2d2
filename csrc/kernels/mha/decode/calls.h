// Calls of the split-KV decode forward (decode/fwd.cuh) that took its TMA path, and those that
// merged their splits in a thread-block cluster, counted for the tests: libmha_fwd.so exports the counts
// as ja_mha_fwd_decode_tma_calls() and ja_mha_fwd_decode_cluster_calls() (fwd_dispatch.cpp).
// A plain C++ header: the CUDA instances and the host-compiled dispatch share this one counter.
#pragma once
#include <atomic>
#include <cstdint>

namespace ja {

inline std::atomic<int64_t>& mha_decode_tma_calls() {
  static std::atomic<int64_t> calls{0};
  return calls;
}

inline std::atomic<int64_t>& mha_decode_cluster_calls() {
  static std::atomic<int64_t> calls{0};
  return calls;
}

}  // namespace ja
