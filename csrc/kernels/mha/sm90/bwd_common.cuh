// What the two Hopper (sm_90a) backward kernels share (sm90/bwd_kernel.cuh: head dims up to 128;
// sm90/bwd_kernel_d256.cuh: head dims 192 and 256): the kernel arguments, the work of a block (its key
// block, the query tiles that see it, which of them need a per-element mask), the TMA loads of K/V and
// of the Q/dO tiles, the per-row statistics and mask bounds, P and dS with the score's terms, the
// deterministic order of the dQ updates, the dK/dV store, the preprocess and the launch.
//
// A kernel's traits derive from BwdLayouts (tile sizes, the Q/dO and K/V layouts and loads) and
// add TiledMmas, kSlots (per-row slots), kThreads, SharedStorage (deriving from BwdSmem) and
// Params (deriving from BwdArgs, with tma_q, tma_do, tma_k, tma_v).
//
// Masks: a block of keys [k0, k0 + nk) is seen by the query rows [q_lo of k0, q_hi of its last key)
// (`cols`, ja::mha_col); its query tiles are those that meet that range, and the others are never
// loaded. A query tile all of whose rows see every key of the block takes no per-element mask; the
// others take lo_i <= key < hi_i per element (the rows' bounds, staged in shared memory with lse and
// delta).
//
// The score's terms (the FEAT kernels, for calls with softcap or ALiBi, which pick softcap and ALiBi at run
// time; benchmarks/gpu/check_mha_bwd_sm90.cu times them only slightly slower than the plain backward, so
// one kernel serves both): P is recomputed in the
// natural-log domain, x = scale q.k or softcap tanh(scale q.k / softcap) (tanh.approx.f32, as the
// forward), plus ALiBi's -slope |diag_i - j|; with softcap dS takes the factor 1 - tanh^2 (dK and dQ the
// factor scale, as without).
//
// Deterministic backward (JaMhaBwdArgs::deterministic): the dQ of a (query head, query tile) is the sum
// of the contributions of the key blocks that see it, added by TMA reduce-adds (float32 adds in L2) whose
// order decides the rounding. Here they are added in a fixed order, the key blocks from the last to the
// first, by a semaphore per (batch, query head, 64-row query tile) in the caller's `sync` workspace: the
// preprocess sets each to -2 * (the last key block that sees the tile); a block's warpgroup waits until
// its tile's semaphore reaches -2 * (its key block) before it adds its half of the columns, and adds 1 once
// that add has completed (a later iteration, so the wait is off the critical path). The blocks of a (kv
// head, batch) then start from the last key block (a block only ever waits for blocks started before it,
// so no wait can deadlock however many blocks are resident), which makes each key block follow its
// predecessor by about one query tile. dK and dV need nothing: one block accumulates them over every
// query head of its group in registers, in a fixed order.
//
// Causal with grouped query heads, that order starts each (kv head, batch)'s heaviest block last: a block
// walks every query head of its group, so its first key block runs group times as long as a query head's
// and the last wave waits on it. There (BwdArgs::heavy_first, where a (kv head, batch)'s key blocks fit the
// multiprocessors) the blocks start heaviest first, as without the order, and walk their iterations
// tile-major (every query head of a tile, then the next tile): a block then reaches each tile 2 x group
// iterations after the next key block, which started beside it, so its wait finds that add done. A block
// still waits only on the blocks of its own (kv head, batch), and the pairs start a chunk at a time
// (causal_chunk: as many pairs as the multiprocessors hold all the blocks of): the first chunk not yet
// finished has its blocks resident or free multiprocessors to start them on, so it always finishes, and no
// wait can deadlock.
#pragma once
#include <climits>  // INT_MIN: bwd_sync_wait's `seen` when none was read

#include <cutlass/fast_math.h>

#include "mha/common/exact.cuh"
#include "mha/sm90/common.cuh"
#include "mha/sm90/dims.h"

namespace ja {
namespace mha_sm90 {

// The features (ja::MhaFeature) the Hopper backward handles; it declines a call with any other (bias,
// dropout: the mma.sync kernels' path).
constexpr uint32_t kBwdFeatures = kMhaHeadDimV | kMhaRows | kMhaSoftcap | kMhaAlibi | kMhaDeterministic;

// Query rows per tile in both backward kernels; the semaphores of the deterministic order are per tile of
// as many rows (mha.h's sync words: batch * heads_q * ceil(seq_q / 64)).
constexpr int kBwdTileRows = 64;

using BwdShape = Shape<int32_t, int32_t, int32_t, int32_t>;  // (seq, head_dim, heads, batch)
using BwdStride = Stride<int64_t, _1, int64_t, int64_t>;

// The kernel arguments besides the TMA descriptors (the base of each kernel's Params).
template <typename Element>
struct BwdArgs {
  BwdShape shape_q, shape_k;  // (seq_q, d, heads_q, batch), (seq_k, d, heads_kv, batch)
  const float* lse;
  const float* delta;
  float* dq_accum;
  Element* dk;
  Element* dv;
  int32_t d, dv_cols, heads_q, heads_kv, group;
  float scale;  // dK's and dQ's factor (d x / d(q.k) = scale, times 1 - tanh^2 with softcap)
  // The exponent's factor: plain instances, scale * log2(e) (x = q.k); FEAT instances, log2(e) (x = the
  // score in the natural-log domain, as the forward has it).
  float s2;
  float softcap, tanh_in;  // FEAT: softcap > 0: x = softcap * tanh(q.k * tanh_in), tanh_in = scale / softcap
  const float* alibi;      // FEAT: null, or slopes [., heads_q]
  int64_t alibi_batch_stride;
  JaMhaProblem pr;  // the call's problem (sm90_row, sm90_col read its mask)
  const int32_t* cols;
  int64_t cols_batch_stride;
  int32_t* sync;    // deterministic: the semaphores, [batch, heads_q, m_tiles]; null otherwise
  int32_t m_tiles;  // ceil(seq_q / kBwdTileRows)
  int64_t chunk;    // causal: (head, batch) pairs per chunk of the block order (causal_chunk)
  int32_t heavy_first;  // deterministic, causal, grouped heads: the blocks start heaviest first, tile-major
  mha_gpu::ExactBwd<Element> in;  // the inputs, for keys computed again (exact_dkdv_key)
};

template <typename Element>
BwdArgs<Element> bwd_args(const JaMhaBwdArgs& a, bool feat) {
  const JaMhaProblem& pr = a.p;
  const int hq = int(pr.heads_q), hkv = int(pr.heads_kv), bt = int(pr.batch), d = int(pr.head_dim);
  const bool softcap = feat && pr.softcap > 0.0f;
  return {make_shape(int(pr.seq_q), d, hq, bt),
          make_shape(int(pr.seq_k), d, hkv, bt),
          a.lse,
          a.delta,
          a.dq_accum,
          static_cast<Element*>(a.dk),
          static_cast<Element*>(a.dv),
          d,
          int(pr.head_dim_v),
          hq,
          hkv,
          hq / hkv,
          pr.scale,
          feat ? ja_log2e : pr.scale * ja_log2e,
          softcap ? pr.softcap : 0.0f,
          softcap ? pr.scale / pr.softcap : 0.0f,
          feat ? pr.alibi : nullptr,
          pr.alibi_batch_stride,
          pr,
          a.cols,
          a.cols_batch_stride,
          a.deterministic ? a.sync : nullptr,
          int((pr.seq_q + kBwdTileRows - 1) / kBwdTileRows),
          0,  // chunk: bwd_launch sets it from the grid
          0,  // heavy_first: bwd_launch sets it
          mha_gpu::exact_bwd<Element>(a)};
}

// A TMA load of ROWS x COLS tiles of a [batch, seq, heads, dim] tensor into SmemLayout (columns past dim
// read as zeros).
template <typename Element, typename SmemLayout, int ROWS, int COLS>
auto bwd_tma_load(const void* ptr, int seq, int dim, int heads, int batch) {
  return make_tma_copy(SM90_TMA_LOAD{}, bshd_tensor<Element>(ptr, seq, dim, heads, batch), SmemLayout{},
                       Shape<Int<ROWS>, Int<COLS>>{}, _1{});
}

// The widest swizzle atom width (64, 32 or 16 16-bit elements) that divides D and that a warpgroup's
// slice of S1 and of S2 columns starts on or within whole (a wgmma operand slice may start inside an
// atom, as the dQ product's 32 columns of a 64-wide atom do, but may not straddle two).
constexpr bool bwd_atom_fits(int W, int D, int S1, int S2) {
  return D % W == 0 && (S1 % W == 0 || W % S1 == 0) && (S2 % W == 0 || W % S2 == 0);
}
constexpr int bwd_atom_width(int D, int S1, int S2) {
  return bwd_atom_fits(64, D, S1, S2) ? 64 : bwd_atom_fits(32, D, S1, S2) ? 32 : bwd_atom_fits(16, D, S1, S2) ? 16 : 8;
}
template <typename Element, int W>
using AtomByWidth = std::conditional_t<
    W == 64, GMMA::Layout_K_SW128_Atom<Element>,
    std::conditional_t<W == 32, GMMA::Layout_K_SW64_Atom<Element>, GMMA::Layout_K_SW32_Atom<Element>>>;

// Tile sizes and what the kernels share of their shared-memory layouts: Q (BM x D) and dO (BM x DV),
// kStages stages, and K (BN x D), V (BN x DV), in swizzled rows, with the transposed views (D x BM,
// DV x BM, D x BN) the dK/dV and dQ products read, and their TMA loads. AD, ADV: the atom widths of the
// D and DV columns (bwd_atom_width of the kernel's column slices).
template <typename Element_, int D, int DV, int BM_, int BN_, int kStages_, int AD, int ADV>
struct BwdLayouts {
  using Element = Element_;
  static constexpr int kHeadDim = D;
  static constexpr int kHeadDimV = DV;
  static constexpr int BM = BM_;  // query rows per tile
  static constexpr int BN = BN_;  // keys per block
  static constexpr int kStages = kStages_;
  static_assert(BM == kBwdTileRows, "the deterministic order's semaphores are per 64-row query tile");
  static_assert(AD >= 16 && ADV >= 16, "no swizzle atom fits these column slices");
  using AtomD = AtomByWidth<Element, AD>;
  using AtomDV = AtomByWidth<Element, ADV>;
  using SmemLayoutQ = decltype(tile_to_shape(AtomD{}, Shape<Int<BM>, Int<D>, Int<kStages>>{}));
  using SmemLayoutdO = decltype(tile_to_shape(AtomDV{}, Shape<Int<BM>, Int<DV>, Int<kStages>>{}));
  using SmemLayoutQt = decltype(composition(
      SmemLayoutQ{}, make_layout(Shape<Int<D>, Int<BM>, Int<kStages>>{}, Stride<Int<BM>, _1, Int<BM * D>>{})));
  using SmemLayoutdOt = decltype(composition(
      SmemLayoutdO{}, make_layout(Shape<Int<DV>, Int<BM>, Int<kStages>>{}, Stride<Int<BM>, _1, Int<BM * DV>>{})));
  using SmemLayoutK = decltype(tile_to_shape(AtomD{}, Shape<Int<BN>, Int<D>>{}));
  using SmemLayoutV = decltype(tile_to_shape(AtomDV{}, Shape<Int<BN>, Int<DV>>{}));
  using SmemLayoutKt =
      decltype(composition(SmemLayoutK{}, make_layout(Shape<Int<D>, Int<BN>>{}, Stride<Int<BN>, _1>{})));
  using TmaQ = decltype(bwd_tma_load<Element, decltype(take<0, 2>(SmemLayoutQ{})), BM, D>(nullptr, 0, 0, 0, 0));
  using TmadO = decltype(bwd_tma_load<Element, decltype(take<0, 2>(SmemLayoutdO{})), BM, DV>(nullptr, 0, 0, 0, 0));
  using TmaK = decltype(bwd_tma_load<Element, SmemLayoutK, BN, D>(nullptr, 0, 0, 0, 0));
  using TmaV = decltype(bwd_tma_load<Element, SmemLayoutV, BN, DV>(nullptr, 0, 0, 0, 0));
  static constexpr uint32_t kBytesQ = uint32_t(BM * D * sizeof(Element));
  static constexpr uint32_t kBytesdO = uint32_t(BM * DV * sizeof(Element));
  static constexpr uint32_t kBytesK = uint32_t(BN * D * sizeof(Element));
  static constexpr uint32_t kBytesV = uint32_t(BN * DV * sizeof(Element));
};

// The TMA loads of a kernel's Q/dO tiles and K/V blocks (the call's d and dv; boxes of the instance's).
template <typename Tr>
struct BwdLoads {
  typename Tr::TmaQ tma_q;
  typename Tr::TmadO tma_do;
  typename Tr::TmaK tma_k;
  typename Tr::TmaV tma_v;
};
template <typename Tr>
BwdLoads<Tr> bwd_loads(const JaMhaBwdArgs& a) {
  using E = typename Tr::Element;
  const JaMhaProblem& pr = a.p;
  const int sq = int(pr.seq_q), sk = int(pr.seq_k), hq = int(pr.heads_q), hkv = int(pr.heads_kv), bt = int(pr.batch);
  const int d = int(pr.head_dim), dv = int(pr.head_dim_v);
  using SQ = decltype(take<0, 2>(typename Tr::SmemLayoutQ{}));
  using SdO = decltype(take<0, 2>(typename Tr::SmemLayoutdO{}));
  return {bwd_tma_load<E, SQ, Tr::BM, Tr::kHeadDim>(a.q, sq, d, hq, bt),
          bwd_tma_load<E, SdO, Tr::BM, Tr::kHeadDimV>(a.dout, sq, dv, hq, bt),
          bwd_tma_load<E, typename Tr::SmemLayoutK, Tr::BN, Tr::kHeadDim>(a.k, sk, d, hkv, bt),
          bwd_tma_load<E, typename Tr::SmemLayoutV, Tr::BN, Tr::kHeadDimV>(a.v, sk, dv, hkv, bt)};
}

// The widest float32 K-major swizzle atom whose width (32, 16 or 8 floats) divides COLS.
template <int COLS>
using FloatAtomK = std::conditional_t<
    COLS % 32 == 0, GMMA::Layout_K_SW128_Atom<float>,
    std::conditional_t<COLS % 16 == 0, GMMA::Layout_K_SW64_Atom<float>, GMMA::Layout_K_SW32_Atom<float>>>;

// A dQ staging tile (float32, BM x COLS) in shared memory, swizzled: warpgroup w's COLS / 2 columns are
// the contiguous half w, which one TMA reduce-add (Tma, made by tma()) adds to a BM x COLS / 2 tile of
// dq_accum ([batch, seq, heads, d] float32; columns past d are clipped).
template <int BM, int COLS>
struct BwdDqStage {
  static constexpr int kHalf = COLS / 2;
  using Layout = decltype(tile_to_shape(FloatAtomK<kHalf>{}, Shape<Int<BM>, Int<COLS>>{}));
  using LayoutHalf = decltype(tile_to_shape(FloatAtomK<kHalf>{}, Shape<Int<BM>, Int<kHalf>>{}));
  static auto tma(float* dq_accum, int seq, int d, int heads, int batch) {
    return make_tma_copy(SM90_TMA_REDUCE_ADD{}, bshd_tensor<float>(dq_accum, seq, d, heads, batch), LayoutHalf{},
                         Shape<Int<BM>, Int<kHalf>>{}, _1{});
  }
  using Tma = decltype(tma(nullptr, 0, 0, 0, 0));
};

// A backward kernel's parameters (both kernels'): the call's arguments, the TMA loads of Layouts (Q, dO, K, V)
// and the dQ reduce-add of DqStage.
template <typename Layouts, typename DqStage>
struct BwdParams : BwdArgs<typename Layouts::Element> {
  typename Layouts::TmaQ tma_q;
  typename Layouts::TmadO tma_do;
  typename Layouts::TmaK tma_k;
  typename Layouts::TmaV tma_v;
  typename DqStage::Tma tma_dq;
};

// Issued by warpgroup wg's leader once its half of the staging tile sdQ is written and fenced:
// that half added to dq_accum's tile (m, col_tile) of BM x COLS / 2 (query head h, batch b) by one
// TMA reduce-add (rows past seq_q and columns past d are clipped); tma_store_wait before the half is
// rewritten.
template <typename Stage, typename Tma, typename SdQ>
CUTE_DEVICE void bwd_reduce_dq(Tma const& tma, BwdShape const& shape_q, SdQ const& sdQ, int h, int b, int m,
                               int col_tile, int wg) {
  using Tile = Shape<Int<decltype(size<0>(sdQ))::value>, Int<Stage::kHalf>>;
  Tensor gdQ = local_tile(tma.get_tma_tensor(shape_q)(_, _, h, b), Tile{}, make_coord(m, col_tile));
  Tensor sdQh = local_tile(sdQ, Tile{}, make_coord(_0{}, wg));
  auto [tdQg, tdQs] = tma_partition(tma, _0{}, Layout<_1>{}, group_modes<0, 2>(sdQh), group_modes<0, 2>(gdQ));
  copy(tma, tdQs, tdQg);
  tma_store_arrive();
}

// --- the deterministic order of the dQ updates (see the top of this file) ---

// The query rows that see key j, [q_lo, q_hi), clamped (mha_gpu::exact_col; causal, without reading the mask).
template <bool CAUSAL>
CUTE_HOST_DEVICE MhaCol sm90_col(JaMhaProblem const& pr, const int32_t* cols, int64_t cols_batch_stride, int b, int j) {
  if (CAUSAL) return MhaCol{mha_clamp(j - (pr.seq_k - pr.seq_q), 0, pr.seq_q), pr.seq_q};
  return mha_gpu::exact_col(pr, cols, cols_batch_stride, b, j);
}

// The query tiles key block n of batch b works on, [m_begin, m_end) (every tile that meets the rows that
// see one of its keys), and those whose rows all see every one of its keys, [full_lo, full_hi) (no
// per-element mask). m_begin and m_end are non-decreasing in n (as q_lo and q_hi are in the key), which
// the deterministic order's counts rely on.
struct BwdRange {
  int m_begin, m_end, full_lo, full_hi;
};
template <int BM, int BN, bool CAUSAL>
CUTE_HOST_DEVICE BwdRange bwd_range(JaMhaProblem const& pr, const int32_t* cols, int64_t cols_batch_stride, int b,
                                    int n) {
  const int sk = int(pr.seq_k), k0 = n * BN, kl = min(k0 + BN, sk) - 1;
  const MhaCol f = sm90_col<CAUSAL>(pr, cols, cols_batch_stride, b, k0);
  const MhaCol l = sm90_col<CAUSAL>(pr, cols, cols_batch_stride, b, kl);
  BwdRange r;
  r.m_begin = int(f.q_lo) / BM;
  r.m_end = max(r.m_begin, int(l.q_hi + BM - 1) / BM);
  const bool whole = kl - k0 + 1 == BN;
  r.full_lo = int(l.q_lo + BM - 1) / BM;
  r.full_hi = whole ? int(f.q_hi) / BM : 0;
  return r;
}

// Deterministic order: the semaphore of each (batch b, query head h, query tile m) set to -2 * (the last
// key block whose range holds tile m), found by bisection (the ranges' starts are non-decreasing); 0 where
// no block holds it (then no block waits on it). One thread per semaphore.
template <int BM, int BN, bool CAUSAL>
__global__ void __launch_bounds__(256)
    bwd_init_sync(JaMhaProblem const pr, const int32_t* cols, int64_t cols_batch_stride, int32_t* sync, int m_tiles) {
  const int64_t idx = int64_t(blockIdx.x) * 256 + threadIdx.x;
  if (idx >= pr.batch * pr.heads_q * m_tiles) return;
  const int m = int(idx % m_tiles), b = int(idx / (int64_t(m_tiles) * pr.heads_q));
  const int n_blocks = int((pr.seq_k + BN - 1) / BN);
  int lo = 0, hi = n_blocks;  // the blocks [0, lo) hold a start <= m; [hi, n_blocks) do not
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (bwd_range<BM, BN, CAUSAL>(pr, cols, cols_batch_stride, b, mid).m_begin <= m) lo = mid + 1;
    else hi = mid;
  }
  sync[idx] = lo > 0 ? -2 * (lo - 1) : 0;
}

// Issued by a warpgroup's leader before its first dQ add of a tile: waits (acquire) until the tile's
// semaphore reaches -2 * n_block, i.e. both warpgroups of every later key block holding the tile have
// completed their adds. A wait past 10 s means the counts and the ranges disagree (malformed cols): it
// traps rather than hang. Not inlined: inlined into the leader's branch, its loop made the compiler
// serialize the kernel's wgmmas (ptxas C7518). `seen`: the semaphore as bwd_sync_peek read it half an
// iteration earlier (it only grows); at or past the target the poll, an L2 round trip that the warpgroup's
// next wgmma would wait for, is skipped. That read is relaxed, not an acquire: the add it lets through is
// issued only once the branch on its value has resolved (the SM issues in order and does not speculate), and
// the adds it orders are performed in L2, which the gpu-scope read also reads, so the earlier blocks' adds,
// complete before their release, are performed first. A fence.acq_rel.gpu to make it a formal acquire cost
// more than the poll it saves (the deterministic timings of benchmarks/gpu/check_mha_bwd_sm90.cu), and
// bitwise equal gradients run after run are checked by that harness and tests/ops/test_attention_gpu_paths.py.
static __device__ __noinline__ void bwd_sync_wait(const int32_t* sem, int n_block, int seen = INT_MIN) {
  const int target = -2 * n_block;
  if (seen < target) {
    int v;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(sem) : "memory");
    if (v < target) {
      uint64_t t0;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
      for (int spin = 0;; ++spin) {
        asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(sem) : "memory");
        if (v >= target) break;
        if ((spin & 1023) == 1023) {
          uint64_t t;
          asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
          if (t - t0 > 10000000000ull) __trap();
        }
      }
    }
  }
  asm volatile("fence.proxy.async.global;" ::: "memory");  // every exit: the TMA adds that follow come after
}

// A tile's semaphore, read (relaxed) by a warpgroup's leader right after a block barrier, for bwd_sync_wait's
// `seen`.
CUTE_DEVICE int bwd_sync_peek(const int32_t* sem) {
  int v;
  asm volatile("ld.relaxed.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(sem) : "memory");
  return v;
}

// Issued by a warpgroup's leader after its last dQ add of a tile was committed: waits until every bulk
// copy it issued but the last PENDING groups has completed (its writes performed, not only its shared
// memory read), then releases the tile's semaphore by 1. Not inlined, as bwd_sync_wait.
template <int PENDING = 0>
__device__ __noinline__ void bwd_sync_release(int32_t* sem) {
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(PENDING) : "memory");
  asm volatile("fence.proxy.async.global;" ::: "memory");
  asm volatile("red.release.gpu.global.add.s32 [%0], 1;" ::"l"(sem) : "memory");
}

// --- shared memory, the block's work, the loads ---

// The shared memory both kernels use (a kernel's SharedStorage derives from it and adds its own).
template <typename L, int kSlots>
struct BwdSmem {
  using Element = typename L::Element;
  array_aligned<Element, cosize_v<typename L::SmemLayoutQ>, 1024> q;
  array_aligned<Element, cosize_v<typename L::SmemLayoutdO>, 1024> dO;
  array_aligned<Element, cosize_v<typename L::SmemLayoutK>, 1024> k;
  array_aligned<Element, cosize_v<typename L::SmemLayoutV>, 1024> v;
  float lse[kSlots][L::BM];  // lse * log2(e) of the query tile, +inf past seq_q
  float delta[kSlots][L::BM];
  // The rows' keys [lo, hi) less the block's first key, clamped to [0, BN] (8 bits each: lo | hi << 8; past
  // seq_q: empty), and their diagonals less it. Packed: at head dim 128 the tiles leave 3 KB for these.
  uint16_t bounds[kSlots][L::BM];
  float diag[kSlots][L::BM];
  cutlass::arch::ClusterTransactionBarrier barrier_kv;
  cutlass::arch::ClusterTransactionBarrier barrier_q[L::kStages];
};

// The block's dynamic shared memory as the kernel's SharedStorage.
template <typename Tr>
CUTE_DEVICE typename Tr::SharedStorage& bwd_smem() {
  extern __shared__ __align__(1024) char smem_raw[];
  return *reinterpret_cast<typename Tr::SharedStorage*>(smem_raw);
}

// Q, dO, their transposes, K, V and K^T in shared memory.
template <typename Tr>
CUTE_DEVICE auto bwd_smem_tensors(typename Tr::SharedStorage& ss) {
  return make_tuple(make_tensor(make_smem_ptr(ss.q.data()), typename Tr::SmemLayoutQ{}),
                    make_tensor(make_smem_ptr(ss.dO.data()), typename Tr::SmemLayoutdO{}),
                    make_tensor(make_smem_ptr(ss.q.data()), typename Tr::SmemLayoutQt{}),
                    make_tensor(make_smem_ptr(ss.dO.data()), typename Tr::SmemLayoutdOt{}),
                    make_tensor(make_smem_ptr(ss.k.data()), typename Tr::SmemLayoutK{}),
                    make_tensor(make_smem_ptr(ss.v.data()), typename Tr::SmemLayoutV{}),
                    make_tensor(make_smem_ptr(ss.k.data()), typename Tr::SmemLayoutKt{}));
}

// What a block works on: keys [kv0, kv0 + nk) of kv head hk in batch b, and n_iter iterations, one
// a (query head, query tile): iteration it is query head head(it), query tile tile(it), head-major (every
// tile of a head, then the next head) or tile_major; full(it): the tile takes no per-element mask.
// sem(it): the tile's semaphore (deterministic). The kernels map several iterations each (the current one
// and the prefetched ones): n_inner divides by a multiply and a shift set up once per block, where a
// division by a runtime int is a long instruction sequence in the warpgroups' loop (and a choice between two
// divisions, one a branch each).
struct BwdWork {
  int n_block, hk, b, sq, sk, kv0, nk, group, m_begin, q_tiles, n_iter, full_lo, full_hi;
  cutlass::FastDivmod n_inner;  // iterations per outer step: q_tiles (head-major) or group (tile_major)
  bool tile_major;
  CUTE_DEVICE int head(int it) const {
    int o, i;
    n_inner(o, i, it);
    return hk * group + (tile_major ? i : o);
  }
  CUTE_DEVICE int tile(int it) const {
    int o, i;
    n_inner(o, i, it);
    return m_begin + (tile_major ? o : i);
  }
  CUTE_DEVICE bool full(int it) const { return tile(it) >= full_lo && tile(it) < full_hi; }
};

template <int BM, int BN, bool CAUSAL, typename Element>
CUTE_DEVICE BwdWork bwd_work(BwdArgs<Element> const& p) {
  BwdWork w;
  // Causal: each kv head's first key blocks, seen by the most query tiles, start first (in the model's
  // train step, 32 query tiles against the last one's 2), a chunk of kv heads and batches at a time
  // (mha_gpu::grid_place, causal_chunk). Deterministic: every (kv head, batch)'s blocks start from its
  // last key block (the order of the dQ adds: see the top of this file), causal or not, but where
  // p.heavy_first says (causal, grouped heads: see the top of this file).
  mha_gpu::GridPlace at;
  if (p.sync && !p.heavy_first) {
    at = CAUSAL ? mha_gpu::grid_place(true, true, p.chunk)
                : mha_gpu::GridPlace{int64_t(gridDim.x - 1 - blockIdx.x), int64_t(blockIdx.y), int64_t(blockIdx.z)};
  } else {
    at = mha_gpu::grid_place(CAUSAL, false, p.chunk);
  }
  w.n_block = int(at.tile), w.hk = int(at.head), w.b = int(at.batch);
  w.sq = get<0>(p.shape_q), w.sk = get<0>(p.shape_k);
  w.kv0 = w.n_block * BN;
  w.nk = min(BN, w.sk - w.kv0);
  w.group = p.group;
  const BwdRange r = bwd_range<BM, BN, CAUSAL>(p.pr, p.cols, p.cols_batch_stride, w.b, w.n_block);
  w.m_begin = r.m_begin;
  w.q_tiles = r.m_end - r.m_begin;
  w.full_lo = r.full_lo, w.full_hi = r.full_hi;
  w.n_iter = p.group * w.q_tiles;
  w.tile_major = p.heavy_first;
  w.n_inner = cutlass::FastDivmod(max(1, w.tile_major ? w.group : w.q_tiles));
  return w;
}

// The semaphore of iteration it's (query head, query tile).
template <typename Element>
CUTE_DEVICE int32_t* bwd_sem(BwdArgs<Element> const& p, BwdWork const& w, int it) {
  return p.sync + (int64_t(w.b) * p.heads_q + w.head(it)) * p.m_tiles + w.tile(it);
}

// Issued by thread 0: Q and dO of iteration `it` into stage it % kStages (completes barrier_q).
template <typename Tr>
CUTE_DEVICE void bwd_load_q(typename Tr::Params const& p, typename Tr::SharedStorage& ss, BwdWork const& w, int it) {
  using TileQ = Shape<Int<Tr::BM>, Int<Tr::kHeadDim>>;
  using TiledO = Shape<Int<Tr::BM>, Int<Tr::kHeadDimV>>;
  const int h = w.head(it), m = w.tile(it), s = it % Tr::kStages;
  Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename Tr::SmemLayoutQ{})(_, _, s);
  Tensor sdO = make_tensor(make_smem_ptr(ss.dO.data()), typename Tr::SmemLayoutdO{})(_, _, s);
  const BwdShape shape_do = make_shape(w.sq, p.dv_cols, p.heads_q, get<3>(p.shape_q));
  Tensor gQ = local_tile(p.tma_q.get_tma_tensor(p.shape_q)(_, _, h, w.b), TileQ{}, make_coord(m, _0{}));
  Tensor gdO = local_tile(p.tma_do.get_tma_tensor(shape_do)(_, _, h, w.b), TiledO{}, make_coord(m, _0{}));
  auto [tQg, tQs] = tma_partition(p.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
  auto [tGg, tGs] = tma_partition(p.tma_do, _0{}, Layout<_1>{}, group_modes<0, 2>(sdO), group_modes<0, 2>(gdO));
  auto& bar = reinterpret_cast<cutlass::arch::ClusterTransactionBarrier::ValueType&>(ss.barrier_q[s]);
  ss.barrier_q[s].arrive_and_expect_tx(Tr::kBytesQ + Tr::kBytesdO);
  copy(p.tma_q.with(bar, 0), tQg, tQs);
  copy(p.tma_do.with(bar, 0), tGg, tGs);
}

// Threads [0, 3 BM): lse (log2 domain; +inf past seq_q), delta, and the rows' mask bounds and diagonals
// (less the block's first key) of iteration `it` into slot it % kSlots.
template <typename Tr, bool CAUSAL>
CUTE_DEVICE void bwd_load_rows(typename Tr::Params const& p, typename Tr::SharedStorage& ss, BwdWork const& w, int it) {
  constexpr int BM = Tr::BM;
  const int tid = threadIdx.x;
  if (tid >= 3 * BM) return;
  const int h = w.head(it), i = tid % BM, q = w.tile(it) * BM + i, slot = it % Tr::kSlots;
  const int64_t off = (int64_t(w.b) * p.heads_q + h) * w.sq + q;
  if (tid < BM) {
    ss.lse[slot][i] = q < w.sq ? p.lse[off] * ja_log2e : INFINITY;
  } else if (tid < 2 * BM) {
    ss.delta[slot][i] = q < w.sq ? p.delta[off] : 0.0f;
  } else if (q < w.sq) {
    static_assert(Tr::BN < 256, "the bounds take 8 bits");
    const MhaRow r = sm90_row<CAUSAL>(p.pr, w.b, q);
    const int lo = int(mha_clamp(r.lo - w.kv0, 0, Tr::BN)), hi = int(mha_clamp(r.hi - w.kv0, 0, Tr::BN));
    ss.bounds[slot][i] = uint16_t(lo | hi << 8);
    ss.diag[slot][i] = float(int(r.diag) - w.kv0);
  } else {
    ss.bounds[slot][i] = 0, ss.diag[slot][i] = 0.0f;
  }
}

// The prologue: the rows of iterations 0 and 1, the barriers, then (thread 0) K and V by
// TMA (barrier_kv) and the Q/dO tiles of iterations 0 and 1. The rows are visible after the
// caller's next block barrier.
template <typename Tr, bool CAUSAL>
CUTE_DEVICE void bwd_start(typename Tr::Params const& p, typename Tr::SharedStorage& ss, BwdWork const& w) {
  using TileK = Shape<Int<Tr::BN>, Int<Tr::kHeadDim>>;
  using TileV = Shape<Int<Tr::BN>, Int<Tr::kHeadDimV>>;
  if (w.n_iter > 0) bwd_load_rows<Tr, CAUSAL>(p, ss, w, 0);
  if (w.n_iter > 1) bwd_load_rows<Tr, CAUSAL>(p, ss, w, 1);
  if (threadIdx.x == 0) {
    cute::prefetch_tma_descriptor(p.tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(p.tma_do.get_tma_descriptor());
    cute::prefetch_tma_descriptor(p.tma_k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(p.tma_v.get_tma_descriptor());
    ss.barrier_kv.init(1);
    for (int i = 0; i < Tr::kStages; ++i) ss.barrier_q[i].init(1);
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const BwdShape shape_v = make_shape(w.sk, p.dv_cols, p.heads_kv, get<3>(p.shape_k));
    Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Tr::SmemLayoutK{});
    Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename Tr::SmemLayoutV{});
    Tensor gK = local_tile(p.tma_k.get_tma_tensor(p.shape_k)(_, _, w.hk, w.b), TileK{}, make_coord(w.n_block, _0{}));
    Tensor gV = local_tile(p.tma_v.get_tma_tensor(shape_v)(_, _, w.hk, w.b), TileV{}, make_coord(w.n_block, _0{}));
    auto [tKg, tKs] = tma_partition(p.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
    auto [tVg, tVs] = tma_partition(p.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));
    auto& bar = reinterpret_cast<cutlass::arch::ClusterTransactionBarrier::ValueType&>(ss.barrier_kv);
    ss.barrier_kv.arrive_and_expect_tx(Tr::kBytesK + Tr::kBytesV);
    copy(p.tma_k.with(bar, 0), tKg, tKs);
    copy(p.tma_v.with(bar, 0), tVg, tVs);
    if (w.n_iter > 0) bwd_load_q<Tr>(p, ss, w, 0);
    if (w.n_iter > 1) bwd_load_q<Tr>(p, ss, w, 1);
  }
}

// P and dS in place on the (row, col) views of the S and dP accumulators, in two calls around the wait
// for dP (the caller's, outside any branch: a wgmma wait in a branch makes the compiler serialize the
// wgmmas). Stage 0 (before the wait): P = exp2(x * s2 - lse), where x is the score (FEAT: softcap,
// ALiBi; else q.k), 0 where masked (MASKED: key outside the row's [lo, hi)). Stage 1 (after it):
// dS = P (dP - delta), 0 where masked (a select, not a product, so a NaN in a masked key's dP stays
// out). With softcap (FEAT, softcap > 0) stage 0 does nothing and stage 1 computes both, with
// 1 - tanh^2 (not kept across the wait). key(r, c) gives an entry's key less the block's first, row(r, c)
// its query row's index in the tile's per-row arrays (lse in the log2 domain, +inf past seq_q: P = 0).
template <int STAGE, bool MASKED, bool FEAT, typename Args, typename TS, typename Key, typename Row>
CUTE_DEVICE void bwd_p_ds(Args const& p, TS s, TS dp, Key key, Row row, const float* lse2, const float* dlt,
                          const uint16_t* bounds, const float* diag, float neg_slope) {
  constexpr int kRows = decltype(size<0>(s))::value, kCols = decltype(size<1>(s))::value;
  const float s2 = p.s2;
  auto visible = [&](int r, int c) {
    const int k = key(r, c), bd = bounds[row(r, c)];
    return k >= (bd & 0xff) && k < (bd >> 8);
  };
  auto alibi = [&](int r, int c, float x) {
    return p.alibi ? fmaf(neg_slope, fabsf(diag[row(r, c)] - float(key(r, c))), x) : x;
  };
  const bool fused = FEAT && p.softcap > 0.0f;
  if (STAGE == 0 && !fused) {
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kRows; ++r) CUTLASS_PRAGMA_UNROLL
    for (int c = 0; c < kCols; ++c) {
      const float x = FEAT ? alibi(r, c, s(r, c) * p.scale) : s(r, c);
      const float pv = ja_exp2_approx(x * s2 - lse2[row(r, c)]);
      s(r, c) = !MASKED || visible(r, c) ? pv : 0.0f;
    }
  } else if (STAGE == 1 && !fused) {
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kRows; ++r) CUTLASS_PRAGMA_UNROLL
    for (int c = 0; c < kCols; ++c) {
      const float ds = s(r, c) * (dp(r, c) - dlt[row(r, c)]);
      dp(r, c) = !MASKED || visible(r, c) ? ds : 0.0f;
    }
  } else if (STAGE == 1) {
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kRows; ++r) CUTLASS_PRAGMA_UNROLL
    for (int c = 0; c < kCols; ++c) {
      const int i = row(r, c);
      const float t = tanh_approx(s(r, c) * p.tanh_in);
      const float pv = ja_exp2_approx(alibi(r, c, p.softcap * t) * s2 - lse2[i]);
      const float ds = pv * (dp(r, c) - dlt[i]) * (1.0f - t * t);
      const bool vis = !MASKED || visible(r, c);
      s(r, c) = vis ? pv : 0.0f;
      dp(r, c) = vis ? ds : 0.0f;
    }
  }
}

// The float32 accumulators `acc` rounded to out's dtype into `out` (as many registers).
template <typename TA, typename TO>
CUTE_DEVICE void bwd_round(TA const& acc, TO& out) {
  using Element = typename TO::value_type;
  constexpr int N = decltype(size(acc))::value;
  static_assert(N == decltype(size(out))::value);
  cutlass::NumericArrayConverter<Element, float, N> cvt;
  *reinterpret_cast<cutlass::Array<Element, N>*>(out.data()) =
      cvt(*reinterpret_cast<cutlass::Array<float, N> const*>(acc.data()));
}

// Epilogue of one gradient: the accumulators `acc` of a (BN x COLS) tile (partitioned by thr_mma) times
// `mul`, rounded to the input dtype, to out's rows < nk and columns < ncols (row_stride elements apart).
template <int BN, int COLS, typename Element, typename ThrMma, typename Acc>
CUTE_DEVICE void bwd_store_rows(ThrMma const& thr_mma, Acc const& acc, Element* out, int64_t row_stride, int nk,
                                int ncols, float mul) {
  Tensor c = thr_mma.partition_C(make_identity_tensor(Shape<Int<BN>, Int<COLS>>{}));
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < decltype(size(acc))::value; i += 2) {  // elements i, i + 1: adjacent columns
    const int kr = int(get<0>(c(i))), col = int(get<1>(c(i)));
    if (kr >= nk || col >= ncols) continue;  // ncols is a multiple of 8: columns i and i + 1 fall on one side
    cutlass::Array<Element, 2> v;
    v[0] = Element(acc(i) * mul);
    v[1] = Element(acc(i + 1) * mul);
    *reinterpret_cast<cutlass::Array<Element, 2>*>(out + kr * row_stride + col) = v;
  }
}

// Whether columns [0, n) of a stored row hold a NaN or an infinity, by the whole warp.
template <typename Element>
CUTE_DEVICE bool bwd_row_nonfinite(const Element* row, int n) {
  float x[mha_gpu::kExactCols];
  mha_gpu::exact_load(row, n, x);
  bool bad = false;
  CUTLASS_PRAGMA_UNROLL
  for (int t = 0; t < mha_gpu::kExactCols; ++t) bad |= !isfinite(x[t]);
  return __any_sync(0xffffffffu, bad);
}

// Keys [kv0, kv0 + nk) of kv head hk, batch b (dK/dV row row0 onwards, heads_kv rows apart), whose stored dK or
// dV row (bwd_store_dkdv's, visible to the whole block) holds a NaN or an infinity, computed again, exactly
// (common/exact.cuh), and rewritten: warp w takes keys w, w + warps, ... Not inlined, so that the kernels carry none
// of this rare path in their registers or code.
template <bool CAUSAL, typename Element>
__device__ __noinline__ void bwd_exact_keys(BwdArgs<Element> const& p, int b, int hk, int kv0, int nk, int64_t row0) {
  const int warps = int(blockDim.x / 32), d = p.d, dv = p.dv_cols;
  for (int kr = int(threadIdx.x / 32); kr < nk; kr += warps) {
    Element* dk = p.dk + (row0 + int64_t(kr) * p.heads_kv) * d;
    Element* dvr = p.dv + (row0 + int64_t(kr) * p.heads_kv) * dv;
    if (!bwd_row_nonfinite(dk, d) && !bwd_row_nonfinite(dvr, dv)) continue;
    const int j = kv0 + kr;
    float gk[mha_gpu::kExactCols], gv[mha_gpu::kExactCols];
    mha_gpu::exact_dkdv_key(
        p.pr, p.in, b, hk, j, sm90_col<CAUSAL>(p.pr, p.cols, p.cols_batch_stride, b, j),
        [pr = p.pr, b](int64_t i) { return sm90_row<CAUSAL>(pr, b, int(i)).diag; }, gk, gv);
    mha_gpu::exact_store(dk, d, gk);
    mha_gpu::exact_store(dvr, dv, gv);
  }
}

// dK * scale and dV of the block's keys (< seq_k), columns < d and < dv. Keys whose dK or dV came out NaN or
// infinite are computed again, exactly, and rewritten (bwd_exact_keys): NaN or Inf in Q or dO of rows that do
// not see a key stays out of it. Every thread of the block calls it.
template <int BN, int D, int DV, bool CAUSAL, typename Element, typename ThrK, typename ThrV, typename AccK,
          typename AccV>
CUTE_DEVICE void bwd_store_dkdv(BwdArgs<Element> const& p, BwdWork const& w, ThrK const& thr_dk, AccK const& dk_acc,
                                ThrV const& thr_dv, AccV const& dv_acc) {
  const int64_t row0 = (int64_t(w.b) * w.sk + w.kv0) * p.heads_kv + w.hk;
  bwd_store_rows<BN, D>(thr_dk, dk_acc, p.dk + row0 * p.d, int64_t(p.heads_kv) * p.d, w.nk, p.d, p.scale);
  bwd_store_rows<BN, DV>(thr_dv, dv_acc, p.dv + row0 * p.dv_cols, int64_t(p.heads_kv) * p.dv_cols, w.nk, p.dv_cols,
                         1.0f);
  bool bad = false;  // registers only; past seq_k or d, a non-finite value is not stored and costs one look
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < decltype(size(dk_acc))::value; ++i) bad |= !isfinite(dk_acc(i));
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < decltype(size(dv_acc))::value; ++i) bad |= !isfinite(dv_acc(i));
  if (__syncthreads_or(bad)) bwd_exact_keys<CAUSAL>(p, w.b, w.hk, w.kv0, w.nk, row0);  // the stores above come first
}

// delta = rowsum(dO * O) over the dv columns, dq_accum's rows zeroed over the d columns: one 8-lane
// group per (batch, row, query head), 16-byte loads and stores (d and dv are multiples of 8).
template <typename T>
__global__ void __launch_bounds__(256) bwd_preprocess(const T* o, const T* dout, float* delta, float* dq_accum,
                                                      int64_t rows, int sq, int hq, int d, int dv) {
  const int lane8 = threadIdx.x % 8;
  for (int64_t base = int64_t(blockIdx.x) * 32; base < rows; base += int64_t(gridDim.x) * 32) {
    const int64_t row = base + threadIdx.x / 8;  // (b * sq + i) * hq + h
    float sum = 0.0f;
    if (row < rows) {
      for (int c = lane8 * 8; c < dv; c += 64) {
        const uint4 ov = *reinterpret_cast<const uint4*>(o + row * dv + c);
        const uint4 gv = *reinterpret_cast<const uint4*>(dout + row * dv + c);
        const T* oe = reinterpret_cast<const T*>(&ov);
        const T* ge = reinterpret_cast<const T*>(&gv);
        CUTLASS_PRAGMA_UNROLL
        for (int e = 0; e < 8; ++e) sum += to_f32(oe[e]) * to_f32(ge[e]);
      }
      for (int c = lane8 * 4; c < d; c += 32)
        *reinterpret_cast<float4*>(dq_accum + row * d + c) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    sum += __shfl_xor_sync(0xffffffffu, sum, 4);
    if (row < rows && lane8 == 0) {
      const int64_t h = row % hq, bi = row / hq, b = bi / sq, i = bi % sq;
      delta[(b * hq + h) * sq + i] = sum;
    }
  }
}

// Row r = (b, i, h) of dq = dq_accum rounded to the input dtype, by one warp (d a multiple of 8, dq_accum and dq
// 16-byte aligned), four columns a lane at a time; whether some value of it is NaN or infinite.
template <typename Element>
CUTE_DEVICE bool convert_dq_row(const float* acc, Element* dq, int64_t r, int d, int lane) {
  bool bad = false;
  CUTLASS_PRAGMA_UNROLL
  for (int t = 0; t < 2; ++t) {  // d <= 256
    const int c = 4 * lane + 128 * t;
    if (c >= d) break;
    const float4 v = *reinterpret_cast<const float4*>(acc + r * d + c);
    bad |= !isfinite(v.x) || !isfinite(v.y) || !isfinite(v.z) || !isfinite(v.w);
    cutlass::Array<Element, 4> o;
    o[0] = Element(v.x);
    o[1] = Element(v.y);
    o[2] = Element(v.z);
    o[3] = Element(v.w);
    *reinterpret_cast<cutlass::Array<Element, 4>*>(dq + r * d + c) = o;
  }
  return __any_sync(0xffffffffu, bad);
}

// Row r of dq, which came out NaN or infinite, computed again, exactly, by the calling warp (common/exact.cuh); r
// back (see convert_dq_rows).
template <typename Element, bool CAUSAL>
__device__ __noinline__ int64_t convert_dq_exact(JaMhaProblem const& pr, mha_gpu::ExactBwd<Element> const& in,
                                                 Element* dq, int64_t r) {
  __syncwarp();  // the warp's stores of the row come first
  const int h = int(r % pr.heads_q), i = int((r / pr.heads_q) % pr.seq_q), b = int(r / (pr.heads_q * pr.seq_q));
  mha_gpu::exact_dq_row(pr, in, dq, b, h, i, sm90_row<CAUSAL>(pr, b, i));
  return r;
}

// After a block's last tile: its warpgroup's last dQ reduce-add has left shared memory and, deterministic, the
// semaphore of the tile it added to is released.
CUTE_DEVICE void bwd_drain_dq(bool wg_leader, int32_t* pending) {
  if (wg_leader) {
    tma_store_wait<0>();
    if (pending) bwd_sync_release(pending);
  }
}

// dq = dq_accum rounded to the input dtype, one warp a row (b, i, h). A row that came out NaN or infinite (a K,
// V or dO value hidden from it can put 0 x NaN into dq_accum) is computed again, exactly (convert_dq_exact).
// The row index goes through that call and comes back as its result, so that no value of the loop lives
// across it: one that did kept the loop's state in local memory, which made this memory-bound pass several
// times slower (the perf gate's 1k attention backward, `bench_gpu.py --quick --only attention`). Eight blocks
// a multiprocessor (32 registers): the occupancy of the element-wise conversion it replaced, which this pass
// needs (at 64 registers the backward timed slower there); the rare recomputation spills instead.
template <typename Element, bool CAUSAL>
__global__ void __launch_bounds__(256, 8)
    convert_dq_rows(CUTE_GRID_CONSTANT JaMhaProblem const pr, CUTE_GRID_CONSTANT mha_gpu::ExactBwd<Element> const in,
                    const float* acc, Element* dq) {
  const int64_t rows = pr.batch * pr.seq_q * pr.heads_q;
  for (int64_t r = int64_t(blockIdx.x) * 8 + threadIdx.x / 32; r < rows; r += int64_t(gridDim.x) * 8)
    if (convert_dq_row(acc, dq, r, int(pr.head_dim), int(threadIdx.x % 32)))
      r = convert_dq_exact<Element, CAUSAL>(pr, in, dq, r);
}

// Launches `kernel` (Tr::kThreads threads, Tr::kSmemBytes of shared memory) on one block per
// (BN keys, kv head, batch), with the call's parameters (bwd_args: FEAT kernels take softcap and ALiBi).
template <typename Tr, typename Kernel>
const char* bwd_launch(Kernel kernel, const JaMhaBwdArgs& a, bool feat, cudaStream_t stream, const char* what) {
  const JaMhaProblem& pr = a.p;
  const auto loads = bwd_loads<Tr>(a);
  typename Tr::Params p{bwd_args<typename Tr::Element>(a, feat),
                        loads.tma_q,
                        loads.tma_do,
                        loads.tma_k,
                        loads.tma_v,
                        Tr::DqStage::tma(a.dq_accum, int(pr.seq_q), int(pr.head_dim), int(pr.heads_q), int(pr.batch))};
  const dim3 grid(unsigned((pr.seq_k + Tr::BN - 1) / Tr::BN), unsigned(pr.heads_kv), unsigned(pr.batch));
  p.chunk = causal_chunk(grid.x);  // read only by causal grids (grid_place)
  // deterministic, causal, grouped heads, a (kv head, batch)'s blocks resident at once (the top of this file)
  p.heavy_first = p.sync && pr.mask == kMaskCausal && p.group > 1 && grid.x <= multiprocessors();
  return mha_gpu::launch_with_smem(kernel, grid, Tr::kThreads, Tr::kSmemBytes, stream, p, what);
}

// Whether the Hopper backward of instance head dim D runs call a (besides the device): the forward's rule
// (sm90_applies), 16-byte aligned tensors, the mask's cols, and, deterministic, enough sync words.
template <int D>
bool bwd_sm90_applies(const JaMhaBwdArgs& a) {
  const JaMhaProblem& pr = a.p;
  if (!sm90_applies<D>(pr, kBwdFeatures) || mha_unhandled_feature(a, kBwdFeatures)) return false;
  if (pr.batch * pr.seq_q * pr.heads_q * D >= (int64_t(1) << 31)) return false;
  for (const void* ptr : {a.q, a.k, a.v, a.o, a.dout, static_cast<const void*>(a.dq), static_cast<const void*>(a.dk),
                          static_cast<const void*>(a.dv), static_cast<const void*>(a.dq_accum)})
    if (!mha_gpu::aligned16(ptr)) return false;
  if (pr.mask == kMaskRows && a.cols == nullptr) return false;
  if (a.deterministic) {
    const int64_t words = pr.batch * pr.heads_q * ((pr.seq_q + kBwdTileRows - 1) / kBwdTileRows);
    if (a.sync == nullptr || a.sync_words < words) return false;
  }
  return true;
}

// The whole backward around the main kernel (launch(): preprocess; deterministic, the semaphores;
// the main kernel; the dQ conversion).
template <typename T, int BN, bool CAUSAL, typename Main>
const char* bwd_run(const JaMhaBwdArgs& a, cudaStream_t s, Main launch_main) {
  const JaMhaProblem& pr = a.p;
  const int64_t q_rows = pr.batch * pr.seq_q * pr.heads_q;
  const int64_t max_blocks = int64_t(1) << 20;
  {
    const int64_t blocks = std::min<int64_t>((q_rows + 31) / 32, max_blocks);
    bwd_preprocess<T><<<unsigned(blocks), 256, 0, s>>>(static_cast<const T*>(a.o), static_cast<const T*>(a.dout),
                                                       a.delta, a.dq_accum, q_rows, int(pr.seq_q), int(pr.heads_q),
                                                       int(pr.head_dim), int(pr.head_dim_v));
    if (const char* e = mha_gpu::launch_status("mha_bwd (preprocess)")) return e;
  }
  if (a.deterministic) {
    const int m_tiles = int((pr.seq_q + kBwdTileRows - 1) / kBwdTileRows);
    const int64_t words = pr.batch * pr.heads_q * m_tiles;
    bwd_init_sync<kBwdTileRows, BN, CAUSAL>
        <<<unsigned((words + 255) / 256), 256, 0, s>>>(pr, a.cols, a.cols_batch_stride, a.sync, m_tiles);
    if (const char* e = mha_gpu::launch_status("mha_bwd (deterministic order)")) return e;
  }
  if (const char* e = launch_main()) return e;
  {
    using E = typename CutlassType<T>::type;
    const int64_t blocks = std::min<int64_t>((q_rows + 7) / 8, max_blocks);
    convert_dq_rows<E, CAUSAL>
        <<<unsigned(blocks), 256, 0, s>>>(pr, mha_gpu::exact_bwd<E>(a), a.dq_accum, static_cast<E*>(a.dq));
    if (const char* e = mha_gpu::launch_status("mha_bwd (convert dQ)")) return e;
  }
  return nullptr;
}

}  // namespace mha_sm90
}  // namespace ja
