// The Hopper (sm_90a) attention backward, what its two kernels share (sm90/bwd_kernel.cuh: head dims up to 128;
// sm90/bwd_kernel_d256.cuh: head dims 192 and 256), in FlashAttention-3's roles: this file, the arguments, the
// tiles and their TMA loads, and the dQ reduce-add; sm90/bwd_order.cuh, the deterministic order of the dQ
// updates; sm90/bwd_mainloop.cuh, the block's work, its loads, P and dS; sm90/bwd_epilogue.cuh, the dK/dV store;
// sm90/bwd_passes.cuh, the preprocess and the dQ conversion around the main kernel, and its launch.
//
// A kernel's traits derive from BwdLayouts (tile sizes, the Q/dO and K/V layouts and loads) and
// add TiledMmas, kSlots (per-row slots), kThreads, SharedStorage (deriving from BwdSmem,
// sm90/bwd_mainloop.cuh) and Params (BwdParams: BwdArgs with the TMA loads and the dQ reduce-add).
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
#pragma once
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

}  // namespace mha_sm90
}  // namespace ja
