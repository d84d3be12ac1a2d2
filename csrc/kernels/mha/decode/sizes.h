// What decides and sizes the split-KV decode path (decode/fwd.cuh), host and device: which calls are decode
// shapes (few query rows per kv head: the prefill kernels, sm90/fwd_launch.cuh, decline them), the keys a tile
// holds and the fewest tiles a split gets. The Python op sizes the forward's workspace from these
// (jax_aiter/ops/_attn_sizes.py; tests/build/test_abi_constants.py holds its mirrors to them). A plain C++ header;
// the build-time knobs are described in decode/fwd.cuh.
#pragma once
#include <cstdint>

#include "ja/kernels/mha.h"

#ifndef JA_MHA_DECODE_WARPS
#define JA_MHA_DECODE_WARPS 4
#endif
#ifndef JA_MHA_DECODE_MIN_TILES
#define JA_MHA_DECODE_MIN_TILES 4
#endif
#ifndef JA_MHA_DECODE_MAX_ROWS
#define JA_MHA_DECODE_MAX_ROWS 64
#endif

namespace ja {
namespace mha_gpu {

// Query rows that share one kv head.
inline int64_t decode_rows(const JaMhaFwdArgs& a) { return a.p.heads_q / a.p.heads_kv * a.p.seq_q; }

inline bool decode_applies(const JaMhaFwdArgs& a) {
  return a.p.heads_kv > 0 && decode_rows(a) <= JA_MHA_DECODE_MAX_ROWS;
}

}  // namespace mha_gpu
}  // namespace ja
