// Flash-attention forward for few query rows per kv head (decode): split-KV.
//
// Decode (seq_q = 1, or a few draft tokens) gives each kv head only
// heads_q / heads_kv * seq_q query rows, so the prefill kernel's grid (one
// block per 128 query rows and query head) has few blocks, each reading its kv
// head's whole K and V again for every query head of the group. Here the
// query rows that share a kv head are packed into the rows of one 16-row MMA
// tile (row r = query (r / group), head (r % group) of the group), so K and V
// are read once per kv head, and the keys are split across blocks (grid x), so
// there are enough blocks to keep every multiprocessor streaming K and V:
//
//   pass 1 (mha_decode_kernel): block (split, kv head x row block, batch) runs
//     the online softmax over its keys; its kWarps warps each take 16 keys of
//     every BC-key tile (a pipeline of kStages tiles: on sm_90 at head_dim 64,
//     128 and 256 each tile is a few TMA tensor-map copies that one thread
//     issues on the stage's mbarrier; elsewhere cp.async), and merge their
//     (max, sum, O) at the end through shared memory. With one split it
//     writes the output and lse directly; otherwise it writes O / l and the
//     log2-domain lse of its keys (float32) to a scratch buffer.
//   pass 2 (mha_decode_combine_kernel): one warp per query row merges the
//     splits: lse = log2(sum 2^lse_s), O = sum 2^(lse_s - lse) O_s.
//   On the TMA path with 2-8 splits whose thread-block clusters the device holds
//   in the grid's waves, the splits of each kv head's rows are one cluster and
//   merge through distributed shared memory instead (decode_cluster_merge: the
//   same arithmetic in the same order, so the same bits; no pass 2).
//
// Conventions are the other forward kernels': the mask as per-row key ranges
// (causal, windows, varlen, segments: a block's keys are those its rows see,
// [lo of its first query, hi of its last), split into gridDim.x chunks of whole
// tiles at run time, so a window or a short sequence splits as finely as the
// whole keys would), softcap and ALiBi in the score, head dims below D (whole
// 16-byte vectors; others decline to the mma.sync kernel) zero-padded, a row with
// no visible key outputs 0 with lse = +inf; P is rounded to the input dtype
// before P V; every sum accumulates in float32. Bias and dropout decline to the
// SIMT kernel. NaN/Inf: a hidden key's score is selected to -inf; a warp's 16
// keys that some rows see only in part have their V rows scanned, NaN/Inf values
// zeroed before P V and added back to the rows that see them (decode_sanitize,
// decode_add_nonfinite): 0 * inf would be NaN on the matrix units. The per-split
// results live in the caller's workspace (JaMhaFwdArgs::workspace, an extra
// float32 result of the FFI call that the Python op sizes and drops); its size
// caps the number of splits, and without one the kernel runs with one split.
#pragma once
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "gpu_launch.cuh"
#include "ja/mma.h"
#include "mha/decode/sizes.h"
#include "mha/decode/calls.h"
#include "mha/common/mma_tiles.cuh"
#include "mha/common/gpu.cuh"

#if JA_HAS_WARP_MMA
#include <cuda.h>  // CUtensorMap and its enums only: the encoder is found at run time, nothing links libcuda

namespace ja {
namespace mha_gpu {

// Build-time knobs (see docs/gpu.md for how to try one):
//   WARPS       warps per block; each takes 16 keys of every tile (BC = 16 * WARPS; decode/sizes.h)
//   STAGES      K/V tiles in flight per block (0: 3 up to head_dim 128, 2 above)
//   MIN_TILES   fewest key tiles a split gets (the pipeline's fill is paid per split; decode/sizes.h)
//   MAX_ROWS    query rows per kv head (group x seq_q) up to which this path is taken (decode/sizes.h)
//   L2PF        L2 prefetch size of the K/V cp.async in bytes: 0 (none), 128 or 256
// Alternatives tried (H200, bf16, batch 8, 32 query heads, 4 and 8 kv heads, 8k and 32k keys,
// benchmarks/gpu/tune_decode.cu against this kernel in the same run; the figures are in that
// program's output and issue 39's notes, not here): as many stage buffers as one block's shared
// memory holds (6 at head_dim 128, one block per multiprocessor: more K/V tiles in flight per
// multiprocessor), splits that take interleaved key tiles instead of one contiguous chunk, 2 warps
// with 6 stages, and a merge kernel that loads its splits' rows in parallel were all within noise of
// this kernel or slower; K/V rows brought in by cp.async.bulk (one copy per 256-byte row, on one
// mbarrier per stage) were far slower. So neither the bytes in flight nor the order of the splits
// bound it. cuDNN's decode kernel runs the same grid (splits x kv heads x batch, 128 threads,
// sm_80-style mma) somewhat faster at 32k keys (Nsight Compute), so the memory system does not bound
// it either; what differs is not found; the TMA path below (fourth round) closes part of the gap.
// A third round (same shapes and harness, against the previous kernel in the same run): the K/V
// cp.async with an L2 prefetch size of 128 bytes was faster in all four model shapes (Nsight
// Compute: more DRAM bandwidth and a higher L2 hit rate, with the L2 the unit closest to its limit
// in both); so it is the default. 256 bytes gained less, and on top of either an L2 evict_first
// policy, K and V as separate cp.async groups (S waits for K only), 32 keys per warp (128-key tiles
// of 4 warps, as cuDNN's kernel), 8 warps, masking only the boundary tiles and skipping the O
// rescale when no row maximum moved, and 2, 8 or 16 splits instead of the plan's were all within
// noise or slower.
#ifndef JA_MHA_DECODE_STAGES
#define JA_MHA_DECODE_STAGES 0
#endif
#ifndef JA_MHA_DECODE_L2PF
#define JA_MHA_DECODE_L2PF 128
#endif
// TMA         1: on sm_90+ at head_dim 64, 128, 256, K and V tiles come by TMA (tensor-map copies)
// TMA_STAGES  K/V tiles in flight per block on the TMA path (0: 4 up to head_dim 128, 3 above)
// TMA_L2      the tensor maps' L2 promotion in bytes: 0, 64, 128 or 256
// A fourth round (same shapes and harness, against the kernel before it): the TMA path with 4 stages
// (one block per multiprocessor) was faster than the cp.async kernel in all four shapes (8k and 32k
// keys, 4 and 8 kv heads); Nsight Compute shows more DRAM bandwidth, almost no L2 hits (no sector is
// fetched twice) and fewer instructions. 3 stages (two blocks per multiprocessor), 2 stages, 6 stages,
// 8 warps (128-key tiles) and 256 bytes of L2 promotion were within noise of it or slower; no L2
// promotion was the same as 128 bytes.
// The merge: Nsight Compute shows the merge kernel short against the split kernel, and under PDL much
// of it overlaps the split kernel's tail, yet the model's decode step (`python3 -m
// benchmarks.gpu.bench_gpu --only model`) without the merge kernel (a probe that skipped it, wrong
// results) was measurably faster; and one split per kv head (no merge at all) leaves half the
// multiprocessors idle, far from copy bandwidth. So the splits of a kv head's rows run as one
// thread-block cluster that merges them through distributed shared memory where the clusters fit in
// the grid's waves: faster with 8 kv heads (2 splits) at 8k and 32k keys in `python3 -m
// benchmarks.gpu.bench_gpu --only decode` and in the model (alternating runs). With 4 kv heads (4
// splits) clusters of 4 do not all fit at once (30 of 32 at one block per multiprocessor), so those
// calls keep the merge kernel.
// Inside the model at 4 kv heads and 8k keys (benchmarks/gpu/model_profile.py "decode b8 kv8k hkv4",
// JA_GPU_PDL=0 so kernel times do not include PDL waits) this kernel is slower a layer than cuDNN's
// split kernel, and the merge slower than cuDNN's reduction, while `bench_gpu --only decode` times ours
// faster at the same shape: the gap is this kernel's, in the model. PDL on or off barely moves the
// model's ratio. cuDNN's split kernel there launches 8 splits x 4 kv heads x 8 batches of 128
// threads at two blocks a multiprocessor (183 registers, 86 KB of shared memory; model_profile.py lists
// each kernel's launch shape), and its lean_reduction 1 x 32 x 8 blocks. This kernel with TMA_STAGES 3
// gets that grid (8,4,8 at two blocks a multiprocessor, 104 KB), and in the model (`--only model`, ours
// against plain JAX, each run against its own) it lost more, not less, at 8k and 32k keys with 4 kv
// heads and at 8k with 8. So the grid is not what cuDNN's kernel gains by.
// That build merges 8 splits in clusters of 8; with the merge kernel instead (JA_MHA_FWD_DECODE_CLUSTER=0)
// or with 4 splits in clusters of 4 (which then fit) it stayed behind the default build, and more splits
// at one block a multiprocessor (8, 12, 16, 32: two or more waves) were slower still at 8k keys.
// The merge kernel loads all of a row's splits (up to kDecodeMergeBatch) before it uses any, one memory
// round trip instead of one per split: in the model at 4 kv heads, alternating with the build that loaded
// a split at a time, it was faster at 8k and 32k keys (`--only model`, one H200, five runs).
// A block that takes 4 kv heads of its batch at once (TMA boxes of 4 heads x 16 keys, so 1 KB rows of K
// and V are read whole; warp w on head w, 16 splits to fill the device, no cross-warp merge) was slower
// than this kernel at 8k and 32k keys with 4 and 8 kv heads (benchmarks/gpu/tune_decode.cu b2b, same
// run, float64 check passed): reading whole rows of all heads is not what the gap to cuDNN is.
#ifndef JA_MHA_DECODE_TMA
#define JA_MHA_DECODE_TMA 1
#endif
#ifndef JA_MHA_DECODE_TMA_STAGES
#define JA_MHA_DECODE_TMA_STAGES 0
#endif
#ifndef JA_MHA_DECODE_TMA_L2
#define JA_MHA_DECODE_TMA_L2 128
#endif

constexpr int kDecodeMaxSplits = 1024;
constexpr int kDecodeMaxCluster = 8;  // the most splits merged in one thread-block cluster (the portable size)
constexpr int kDecodeMergeBatch = 8;  // splits the merge kernel loads at once (one round trip up to this many)

// Whether this build has the TMA kernel at this type and head_dim (decode_tma_applies: whether it runs).
template <typename T, int D>
constexpr bool kDecodeTmaBuilt = JA_MHA_DECODE_TMA && D % 64 == 0 && sizeof(T) == 2;

// TMA: K and V tiles arrive by tensor-map copies (one box of BC keys x 64 columns, 128 bytes a row,
// 128-byte swizzle, per 64 columns) instead of cp.async; their stages are swizzled, not padded.
template <typename T, int D, bool TMA = false>
struct DecodeTiles {
  static constexpr int kWarps = JA_MHA_DECODE_WARPS;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int BC = 16 * kWarps;  // keys per tile, 16 per warp
  static constexpr int LD = D + 8;        // 16-byte row pad: ldmatrix rows hit distinct banks
  static constexpr int kStages = TMA ? (JA_MHA_DECODE_TMA_STAGES > 0 ? JA_MHA_DECODE_TMA_STAGES : (D <= 128 ? 4 : 3))
                                     : (JA_MHA_DECODE_STAGES > 0 ? JA_MHA_DECODE_STAGES : (D <= 128 ? 3 : 2));
  static constexpr int kTileElems = TMA ? BC * D : BC * LD;
  static constexpr int kStageElems = 2 * kTileElems;  // K tile, then V tile
  static constexpr int kStageBytes = kStageElems * int(sizeof(T));
  // TMA: the stages start 1024-byte aligned (the swizzle's period; the slack aligns the base), and one
  // mbarrier per stage follows the Q tile.
  static constexpr int kAlignSlack = TMA ? 1024 : 0;
  static constexpr int kSmemBytes =
      kAlignSlack + (kStages * kStageElems + 16 * LD) * int(sizeof(T)) + (TMA ? 8 * kStages : 0);  // + the Q tile
  static constexpr bool kQInRegs = D <= 128;
  // The end-of-block merge reuses the stage buffers: per warp, m and l of 16 rows and 16 x D of O.
  static constexpr int kMergeBytes = kWarps * 16 * (D + 2) * int(sizeof(float));
  // After it, the cluster merge's: this split's 16 x D of O / l and 16 lse, then each split's weight of
  // the 16 rows and their 1 / sum.
  static constexpr int kClusterBytes = (16 * D + 16 + kDecodeMaxCluster * 16 + 16) * int(sizeof(float));
  static_assert(kStages >= 2, "the K/V pipeline needs at least two stages");
  static_assert(kMergeBytes + kClusterBytes <= kStages * kStageElems * int(sizeof(T)),
                "decode merge exceeds the stage buffers");
  static_assert(kSmemBytes <= 227 * 1024, "decode tiles exceed shared memory");
  static_assert(D % 16 == 0, "head_dim must be a multiple of 16");
  static_assert(!TMA || (D % 64 == 0 && BC <= 256 && (BC * 128) % 1024 == 0 && sizeof(T) == 2),
                "the TMA path copies 64-column boxes of 16-bit elements, whole swizzle periods");
};

// The tensor maps of K and V for the TMA path (a __grid_constant__ kernel parameter; unused otherwise).
struct DecodeMaps {
  CUtensorMap k, v;
};

// Element (key, col) of a K or V tile in shared memory. TMA: 64-column boxes one after another, each
// [BC][64] with the 128-byte swizzle (16-byte chunk c of row r at chunk c ^ (r % 8)); so the 8 rows an
// ldmatrix reads at one column lie in 8 distinct chunks, as the padded rows do otherwise.
template <typename T, int D, bool TMA>
JA_DEVICE const T* decode_tile_at(const T* tile, int key, int col) {
  using Tl = DecodeTiles<T, D, TMA>;
  if constexpr (TMA)
    return tile + (col >> 6) * (Tl::BC * 64) + key * 64 + ((((col & 63) >> 3) ^ (key & 7)) << 3) + (col & 7);
  else return tile + key * Tl::LD + col;
}

struct DecodeArgs {
  JaMhaFwdArgs a;
  int rblocks;    // 16-row blocks per kv head: ceil(group * seq_q / 16)
  float* ws_o;    // [batch][heads_kv * rblocks][splits][16][D]: O / l of each split (splits > 1)
  float* ws_lse;  // [batch][heads_kv * rblocks][splits][16]: log2-domain lse of each split (-inf: no key)
  int cluster;    // > 1: the splits (gridDim.x of them) are one thread-block cluster that merges them itself
};

// Why this kernel does not run the call (nullptr: it does): a decode shape (decode_applies), its features, and head
// dims of whole 16-byte vectors (odd ones take the mma.sync kernel).
template <typename T, int D>
inline const char* decode_refusal(const JaMhaFwdArgs& a) {
  if (!decode_applies(a))
    return ja_error("it is not a decode shape (%lld query rows per kv head; the split-KV kernel takes up to %d)",
                    (long long)(a.p.heads_kv > 0 ? decode_rows(a) : 0), JA_MHA_DECODE_MAX_ROWS);
  if (const char* f = mha_unhandled_feature(a.p, kFwdDecodeFeatures)) return ja_error("it does not handle %s", f);
  if (!vec_dims<T>(a.p)) return "its head dims are not whole 16-byte vectors (multiples of 8)";
  return nullptr;
}

struct DecodePlan {
  int splits;
  int64_t chunk;
};

// Splits of equal whole tiles, each at least JA_MHA_DECODE_MIN_TILES long. Every block
// does the same work, so the grid should fill the device's resident-block slots in
// whole waves: the fewest splits whose grid uses at least 90% of the slots of the
// waves it takes (a grid of 4 x 64 blocks on 264 slots: 97%), else the best found.
template <typename T, int D>
DecodePlan decode_plan(const JaMhaFwdArgs& a, int64_t rblocks, int64_t slots, int64_t max_splits) {
  constexpr int BC = DecodeTiles<T, D>::BC;
  const int64_t tiles = (a.p.seq_k + BC - 1) / BC;
  if (tiles <= 1) return {1, BC};
  const int64_t groups = a.p.batch * a.p.heads_kv * rblocks;  // blocks per split
  int64_t max_s = tiles / JA_MHA_DECODE_MIN_TILES;
  const int64_t enough = 4 * slots / groups + 1;  // beyond 4 waves more splits only add merge work
  max_s = max_s < enough ? max_s : enough;
  max_s = max_s < kDecodeMaxSplits ? max_s : kDecodeMaxSplits;
  max_s = max_s < max_splits ? max_s : max_splits;
  DecodePlan best{1, tiles * BC};
  double best_use = 0.0;
  for (int64_t s = 1; s <= max_s; ++s) {
    const int64_t per = (tiles + s - 1) / s, splits = (tiles + per - 1) / per;
    const int64_t blocks = splits * groups, waves = (blocks + slots - 1) / slots;
    const double use = double(blocks) / double(waves * slots);
    if (use > best_use + 1e-9) best_use = use, best = {int(splits), per * BC};
    if (use >= 0.9) return {int(splits), per * BC};
  }
  return best;
}

// The splits of one kv head's rows run as one thread-block cluster (rank = blockIdx.x): each has its
// (O / l, lse) of 16 rows in shared memory (po, plse); after a cluster barrier the blocks merge them
// through distributed shared memory, each a share of the rows' columns, with the merge kernel's
// arithmetic in its order (so the results are the two-kernel path's, bit for bit).
template <typename T, int D, int NT>
JA_DEVICE void decode_cluster_merge(const DecodeArgs& d, const float* po, float* plse, int r0, int rows, int group,
                                    int hk, int64_t b) {
  const JaMhaFwdArgs& a = d.a;
  const int ns = d.cluster, rank = int(blockIdx.x);
  float* fw = plse + 16;                     // [kDecodeMaxCluster][16]: 2^(lse_s - M) of split s
  float* inv = fw + kDecodeMaxCluster * 16;  // [16]: 1 / their sum; 0: no split saw a key
  mma::cluster_sync();                       // every split's po and plse are written and visible
  if (threadIdx.x < 16 && r0 + int(threadIdx.x) < rows) {
    const int r = int(threadIdx.x), rg = r0 + r;
    float l[kDecodeMaxCluster];  // each split's lse, loaded once, all loads in flight together
#pragma unroll
    for (int s = 0; s < kDecodeMaxCluster; ++s) l[s] = s < ns ? mma::cluster_load(plse + r, uint32_t(s)) : 0.0f;
    float mx = -INFINITY;
#pragma unroll
    for (int s = 0; s < kDecodeMaxCluster; ++s)
      if (s < ns) mx = fmaxf(mx, l[s]);
    float sum = 0.0f;
#pragma unroll
    for (int s = 0; s < kDecodeMaxCluster; ++s) {
      if (s >= ns) break;
      const float f = mx == -INFINITY ? 0.0f : ja_exp2(l[s] - mx);
      fw[s * 16 + r] = f;
      sum += f;
    }
    inv[r] = mx == -INFINITY ? 0.0f : 1.0f / sum;
    if (rank == 0) {
      const int64_t qi = rg / group, h = int64_t(hk) * group + rg % group;
      a.lse[(b * a.p.heads_q + h) * a.p.seq_q + qi] = mx == -INFINITY ? INFINITY : (mx + ja_log2(sum)) * kLn2;
    }
  }
  __syncthreads();
  constexpr int kV = D / 4;  // float4s per row
  for (int idx = rank * NT + int(threadIdx.x); idx < 16 * kV; idx += ns * NT) {
    const int r = idx / kV, c = (idx % kV) * 4, rg = r0 + r;
    if (rg >= rows) continue;
    float4 os[kDecodeMaxCluster];  // the splits' four columns of row r, all loads in flight together
#pragma unroll
    for (int s = 0; s < kDecodeMaxCluster; ++s)
      if (s < ns) os[s] = mma::cluster_load4(po + r * D + c, uint32_t(s));
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int s = 0; s < kDecodeMaxCluster; ++s) {
      if (s >= ns) break;
      const float f = fw[s * 16 + r];
      acc[0] += f * os[s].x;
      acc[1] += f * os[s].y;
      acc[2] += f * os[s].z;
      acc[3] += f * os[s].w;
    }
    const int64_t qi = rg / group, h = int64_t(hk) * group + rg % group;
    const int hdv = int(a.p.head_dim_v);
    T* out = static_cast<T*>(a.o) + ((b * a.p.seq_q + qi) * a.p.heads_q + h) * hdv + c;
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (c + j < hdv) out[j] = from_f32<T>(acc[j] * inv[r]);
  }
  mma::cluster_sync_relaxed();  // no block leaves while another may still read its shared memory
}

// The NaN/Inf guard of one warp's 16 V rows (vs: this warp's first key of the stage's V tile): values of
// columns [0, cols) that are infinite or NaN are replaced by 0; returns the bits of the keys that held any
// (warp-uniform). On the TMA path the lanes that wrote fence their writes against the copies that will
// refill the stage (the async proxy).
template <typename T, int D, bool TMA>
JA_DEVICE uint32_t decode_sanitize(T* vs, int cols) {
  constexpr int kVec = 16 / int(sizeof(T));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  uint32_t bad = 0u;
  for (int idx = lane; idx < 16 * (D / kVec); idx += 32) {
    const int r = idx / (D / kVec), c = (idx % (D / kVec)) * kVec;
    if (c >= cols) continue;
    T* chunk = const_cast<T*>(decode_tile_at<T, D, TMA>(vs, warp * 16 + r, c));
    Pack<T, kVec> pk = *reinterpret_cast<const Pack<T, kVec>*>(chunk);
    bool any = false;
#pragma unroll
    for (int e = 0; e < kVec; ++e)
      if (nonfinite(pk.v[e])) any = true, pk.v[e] = from_f32<T>(0.0f);
    if (any) {
      *reinterpret_cast<Pack<T, kVec>*>(chunk) = pk;
      bad |= 1u << r;
    }
  }
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) bad |= ja_shfl_xor(bad, m);
  if (TMA && bad) mma::fence_proxy_async();
  __syncwarp();  // the zeroed values are in shared memory before any lane's ldmatrix
  return bad;
}

// After a sanitized warp tile's P V: each of this lane's rows (g, g + 8) that sees key kbase + kk of a bad
// key kk gets that key's infinities and NaNs (from global memory: row kk at vg + kk * stride) added to its
// columns n * 8 + 2t + {0, 1} (p * inf is inf for the p > 0 of a key the row sees).
template <typename T, int NO>
JA_DEVICE void decode_add_nonfinite(float (&o)[NO][4], uint32_t bad, int kbase, const int (&lo)[2], const int (&hi)[2],
                                    const T* vg, int64_t stride, int cols) {
  const int t = threadIdx.x % 4;
  while (bad) {
    const int kk = __ffs(int(bad)) - 1, key = kbase + kk;
    bad &= bad - 1;
    const T* v = vg + kk * stride;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      if (!(lo[i] <= key && key < hi[i])) continue;
#pragma unroll
      for (int n = 0; n < NO; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = n * 8 + 2 * t + e;
          if (col >= cols) continue;
          const float x = to_f32(v[col]);
          if (nonfinite(x)) o[n][2 * i + e] += x;
        }
    }
  }
}

template <typename T, int D, bool CAUSAL, bool TMA>
JA_GLOBAL void __launch_bounds__(DecodeTiles<T, D, TMA>::kThreads)
    mha_decode_kernel(DecodeArgs d, const __grid_constant__ DecodeMaps maps) {
  using Tl = DecodeTiles<T, D, TMA>;
  constexpr int BC = Tl::BC, LD = Tl::LD, NT = Tl::kThreads, NW = Tl::kWarps, NS = Tl::kStages;
  constexpr bool QREG = Tl::kQInRegs;
  constexpr int KD = D / 16;  // k-steps over head_dim
  constexpr int NO = D / 8;   // 16x8 output fragments
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* smem_base = smem_raw;
  if constexpr (TMA) smem_base += (1024u - (mma::smem_addr(smem_raw) & 1023u)) & 1023u;
  T* smem = reinterpret_cast<T*>(smem_base);
  T* q_s = smem + NS * Tl::kStageElems;
  uint64_t* bars = reinterpret_cast<uint64_t*>(q_s + 16 * LD);  // TMA: one mbarrier per stage
  const JaMhaFwdArgs& a = d.a;

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;
  const int64_t sq = a.p.seq_q, sk = a.p.seq_k, hq = a.p.heads_q, hkv = a.p.heads_kv;
  const int group = int(hq / hkv);
  const int rows = int(group * sq);
  const int hk = int(blockIdx.y) / d.rblocks, rb = int(blockIdx.y) % d.rblocks;
  const int r0 = rb * 16;  // first row of this block among the kv head's rows
  const int64_t b = blockIdx.z;
  const int hd = int(a.p.head_dim), hdv = int(a.p.head_dim_v);
  const int64_t k_stride = hkv * hd, v_stride = hkv * hdv;
  const float s2 = a.p.scale * ja_log2e;
  const T* k = static_cast<const T*>(a.k) + (b * sk * hkv + hk) * hd;
  const T* v = static_cast<const T*>(a.v) + (b * sk * hkv + hk) * hdv;
  const T* q = static_cast<const T*>(a.q);

  if constexpr (TMA) {
    if (threadIdx.x == 0) {  // the one thread that issues the copies
#pragma unroll
      for (int s = 0; s < NS; ++s) mma::mbar_init(bars + s, 1);
      mma::mbar_fence_init();
      mma::tma_prefetch_map(&maps.k);
      mma::tma_prefetch_map(&maps.v);
    }  // the other threads wait on the barriers only after the __syncthreads that follows Q's arrival
  }
  pdl_wait();  // launched with PDL (gpu_launch.cuh): the previous kernel's writes are visible from here
  pdl_launch_dependents();  // the merge kernel may be scheduled; it waits for this grid in its pdl_wait

  // The keys this block's rows see: [lo of its first query, hi of its last) (padding rows act as the last
  // query); they split into gridDim.x chunks of whole tiles, this block taking chunk blockIdx.x, [key0, key1).
  // (Positions fit int32: check_problem keeps the sequences below 2^30.)
  const int qi_first = r0 / group, qi_last = int(r0 + 15 < rows ? (r0 + 15) / group : sq - 1);
  const MhaRow first = mha_row(a.p, b, qi_first), last = mha_row(a.p, b, qi_last);
  const int span_lo = int(first.lo), span_hi = int(last.hi > first.lo ? last.hi : first.lo);
  const int all_lo = int(last.lo), all_hi = int(first.hi);  // keys every row of the block sees
  const int span_tiles = (span_hi - span_lo + BC - 1) / BC;
  const int per = (span_tiles + int(gridDim.x) - 1) / int(gridDim.x);  // tiles per split
  const int key0 = span_lo + int(blockIdx.x) * per * BC;
  const int key1 = key0 + per * BC < span_hi ? key0 + per * BC : span_hi;
  const int ntiles = key1 > key0 ? (key1 - key0 + BC - 1) / BC : 0;

  // Q rows -> shared memory (rows past the kv head's last one are zero).
  constexpr int kVec = 16 / int(sizeof(T));
  for (int idx = threadIdx.x; idx < 16 * (D / kVec); idx += NT) {
    const int r = idx / (D / kVec), c = (idx % (D / kVec)) * kVec;
    const int rg = r0 + r;
    const bool ok = rg < rows && c < hd;
    const int64_t qi = rg / group, h = int64_t(hk) * group + rg % group;
    mma::cp_async_16(q_s + r * LD + c, ok ? q + ((b * sq + qi) * hq + h) * hd + c : q, ok);
  }
  mma::cp_async_commit();

  // Tile i (keys key0 + i BC ...) -> stage i % NS. cp.async: keys at or past key1 are zero-filled.
  // TMA: thread 0 issues the boxes on the stage's barrier; keys past seq_k are zero-filled (a split's
  // chunk is whole tiles, so only the last split's last tile reaches past key1).
  auto load = [&](int i) {
    T* ks = smem + (i % NS) * Tl::kStageElems;
    const int kv0 = key0 + i * BC;
    if constexpr (TMA) {
      if (threadIdx.x == 0) {
        uint64_t* bar = bars + i % NS;
        mma::mbar_arrive_expect_tx(bar, uint32_t(Tl::kStageBytes));
#pragma unroll
        for (int h = 0; h < D / 64; ++h) {
          mma::tma_load_4d(ks + h * BC * 64, &maps.k, bar, h * 64, hk, kv0, int(b));
          mma::tma_load_4d(ks + Tl::kTileElems + h * BC * 64, &maps.v, bar, h * 64, hk, kv0, int(b));
        }
      }
    } else {
      const int nk = key1 - kv0 < BC ? key1 - kv0 : BC;
      cp_async_tile<T, BC, D, LD, NT, JA_MHA_DECODE_L2PF>(ks, k + int64_t(kv0) * k_stride, k_stride, nk, hd);
      cp_async_tile<T, BC, D, LD, NT, JA_MHA_DECODE_L2PF>(ks + BC * LD, v + int64_t(kv0) * v_stride, v_stride, nk, hdv);
    }
  };
#pragma unroll
  for (int i = 0; i < NS - 1; ++i) {
    if (i < ntiles) load(i);
    mma::cp_async_commit();  // one group per stage, empty or not, so the wait counts stay fixed
  }

  mma::cp_async_wait<NS - 1>();  // the Q group is complete
  __syncthreads();
  uint32_t qa[QREG ? KD : 1][4];
  if constexpr (QREG) {
#pragma unroll
    for (int kd = 0; kd < KD; ++kd) mma::ldmatrix_x4(qa[kd], q_s + (lane & 15) * LD + kd * 16 + (lane >> 4) * 8);
  }

  // This lane's rows g and g + 8: the keys [lo, hi) of the query each is (padding rows act as the last
  // query), cut to the split's [key0, key1), and its diagonal (ALiBi).
  int lo[2], hi[2], diag[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int rg = r0 + g + 8 * i;
    const MhaRow r = mha_row(a.p, b, rg < rows ? rg / group : sq - 1);
    lo[i] = int(r.lo), hi[i] = int(r.hi < key1 ? r.hi : key1), diag[i] = int(r.diag);
  }
  // The score's softcap and ALiBi terms of each row's head (ScoreTerms; the decode kernel takes no bias).
  const ScoreTerms st[2] = {score_terms(a.p, b, hk * group + (r0 + g) % group),
                            score_terms(a.p, b, hk * group + (r0 + g + 8) % group)};
  const bool terms = st[0].any();

  float o[NO][4];
#pragma unroll
  for (int n = 0; n < NO; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

  for (int i = 0; i < ntiles; ++i) {
    if constexpr (TMA) {
      __syncthreads();  // every warp is done with tile i - 1's stage: refill it
      if (i + NS - 1 < ntiles) load(i + NS - 1);
      mma::mbar_wait(bars + i % NS, uint32_t(i / NS) & 1u);  // tile i is in shared memory
    } else {
      mma::cp_async_wait<NS - 2>();
      __syncthreads();  // tile i is in shared memory; every warp is done with tile i - 1's stage
      if (i + NS - 1 < ntiles) load(i + NS - 1);
      mma::cp_async_commit();
    }

    const T* ks = smem + (i % NS) * Tl::kStageElems;  // this warp's keys: warp * 16 ...
    const T* vs = ks + Tl::kTileElems;
    float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
    for (int kd = 0; kd < KD; ++kd) {
      uint32_t qf[4];
      if constexpr (QREG) {
#pragma unroll
        for (int e = 0; e < 4; ++e) qf[e] = qa[kd][e];
      } else {
        mma::ldmatrix_x4(qf, q_s + (lane & 15) * LD + kd * 16 + (lane >> 4) * 8);
      }
      uint32_t kb[4];
      mma::ldmatrix_x4(kb, decode_tile_at<T, D, TMA>(ks, warp * 16 + (lane & 7) + ((lane >> 4) << 3),
                                                     kd * 16 + ((lane >> 3) & 1) * 8));
      mma::mma_16816<T>(s[0], qf, kb);
      mma::mma_16816<T>(s[1], qf, kb + 2);
    }

    // Into the log2 domain (with softcap and ALiBi); keys a row does not see (or past this split) -> -inf,
    // a select: whatever K holds there never reaches the row. A warp's 16 keys that every row sees in full
    // need no mask.
    const int kbase = key0 + i * BC + warp * 16;
    const bool need_mask = !(kbase >= all_lo && kbase + 16 <= (all_hi < key1 ? all_hi : key1));
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = kbase + n * 8 + 2 * t + (e & 1), r = e >> 1;
        float x = s[n][e];
        if (terms) {
          float tc;
          x = st[r](x, 0, diag[r], key, &tc) * ja_log2e;
        } else {
          x *= s2;
        }
        s[n][e] = !need_mask || (lo[r] <= key && key < hi[r]) ? x : -INFINITY;
      }

    // Online softmax, rows g (e = 0, 1) and g + 8 (e = 2, 3); a quad of lanes shares a row.
#pragma unroll
    for (int i2 = 0; i2 < 2; ++i2) {
      float mx = fmaxf(fmaxf(s[0][2 * i2], s[0][2 * i2 + 1]), fmaxf(s[1][2 * i2], s[1][2 * i2 + 1]));
      mx = fmaxf(mx, ja_shfl_xor(mx, 1));
      mx = fmaxf(mx, ja_shfl_xor(mx, 2));
      const float m_new = fmaxf(m[i2], mx);
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // no key seen yet: keep everything at 0
      const float alpha = ja_exp2(m[i2] - m_use);
      float rs = 0.0f;
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 2 * i2; e < 2 * i2 + 2; ++e) {
          s[n][e] = ja_exp2_approx(s[n][e] - m_use);
          rs += s[n][e];
        }
      l[i2] = l[i2] * alpha + rs;
      m[i2] = m_new;
#pragma unroll
      for (int n = 0; n < NO; ++n) {
        o[n][2 * i2] *= alpha;
        o[n][2 * i2 + 1] *= alpha;
      }
    }

    // A warp tile some rows see only in part: a NaN/inf in its V rows must not reach the rows whose P there
    // is 0 (0 * inf is NaN on the matrix units). Such values are zeroed in the tile (bad: their keys), and
    // after the product each row that sees one of those keys gets them added back.
    const uint32_t bad = need_mask ? decode_sanitize<T, D, TMA>(const_cast<T*>(vs), hdv) : 0u;

    // O += P V over this warp's 16 keys; P (rounded to T) is the A operand straight from S.
    uint32_t pa[4];
    pa[0] = mma::pack2<T>(s[0][0], s[0][1]);
    pa[1] = mma::pack2<T>(s[0][2], s[0][3]);
    pa[2] = mma::pack2<T>(s[1][0], s[1][1]);
    pa[3] = mma::pack2<T>(s[1][2], s[1][3]);
#pragma unroll
    for (int n2 = 0; n2 < NO / 2; ++n2) {
      uint32_t vb[4];
      mma::ldmatrix_x4_trans(
          vb, decode_tile_at<T, D, TMA>(vs, warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, n2 * 16 + (lane >> 4) * 8));
      mma::mma_16816<T>(o[2 * n2], pa, vb);
      mma::mma_16816<T>(o[2 * n2 + 1], pa, vb + 2);
    }
    if (bad) decode_add_nonfinite<T, NO>(o, bad, kbase, lo, hi, v + int64_t(kbase) * v_stride, v_stride, hdv);
  }
  mma::cp_async_wait<0>();
  __syncthreads();  // every warp is done with the stage buffers: the merge reuses them

  // Merge the warps: per row, M = max of the warps' maxima, L = sum l_w 2^(m_w - M), O likewise.
  float* mm = reinterpret_cast<float*>(smem_base);  // [NW][16]
  float* ll = mm + NW * 16;                        // [NW][16]
  float* oo = ll + NW * 16;                        // [NW][16][D]
  float* po = oo + NW * 16 * D;                    // cluster merge: [16][D] this split's O / l
  float* plse = po + 16 * D;                       // [16] and its log2-domain lse (-inf: no key)
#pragma unroll
  for (int i2 = 0; i2 < 2; ++i2) {
    l[i2] += ja_shfl_xor(l[i2], 1);
    l[i2] += ja_shfl_xor(l[i2], 2);
    if (t == 0) {
      mm[warp * 16 + g + 8 * i2] = m[i2];
      ll[warp * 16 + g + 8 * i2] = l[i2];
    }
  }
#pragma unroll
  for (int n = 0; n < NO; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) oo[(warp * 16 + g + 8 * (e >> 1)) * D + n * 8 + 2 * t + (e & 1)] = o[n][e];
  __syncthreads();

  const int64_t part = ((b * hkv * d.rblocks + blockIdx.y) * gridDim.x + blockIdx.x) * 16;  // this split's row 0
  for (int idx = threadIdx.x; idx < 16 * D; idx += NT) {
    const int r = idx / D, c = idx % D;
    const int rg = r0 + r;
    if (rg >= rows) continue;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < NW; ++w) mx = fmaxf(mx, mm[w * 16 + r]);
    float sum = 0.0f, acc = 0.0f;
    if (mx != -INFINITY) {
#pragma unroll
      for (int w = 0; w < NW; ++w) {
        const float f = ja_exp2(mm[w * 16 + r] - mx);  // 0 for a warp that saw no key
        sum += ll[w * 16 + r] * f;
        acc += oo[(w * 16 + r) * D + c] * f;
      }
    }
    const bool empty = sum == 0.0f;
    if (gridDim.x == 1) {  // one split: this is the answer
      const int64_t qi = rg / group, h = int64_t(hk) * group + rg % group;
      if (c < hdv) static_cast<T*>(a.o)[((b * sq + qi) * hq + h) * hdv + c] = from_f32<T>(empty ? 0.0f : acc / sum);
      if (c == 0) a.lse[(b * hq + h) * sq + qi] = empty ? INFINITY : (mx + ja_log2(sum)) * kLn2;
    } else if (TMA && d.cluster > 1) {
      po[r * D + c] = empty ? 0.0f : acc / sum;
      if (c == 0) plse[r] = empty ? -INFINITY : mx + ja_log2(sum);
    } else {
      d.ws_o[(part + r) * D + c] = empty ? 0.0f : acc / sum;
      if (c == 0) d.ws_lse[part + r] = empty ? -INFINITY : mx + ja_log2(sum);
    }
  }
  if (TMA && d.cluster > 1) decode_cluster_merge<T, D, NT>(d, po, plse, r0, rows, group, hk, b);
}

// One warp per query row: merge the splits' (lse_s, O_s) into the output and lse.
template <typename T, int D>
JA_GLOBAL void __launch_bounds__(128) mha_decode_combine_kernel(DecodeArgs d, int splits) {
  constexpr int kPer = (D + 31) / 32;  // output columns per lane
  const JaMhaFwdArgs& a = d.a;
  const int64_t sq = a.p.seq_q, hq = a.p.heads_q, hkv = a.p.heads_kv;
  const int group = int(hq / hkv);
  const int rows = int(group * sq);
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int64_t ys = hkv * d.rblocks;
  pdl_wait();  // the split kernel's partial results are complete and visible
  if (row >= a.p.batch * ys * 16) return;
  const int r = int(row % 16);
  const int64_t y = (row / 16) % ys, b = row / (16 * ys);
  const int rg = int(y % d.rblocks) * 16 + r;
  if (rg >= rows) return;
  const int64_t hk = y / d.rblocks;
  const int64_t qi = rg / group, h = hk * group + rg % group;
  const int64_t part = (b * ys + y) * splits * 16 + r;  // + s * 16: split s of this row
  const int hdv = int(a.p.head_dim_v);

  // The splits' lse and O columns are loaded kDecodeMergeBatch splits at a time, all of a batch before any is
  // used, so up to that many splits take one memory round trip. With more, the maximum comes first from a pass
  // over the lse alone. The same sums in the same order either way (and as decode_cluster_merge's).
  constexpr int kB = kDecodeMergeBatch;
  float ls[kB], os[kB][kPer];
  auto load = [&](int s0) {
#pragma unroll
    for (int s = 0; s < kB; ++s) {
      if (s0 + s >= splits) break;
      const int64_t p = part + int64_t(s0 + s) * 16;
      ls[s] = d.ws_lse[p];
#pragma unroll
      for (int j = 0; j < kPer; ++j)
        if (lane + 32 * j < D) os[s][j] = d.ws_o[p * D + lane + 32 * j];
    }
  };
  float mx = -INFINITY;
  if (splits <= kB) {
    load(0);
#pragma unroll
    for (int s = 0; s < kB; ++s)
      if (s < splits) mx = fmaxf(mx, ls[s]);
  } else {
    for (int s = lane; s < splits; s += 32) mx = fmaxf(mx, d.ws_lse[part + int64_t(s) * 16]);
    mx = ja_warp_max(mx);
  }
  T* out = static_cast<T*>(a.o) + ((b * sq + qi) * hq + h) * hdv;
  if (mx == -INFINITY) {  // no split saw a key
#pragma unroll
    for (int j = 0; j < kPer; ++j)
      if (lane + 32 * j < hdv) out[lane + 32 * j] = from_f32<T>(0.0f);
    if (lane == 0) a.lse[(b * hq + h) * sq + qi] = INFINITY;
    return;
  }
  float sum = 0.0f, acc[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) acc[j] = 0.0f;
  for (int s0 = 0; s0 < splits; s0 += kB) {
    if (splits > kB) load(s0);  // (one batch: loaded above)
#pragma unroll
    for (int s = 0; s < kB; ++s) {
      if (s0 + s >= splits) break;
      const float f = ja_exp2(ls[s] - mx);
      sum += f;
#pragma unroll
      for (int j = 0; j < kPer; ++j)
        if (lane + 32 * j < D) acc[j] += f * os[s][j];
    }
  }
  const float inv = 1.0f / sum;
#pragma unroll
  for (int j = 0; j < kPer; ++j)
    if (lane + 32 * j < hdv) out[lane + 32 * j] = from_f32<T>(acc[j] * inv);
  if (lane == 0) a.lse[(b * hq + h) * sq + qi] = (mx + ja_log2(sum)) * kLn2;
}

// Resident-block slots of the decode kernel on the current device (cached per device):
// blocks per multiprocessor at its shared memory and registers, times multiprocessors.
template <typename T, int D, bool CAUSAL, bool TMA>
int64_t decode_slots() {
  using Tl = DecodeTiles<T, D, TMA>;
  static std::atomic<int> cache[64];
  const int dev = ja::current_device();
  const int per_sm = ja::per_device(cache, dev < 0 ? 0 : dev, [](int) {
    auto kernel = mha_decode_kernel<T, D, CAUSAL, TMA>;
    (void)allow_smem(kernel, Tl::kSmemBytes, "");  // a refusal shows at the launch
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, Tl::kThreads, Tl::kSmemBytes) != cudaSuccess ||
        n <= 0) {
      (void)cudaGetLastError();  // no sticky error for the launch check; the launch reports a real failure
      n = 1;
    }
    return n;
  });
  return int64_t(per_sm) * multiprocessors();
}

// The TMA path's K/V tensor maps: [batch][seq_k][heads_kv][D] as a 4-d tensor (D innermost), boxes of
// 64 columns x 1 head x BC keys x 1 batch with the 128-byte swizzle; elements past the ends read as 0.
// cuTensorMapEncodeTiled is a driver function found through the runtime (cudaGetDriverEntryPoint*),
// so nothing links libcuda; encoding is host-only work (no stream, no sync: capture-safe).
// (cudaTypedefs.h has this type as PFN_cuTensorMapEncodeTiled_v12000, but CUTLASS includes that header
// inside its namespace, and its include guard then hides it from the sm_90a instances that include both.)
using TensorMapEncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                          const cuuint64_t*, const cuuint32_t*, const cuuint32_t*,
                                          CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion,
                                          CUtensorMapFloatOOBfill);

inline TensorMapEncodeTiled tensor_map_encoder() {
  static const TensorMapEncodeTiled fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
    const cudaError_t e =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found);
#else
    const cudaError_t e = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &p, cudaEnableDefault, &found);
#endif
    if (e != cudaSuccess || found != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      p = nullptr;
    }
    return reinterpret_cast<TensorMapEncodeTiled>(p);
  }();
  return fn;
}

template <typename T, int D>
bool encode_decode_maps(const JaMhaFwdArgs& a, DecodeMaps* maps) {
  const TensorMapEncodeTiled encode = tensor_map_encoder();
  if (!encode) return false;
  constexpr cuuint64_t es = sizeof(T);
  const cuuint32_t box[4] = {64, 1, cuuint32_t(DecodeTiles<T, D, true>::BC), 1};
  const cuuint32_t unit[4] = {1, 1, 1, 1};
  const CUtensorMapDataType type =
      std::is_same<T, bf16_t>::value ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  constexpr CUtensorMapL2promotion l2 = JA_MHA_DECODE_TMA_L2 == 256   ? CU_TENSOR_MAP_L2_PROMOTION_L2_256B
                                        : JA_MHA_DECODE_TMA_L2 == 128 ? CU_TENSOR_MAP_L2_PROMOTION_L2_128B
                                        : JA_MHA_DECODE_TMA_L2 == 64  ? CU_TENSOR_MAP_L2_PROMOTION_L2_64B
                                                                      : CU_TENSOR_MAP_L2_PROMOTION_NONE;
  for (int i = 0; i < 2; ++i) {
    CUtensorMap* m = i == 0 ? &maps->k : &maps->v;
    // [batch][seq_k][heads_kv][head dim] (K: head_dim, V: head_dim_v; columns past it read as 0)
    const cuuint64_t hdim = cuuint64_t(i == 0 ? a.p.head_dim : a.p.head_dim_v);
    const cuuint64_t dims[4] = {hdim, cuuint64_t(a.p.heads_kv), cuuint64_t(a.p.seq_k), cuuint64_t(a.p.batch)};
    const cuuint64_t strides[3] = {hdim * es, dims[1] * hdim * es, dims[2] * dims[1] * hdim * es};  // bytes, dims 1..3
    if (encode(m, type, 4, const_cast<void*>(i == 0 ? a.k : a.v), dims, strides, box, unit,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, l2,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
      return false;
  }
  return true;
}

// Whether the TMA kernel runs here: JA_MHA_DECODE_TMA, 16-bit types at head_dim 64, 128 or 256, a device
// of compute capability 9.0+ whose loaded code for the kernel was compiled for 9.0+ (not sm_80 PTX
// JIT-compiled, where the kernel's TMA branch traps; cached per device), sizes the maps hold, and
// not JA_MHA_FWD_DECODE_TMA=0 in the environment (read on every call, so a test can compare both
// paths in one process).
template <typename T, int D, bool CAUSAL>
bool decode_tma_applies(const JaMhaFwdArgs& a) {
  if constexpr (!kDecodeTmaBuilt<T, D>) {
    return false;
  } else {
    if (a.p.seq_k <= 0 || a.p.seq_k >= (int64_t(1) << 31) || a.p.batch >= (int64_t(1) << 31) ||
        a.p.heads_kv >= (int64_t(1) << 31))
      return false;
    if (ja::env_off("JA_MHA_FWD_DECODE_TMA")) return false;
    static std::atomic<int> cache[64];  // 1 no, 2 yes
    const int dev = ja::current_device();
    if (dev < 0) return false;
    return ja::per_device(cache, dev, [](int d) {
             cudaFuncAttributes fa{};
             const bool ok = cudaFuncGetAttributes(&fa, mha_decode_kernel<T, D, CAUSAL, true>) == cudaSuccess;
             if (!ok) (void)cudaGetLastError();
             const bool tma = ok && ja::compute_capability(d) >= 90 && fa.binaryVersion >= 90 && fa.ptxVersion >= 90 &&
                              tensor_map_encoder();
             return tma ? 2 : 1;
           }) == 2;
  }
}

// Whether the splits of each kv head's rows run as one thread-block cluster that merges them through
// distributed shared memory (no merge kernel, no workspace): on the TMA path, 2 to kDecodeMaxCluster
// splits, not JA_MHA_FWD_DECODE_CLUSTER=0 in the environment (read on every call, so a test can compare
// both paths in one process), and only where the device holds the clusters in as many waves as the
// plan's blocks take (a cluster's blocks share one GPU processing cluster, so fewer may fit at once).
template <typename T, int D, bool CAUSAL>
bool decode_cluster_applies(int splits, int64_t groups, int64_t slots) {
  if (splits < 2 || splits > kDecodeMaxCluster || ja::env_off("JA_MHA_FWD_DECODE_CLUSTER")) return false;
  static std::atomic<int> cache[kDecodeMaxCluster + 1][64];  // clusters resident at once, + 1
  const int dev = ja::current_device();
  if (dev < 0) return false;
  const int fit =
      ja::per_device(
          cache[splits], dev,
          [splits](int) {
            using Tl = DecodeTiles<T, D, true>;
            auto kernel = mha_decode_kernel<T, D, CAUSAL, true>;
            (void)allow_smem(kernel, Tl::kSmemBytes, "");  // a refusal shows at the launch
            return ja::max_active_clusters(kernel, dim3(Tl::kThreads), size_t(Tl::kSmemBytes), unsigned(splits)) + 1;
          }) -
      1;
  return fit > 0 && (groups + fit - 1) / fit == (splits * groups + slots - 1) / slots;
}

template <typename T, int D, bool CAUSAL, bool TMA>
const char* mha_decode_launch_with(const JaMhaFwdArgs& a, const DecodeMaps& maps, ja_stream_t stream) {
  using Tl = DecodeTiles<T, D, TMA>;
  const int64_t rblocks = (decode_rows(a) + 15) / 16;
  const int64_t groups = a.p.batch * a.p.heads_kv * rblocks;  // blocks per split
  // Splits the workspace has room for: each holds 16 rows x (D + 1) floats per block of a split.
  const int64_t per_split = groups * 16 * (D + 1) * int64_t(sizeof(float));
  const int64_t max_splits = a.workspace ? a.workspace_bytes / per_split : 0;
  const int64_t slots = decode_slots<T, D, CAUSAL, TMA>();
  const DecodePlan plan = decode_plan<T, D>(a, rblocks, slots, max_splits < 1 ? 1 : max_splits);
  bool cluster = false;
  if constexpr (TMA) cluster = decode_cluster_applies<T, D, CAUSAL>(plan.splits, groups, slots);
  DecodeArgs d{a, int(rblocks), nullptr, nullptr, cluster ? plan.splits : 0};
  if (plan.splits > 1 && !cluster) {
    const int64_t parts = groups * plan.splits * 16;
    d.ws_o = static_cast<float*>(a.workspace);
    d.ws_lse = d.ws_o + parts * D;
  }
  if (const char* e = check_grid("mha_fwd", plan.splits, a.p.heads_kv * rblocks, a.p.batch)) return e;
  const dim3 grid(unsigned(plan.splits), unsigned(a.p.heads_kv * rblocks), unsigned(a.p.batch));
  auto kernel = mha_decode_kernel<T, D, CAUSAL, TMA>;
  if (const char* e = allow_smem(kernel, Tl::kSmemBytes, "mha_fwd (decode)")) return e;
  ja_error_t err = launch_clustered(kernel, grid, dim3(Tl::kThreads), size_t(Tl::kSmemBytes), stream,
                                    cluster ? unsigned(plan.splits) : 1u, d, maps);
  if (err != ja_success) return ja_error("mha_fwd (decode): kernel launch failed: %s", ja_get_error_string(err));
  if (cluster) mha_decode_cluster_calls().fetch_add(1, std::memory_order_relaxed);
  if (plan.splits == 1 || cluster) return nullptr;
  const int64_t rows = groups * 16;
  const int64_t blocks = (rows + 3) / 4;
  if (blocks > 0x7fffffffLL) return ja_error("mha_fwd: %lld decode rows exceed the GPU grid", (long long)rows);
  err = launch_pdl(mha_decode_combine_kernel<T, D>, dim3(unsigned(blocks)), dim3(128), 0, stream, d, plan.splits);
  if (err != ja_success) return ja_error("mha_fwd (decode merge): kernel launch failed: %s", ja_get_error_string(err));
  return nullptr;
}

template <typename T, int D, bool CAUSAL>
const char* mha_decode_launch(const JaMhaFwdArgs& a, ja_stream_t stream) {
  if (const char* e = refuse_unhandled("mha_fwd", "split-KV decode", a.p, kFwdDecodeFeatures)) return e;
  DecodeMaps maps{};
  if constexpr (kDecodeTmaBuilt<T, D>) {
    if (decode_tma_applies<T, D, CAUSAL>(a)) {
      if (encode_decode_maps<T, D>(a, &maps)) {
        const char* err = mha_decode_launch_with<T, D, CAUSAL, true>(a, maps, stream);
        if (!err) mha_decode_tma_calls().fetch_add(1, std::memory_order_relaxed);
        return err;
      }
      static std::atomic<bool> told{false};  // a fallback is logged (once a process), never silent
      if (!told.exchange(true))
        std::fprintf(stderr,
                     "jax_aiter: mha_fwd (decode): the driver refused a TMA tensor map for K/V (a pointer or stride "
                     "not 16-byte aligned?); such calls use the cp.async loads (same results)\n");
    }
  }
  return mha_decode_launch_with<T, D, CAUSAL, false>(a, maps, stream);
}

}  // namespace mha_gpu
}  // namespace ja
#endif  // JA_HAS_WARP_MMA
