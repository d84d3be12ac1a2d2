// Building blocks of the GPU flash-attention kernels (CUDA and HIP from one source).
//
// Thread layout shared by all MHA kernels: 128 threads = 8 row groups (ty) x
// 16 lanes (tx). A thread owns tile rows ty, ty + 8, ... and columns tx,
// tx + 16, ...; the 16 lanes of a row group are consecutive lanes of one warp
// (on 32- and 64-wide warps alike), so row reductions are 16-lane shuffles.
//
// Tiles live in shared memory in the input dtype, rows padded by one 32-bit
// word so the 16 lanes reading 16 different rows at the same column hit 16
// different banks. The inner products are plain loops over shared memory
// (SIMT, float32 FMA); they are the place where tensor-core MMA goes later.
#pragma once
#include <cstdint>

#include "ja/api.h"
#include "ja/dtype.h"
#include "ja/gpu.h"
#include "ja/kernels/mha.h"
#include "ja/kernels/mha_features.h"
#include "ja/mma.h"

namespace ja {
namespace mha_gpu {

constexpr int kThreads = 128;
constexpr int kTx = 16;               // lanes per row group
constexpr int kTy = kThreads / kTx;   // row groups
constexpr int kSmemBudget = 48 * 1024;  // shared memory without opt-in (CUDA); LDS is 64 KiB on CDNA
#if defined(JA_GPU_HIP)
constexpr int kSmemMax = 64 * 1024;  // a block's LDS on CDNA
#else
constexpr int kSmemMax = 227 * 1024;  // a block's shared memory with opt-in (sm_90; sm_80 has 163 KiB)
#endif
constexpr float kLn2 = 0.6931471805599453f;

// The features (ja::MhaFeature bits, ja/kernels/mha_features.h) each GPU kernel handles; a launch refuses a
// problem that uses any other, naming it (refuse_unhandled), and the sm_90a kernels decline it (the next
// kernel then refuses it). None yet: these kernels run dense and bottom-right causal attention with
// head_dim_v == head_dim, and a nondeterministic backward.
constexpr uint32_t kFwdSimtFeatures = 0, kFwdMmaFeatures = 0, kFwdDecodeFeatures = 0, kFwdSm90Features = 0;
constexpr uint32_t kBwdSimtFeatures = 0, kBwdMmaFeatures = 0, kBwdSm90Features = 0;

// nullptr when the kernel `kernel` handles every feature of args (JaMhaFwdArgs::p or JaMhaBwdArgs), else an
// error naming the first one it does not.
template <typename Args>
inline const char* refuse_unhandled(const char* op, const char* kernel, const Args& args, uint32_t handled) {
  const char* f = mha_unhandled_feature(args, handled);
  return f ? ja_error("%s: the %s GPU kernel does not handle %s yet; run this call on the CPU backend", op, kernel, f)
           : nullptr;
}

// Row stride (elements) of a [rows][D] tile of T in shared memory.
template <typename T, int D>
constexpr int tile_ld() { return D + int(4 / sizeof(T)); }

template <typename T, int N>
struct alignas(16) Pack {
  T v[N];
};

// Copies rows [0, rows_valid) of a global [ROWS][D] tile (rows `stride`
// elements apart) to shared memory with 16-byte loads; pads with zeros.
template <typename T, int ROWS, int D>
JA_DEVICE void load_tile(T* smem, const T* g, int64_t stride, int rows_valid) {
  constexpr int kVec = 16 / int(sizeof(T));
  constexpr int kPerRow = D / kVec;
  constexpr int kLd = tile_ld<T, D>();
  static_assert(D % kVec == 0, "head_dim must be a multiple of 16 bytes");
  for (int idx = threadIdx.x; idx < ROWS * kPerRow; idx += kThreads) {
    const int r = idx / kPerRow, c = (idx % kPerRow) * kVec;
    Pack<T, kVec> p;
    if (r < rows_valid) {
      p = *reinterpret_cast<const Pack<T, kVec>*>(g + r * stride + c);
    } else {
#pragma unroll
      for (int e = 0; e < kVec; ++e) p.v[e] = from_f32<T>(0.0f);
    }
#pragma unroll
    for (int e = 0; e < kVec; ++e) smem[r * kLd + c + e] = p.v[e];
  }
}

// First query row that can see key `key` (bottom-right causal alignment).
JA_HOST_DEVICE int64_t first_query_for_key(int64_t key, int64_t seq_q, int64_t seq_k) {
  const int64_t q = key - (seq_k - seq_q);
  return q > 0 ? q : 0;
}

// Where a block of a (tiles, heads, batches) grid works. Causal tiles differ in work (a forward's last query
// tile sees every key, its first one few; a backward's first key block is seen by every query tile, its last
// by few), and blocks start about in the order of their linear index. With `longest_first` the (head, batch)
// pairs are taken in chunks of `chunk` pairs (0: all of them), and within a chunk the linear index runs over
// its pairs first and tiles last, from each head's heaviest tile (the last one when `heavy_last`, else the
// first) to its lightest: heavy tiles start before light ones (longest-processing-time first), so light ones
// fill the last wave, where the grid's own order (tiles fastest) leaves the last heads' heavy tiles to start
// last and run alone. The chunk keeps the blocks that run at once on few heads, whose inputs they share in L2:
// one chunk of all pairs spreads them over as many heads as there are blocks (causal_chunk sizes it for the
// Hopper kernels). Without a mask every tile has the same work, and the grid's order, in which consecutive
// blocks share a head's inputs in L2, is kept.
struct GridPlace {
  int64_t tile, head, batch;
};

JA_DEVICE GridPlace grid_place(bool longest_first, bool heavy_last, int64_t chunk = 0) {
  if (!longest_first) return {int64_t(blockIdx.x), int64_t(blockIdx.y), int64_t(blockIdx.z)};
  const int64_t tiles = gridDim.x, heads = gridDim.y, pairs = heads * gridDim.z;  // (head, batch) pairs
  const int64_t lin = blockIdx.x + tiles * (blockIdx.y + heads * blockIdx.z);
  const int64_t per = chunk > 0 && chunk < pairs ? chunk : pairs;  // pairs per chunk
  const int64_t c = lin / (per * tiles), r = lin % (per * tiles);
  const int64_t n = pairs - c * per < per ? pairs - c * per : per;  // pairs in this chunk (the last may have fewer)
  const int64_t rank = r / n, pair = c * per + r % n;              // rank 0: each head's heaviest tile
  return {heavy_last ? tiles - 1 - rank : rank, pair % heads, pair / heads};
}

JA_DEVICE bool key_visible(bool causal, int64_t query, int64_t key, int64_t seq_q, int64_t seq_k) {
  return !causal || key <= query + seq_k - seq_q;
}

// What a forward block works on (both forward kernels): rows [q0, q0 + rows) of query
// head h, which reads kv head hk, in batch b; the sizes, the row strides of q and k/v,
// and the softmax scale in the log2 domain.
struct FwdBlock {
  int64_t q0, h, b, sq, sk, hq, hkv, hk, q_stride, kv_stride;
  int rows;
  float s2;
};

template <int D>
JA_DEVICE FwdBlock fwd_block(const JaMhaFwdArgs& a, GridPlace at, int br) {
  const int64_t q0 = at.tile * br, sq = a.p.seq_q, hq = a.p.heads_q, hkv = a.p.heads_kv, h = at.head;
  return {q0, h, at.batch, sq, a.p.seq_k, hq, hkv, h / (hq / hkv), hq * D, hkv * D,
          int(sq - q0 < br ? sq - q0 : br), a.p.scale * ja_log2e};
}

// Whether instances for T run on the matrix units (ja/mma.h) or the SIMT kernels.
template <typename T>
constexpr bool use_mma() {
#if JA_HAS_WARP_MMA
  return mma::is_mma_type<T>::value;
#else
  return false;
#endif
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

inline const char* launch_status(const char* what) {
  const ja_error_t err = ja_get_last_error();
  if (err != ja_success) return ja_error("%s: kernel launch failed: %s", what, ja_get_error_string(err));
  return nullptr;
}

// Lets `kernel` take `smem` bytes of dynamic shared memory: above the 48 KiB default that needs an
// opt-in, which is per device and so made before every launch (and occupancy query). nullptr, or the error.
template <typename Kernel>
const char* allow_smem(Kernel kernel, int smem, const char* what) {
  if (smem <= kSmemBudget) return nullptr;
  const ja_error_t opt_in = ja_func_set_max_dynamic_smem(kernel, smem);
  if (opt_in == ja_success) return nullptr;
  return ja_error("%s: could not enable %d bytes of shared memory: %s", what, smem, ja_get_error_string(opt_in));
}

// Launches `kernel` with `smem` bytes of dynamic shared memory (allow_smem).
template <typename Args>
const char* launch_with_smem(void (*kernel)(Args), dim3 grid, int threads, int smem, ja_stream_t stream,
                             const Args& a, const char* what) {
  if (const char* e = allow_smem(kernel, smem, what)) return e;
  kernel<<<grid, threads, smem, stream>>>(a);
  return launch_status(what);
}

// Grid y/z are limited to 65535 on both platforms.
inline const char* check_grid(const char* op, int64_t x, int64_t y, int64_t z) {
  if (x > 0x7fffffffLL || y > 65535 || z > 65535)
    return ja_error("%s: grid (%lld, %lld, %lld) exceeds the GPU limits (2^31-1, 65535, 65535); "
                    "split the batch or heads", op, (long long)x, (long long)y, (long long)z);
  return nullptr;
}

}  // namespace mha_gpu
}  // namespace ja
