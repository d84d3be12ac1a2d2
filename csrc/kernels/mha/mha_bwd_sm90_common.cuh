// What the two Hopper (sm_90a) backward kernels share (mha_bwd_sm90.cuh: head dims 64 and 128;
// mha_bwd_sm90_d256.cuh: head dim 256): the kernel arguments, the work of a block, the TMA loads
// of K/V and of the Q/dO tiles, the lse/delta rows, the dK/dV store and the launch.
//
// A kernel's traits derive from BwdLayouts (tile sizes, the Q/dO and K/V layouts and loads) and
// add TiledMmas, kSlots (lse/delta slots), kThreads, SharedStorage (deriving from BwdSmem) and
// Params (deriving from BwdArgs, with tma_q, tma_do, tma_k, tma_v).
#pragma once
#include "mha/mha_bwd_gpu.cuh"
#include "mha/mha_fwd_sm90.cuh"

namespace ja {
namespace mha_sm90 {

using BwdShape = Shape<int32_t, int32_t, int32_t, int32_t>;  // (seq, head_dim, heads, batch)
using BwdStride = Stride<int64_t, _1, int64_t, int64_t>;

// The kernel arguments besides the TMA descriptors (the base of each kernel's Params).
template <typename Element>
struct BwdArgs {
  BwdShape shape_q, shape_k;
  const float* lse;
  const float* delta;
  float* dq_accum;
  Element* dk;
  Element* dv;
  int32_t heads_q, heads_kv, group;
  float scale, scale_log2;
  int64_t chunk;  // causal: (head, batch) pairs per chunk of the block order (causal_chunk)
};

template <typename Element, int D>
BwdArgs<Element> bwd_args(const JaMhaBwdArgs& a) {
  const int hq = int(a.p.heads_q), hkv = int(a.p.heads_kv), bt = int(a.p.batch);
  return {make_shape(int(a.p.seq_q), int(D), hq, bt),
          make_shape(int(a.p.seq_k), int(D), hkv, bt),
          a.lse,
          a.delta,
          a.dq_accum,
          static_cast<Element*>(a.dk),
          static_cast<Element*>(a.dv),
          hq,
          hkv,
          hq / hkv,
          a.p.scale,
          a.p.scale * ja_log2e,
          0};  // chunk: bwd_launch sets it from the grid
}

// A TMA load of ROWS x D tiles of a [batch, seq, heads, D] tensor into SmemLayout.
template <typename Element, typename SmemLayout, int ROWS, int D>
auto bwd_tma_load(const void* ptr, int seq, int heads, int batch) {
  return make_tma_copy(SM90_TMA_LOAD{}, bshd_tensor<Element, D>(ptr, seq, heads, batch), SmemLayout{},
                       Shape<Int<ROWS>, Int<D>>{}, _1{});
}
// The TMA loads of a Q/dO tile (BM x D, into one stage) and of the block's K/V (BN x D).
template <typename Tr>
auto bwd_tma_q(const void* ptr, int seq, int heads, int batch) {
  using SmemQ = decltype(take<0, 2>(typename Tr::SmemLayoutQ{}));
  return bwd_tma_load<typename Tr::Element, SmemQ, Tr::BM, Tr::kHeadDim>(ptr, seq, heads, batch);
}
template <typename Tr>
auto bwd_tma_k(const void* ptr, int seq, int heads, int batch) {
  return bwd_tma_load<typename Tr::Element, typename Tr::SmemLayoutK, Tr::BN, Tr::kHeadDim>(ptr, seq, heads, batch);
}

// Tile sizes and what the kernels share of their shared-memory layouts: Q and dO (BM x D, kStages
// stages) and K, V (BN x D) in 128-byte swizzled rows, with the transposed views (D x BM, D x BN)
// the dK/dV and dQ products read, and their TMA loads.
template <typename Element_, int D, int BM_, int BN_, int kStages_>
struct BwdLayouts {
  using Element = Element_;
  static constexpr int kHeadDim = D;
  static constexpr int BM = BM_;  // query rows per tile
  static constexpr int BN = BN_;  // keys per block
  static constexpr int kStages = kStages_;
  using SmemLayoutQ =
      decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{}, Shape<Int<BM>, Int<D>, Int<kStages>>{}));
  using SmemLayoutQt = decltype(composition(
      SmemLayoutQ{}, make_layout(Shape<Int<D>, Int<BM>, Int<kStages>>{}, Stride<Int<BM>, _1, Int<BM * D>>{})));
  using SmemLayoutK = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{}, Shape<Int<BN>, Int<D>>{}));
  using SmemLayoutKt =
      decltype(composition(SmemLayoutK{}, make_layout(Shape<Int<D>, Int<BN>>{}, Stride<Int<BN>, _1>{})));
  using TmaQ = decltype(bwd_tma_load<Element, decltype(take<0, 2>(SmemLayoutQ{})), BM, D>(nullptr, 0, 0, 0));
  using TmaK = decltype(bwd_tma_load<Element, SmemLayoutK, BN, D>(nullptr, 0, 0, 0));
  static constexpr uint32_t kBytesQ = uint32_t(BM * D * sizeof(Element));
  static constexpr uint32_t kBytesK = uint32_t(BN * D * sizeof(Element));
};

// A dQ staging tile (float32, BM x COLS) in shared memory, 128-byte swizzled: warpgroup w's
// COLS / 2 columns are the contiguous half w, which one TMA reduce-add (Tma, made by tma()) adds to
// a BM x COLS / 2 tile of dq_accum ([batch, seq, heads, D] float32).
template <int BM, int COLS, int D>
struct BwdDqStage {
  static constexpr int kHalf = COLS / 2;
  using Layout = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<float>{}, Shape<Int<BM>, Int<COLS>>{}));
  using LayoutHalf = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<float>{}, Shape<Int<BM>, Int<kHalf>>{}));
  static auto tma(float* dq_accum, int seq, int heads, int batch) {
    return make_tma_copy(SM90_TMA_REDUCE_ADD{}, bshd_tensor<float, D>(dq_accum, seq, heads, batch), LayoutHalf{},
                         Shape<Int<BM>, Int<kHalf>>{}, _1{});
  }
  using Tma = decltype(tma(nullptr, 0, 0, 0));
};

// Issued by warpgroup wg's leader once its half of the staging tile sdQ is written and fenced:
// that half added to dq_accum's tile (m, col_tile) of BM x COLS / 2 (query head h, batch b) by one
// TMA reduce-add (rows past seq_q are clipped); tma_store_wait before the half is rewritten.
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

// The shared memory both kernels use (a kernel's SharedStorage derives from it and adds its own).
template <typename L, int kSlots>
struct BwdSmem {
  using Element = typename L::Element;
  array_aligned<Element, cosize_v<typename L::SmemLayoutQ>, 1024> q;
  array_aligned<Element, cosize_v<typename L::SmemLayoutQ>, 1024> dO;
  array_aligned<Element, cosize_v<typename L::SmemLayoutK>, 1024> k;
  array_aligned<Element, cosize_v<typename L::SmemLayoutK>, 1024> v;
  float lse[kSlots][L::BM];  // lse * log2(e) of the query tile, +inf past seq_q
  float delta[kSlots][L::BM];
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
                    make_tensor(make_smem_ptr(ss.dO.data()), typename Tr::SmemLayoutQ{}),
                    make_tensor(make_smem_ptr(ss.q.data()), typename Tr::SmemLayoutQt{}),
                    make_tensor(make_smem_ptr(ss.dO.data()), typename Tr::SmemLayoutQt{}),
                    make_tensor(make_smem_ptr(ss.k.data()), typename Tr::SmemLayoutK{}),
                    make_tensor(make_smem_ptr(ss.v.data()), typename Tr::SmemLayoutK{}),
                    make_tensor(make_smem_ptr(ss.k.data()), typename Tr::SmemLayoutKt{}));
}

// What a block works on: keys [kv0, kv0 + nk) of kv head hk in batch b, and n_iter iterations, one
// a (query head, query tile): iteration it is query head head(it), query tile tile(it).
struct BwdWork {
  int n_block, hk, b, sq, sk, kv0, nk, group, m_begin, q_tiles, n_iter;
  CUTE_DEVICE int head(int it) const { return hk * group + it / q_tiles; }
  CUTE_DEVICE int tile(int it) const { return m_begin + it % q_tiles; }
};

template <int BM, int BN, bool CAUSAL, typename Element>
CUTE_DEVICE BwdWork bwd_work(BwdArgs<Element> const& p) {
  BwdWork w;
  // Causal: each kv head's first key blocks, seen by the most query tiles, start first (in the model's
  // train step, 32 query tiles against the last one's 2), a chunk of kv heads and batches at a time
  // (mha_gpu::grid_place, causal_chunk).
  const mha_gpu::GridPlace at = mha_gpu::grid_place(CAUSAL, false, p.chunk);
  w.n_block = int(at.tile), w.hk = int(at.head), w.b = int(at.batch);
  w.sq = get<0>(p.shape_q), w.sk = get<0>(p.shape_k);
  w.kv0 = w.n_block * BN;
  w.nk = min(BN, w.sk - w.kv0);
  w.group = p.group;
  // Query tiles per head: causal blocks start at the tile holding the first query that sees key kv0.
  w.m_begin = CAUSAL ? int(mha_gpu::first_query_for_key(w.kv0, w.sq, w.sk) / BM) : 0;
  const int m_tiles = (w.sq + BM - 1) / BM;
  w.q_tiles = m_tiles > w.m_begin ? m_tiles - w.m_begin : 0;
  w.n_iter = p.group * w.q_tiles;
  return w;
}

// Issued by thread 0: Q and dO of iteration `it` into stage it % kStages (completes barrier_q).
template <typename Tr>
CUTE_DEVICE void bwd_load_q(typename Tr::Params const& p, typename Tr::SharedStorage& ss, BwdWork const& w, int it) {
  using TileQ = Shape<Int<Tr::BM>, Int<Tr::kHeadDim>>;
  const int h = w.head(it), m = w.tile(it), s = it % Tr::kStages;
  Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename Tr::SmemLayoutQ{})(_, _, s);
  Tensor sdO = make_tensor(make_smem_ptr(ss.dO.data()), typename Tr::SmemLayoutQ{})(_, _, s);
  Tensor gQ = local_tile(p.tma_q.get_tma_tensor(p.shape_q)(_, _, h, w.b), TileQ{}, make_coord(m, _0{}));
  Tensor gdO = local_tile(p.tma_do.get_tma_tensor(p.shape_q)(_, _, h, w.b), TileQ{}, make_coord(m, _0{}));
  auto [tQg, tQs] = tma_partition(p.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
  auto [tGg, tGs] = tma_partition(p.tma_do, _0{}, Layout<_1>{}, group_modes<0, 2>(sdO), group_modes<0, 2>(gdO));
  auto& bar = reinterpret_cast<cutlass::arch::ClusterTransactionBarrier::ValueType&>(ss.barrier_q[s]);
  ss.barrier_q[s].arrive_and_expect_tx(2 * Tr::kBytesQ);
  copy(p.tma_q.with(bar, 0), tQg, tQs);
  copy(p.tma_do.with(bar, 0), tGg, tGs);
}

// Threads [0, 2 BM): lse (log2 domain; +inf past seq_q) and delta of iteration `it` into slot
// it % kSlots.
template <typename Tr>
CUTE_DEVICE void bwd_load_rows(typename Tr::Params const& p, typename Tr::SharedStorage& ss, BwdWork const& w,
                               int it) {
  constexpr int BM = Tr::BM;
  const int tid = threadIdx.x;
  if (tid >= 2 * BM) return;
  const int h = w.head(it), q = w.tile(it) * BM + tid % BM;
  const int64_t off = (int64_t(w.b) * p.heads_q + h) * w.sq + q;
  if (tid < BM) ss.lse[it % Tr::kSlots][tid] = q < w.sq ? p.lse[off] * ja_log2e : INFINITY;
  else ss.delta[it % Tr::kSlots][tid - BM] = q < w.sq ? p.delta[off] : 0.0f;
}

// The prologue: the lse/delta rows of iterations 0 and 1, the barriers, then (thread 0) K and V by
// TMA (barrier_kv) and the Q/dO tiles of iterations 0 and 1. The rows are visible after the
// caller's next block barrier.
template <typename Tr>
CUTE_DEVICE void bwd_start(typename Tr::Params const& p, typename Tr::SharedStorage& ss, BwdWork const& w) {
  using TileK = Shape<Int<Tr::BN>, Int<Tr::kHeadDim>>;
  if (w.n_iter > 0) bwd_load_rows<Tr>(p, ss, w, 0);
  if (w.n_iter > 1) bwd_load_rows<Tr>(p, ss, w, 1);
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
    Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Tr::SmemLayoutK{});
    Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename Tr::SmemLayoutK{});
    Tensor gK = local_tile(p.tma_k.get_tma_tensor(p.shape_k)(_, _, w.hk, w.b), TileK{}, make_coord(w.n_block, _0{}));
    Tensor gV = local_tile(p.tma_v.get_tma_tensor(p.shape_k)(_, _, w.hk, w.b), TileK{}, make_coord(w.n_block, _0{}));
    auto [tKg, tKs] = tma_partition(p.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
    auto [tVg, tVs] = tma_partition(p.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));
    auto& bar = reinterpret_cast<cutlass::arch::ClusterTransactionBarrier::ValueType&>(ss.barrier_kv);
    ss.barrier_kv.arrive_and_expect_tx(2 * Tr::kBytesK);
    copy(p.tma_k.with(bar, 0), tKg, tKs);
    copy(p.tma_v.with(bar, 0), tVg, tVs);
    if (w.n_iter > 0) bwd_load_q<Tr>(p, ss, w, 0);
    if (w.n_iter > 1) bwd_load_q<Tr>(p, ss, w, 1);
  }
}

// In place on the (row, col) views of the S and dP accumulators: P = exp2(S * s2 - lse), 0 where
// masked (key >= nk or, causal, key - query > diag), then, after `wait` (dP has landed),
// dS = P (dP - delta). key(r, c) and query(r, c) give an entry's tile coordinates, lse(r, c) and
// delta(r, c) its query row's statistics (lse in the log2 domain, +inf past seq_q: P = 0).
template <bool CAUSAL, typename TS, typename Key, typename Query, typename Lse, typename Delta, typename Wait>
CUTE_DEVICE void bwd_p_ds(TS s, TS dp, Key key, Query query, Lse lse, Delta delta, float s2, int nk, int diag,
                          Wait wait) {
  constexpr int kRows = decltype(size<0>(s))::value, kCols = decltype(size<1>(s))::value;
  CUTLASS_PRAGMA_UNROLL
  for (int r = 0; r < kRows; ++r)
    CUTLASS_PRAGMA_UNROLL
    for (int c = 0; c < kCols; ++c) {
      const int kr = key(r, c), qr = query(r, c);
      float pv = ja_exp2_approx(s(r, c) * s2 - lse(r, c));
      if (kr >= nk || (CAUSAL && kr - qr > diag)) pv = 0.0f;
      s(r, c) = pv;
    }
  wait();
  CUTLASS_PRAGMA_UNROLL
  for (int r = 0; r < kRows; ++r)
    CUTLASS_PRAGMA_UNROLL
    for (int c = 0; c < kCols; ++c) dp(r, c) = s(r, c) * (dp(r, c) - delta(r, c));
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

// Epilogue: dK * scale and dV (accumulators of the dK/dV MMA over the BN x D tile) rounded to the
// input dtype, keys < seq_k.
template <typename Tr, typename ThrMma, typename Acc>
CUTE_DEVICE void bwd_store_dkdv(typename Tr::Params const& p, BwdWork const& w, ThrMma const& thr_dkv,
                                Acc const& dk_acc, Acc const& dv_acc) {
  using Element = typename Tr::Element;
  constexpr int D = Tr::kHeadDim;
  Tensor cK = make_identity_tensor(Shape<Int<Tr::BN>, Int<D>>{});
  Tensor tdKcdK = thr_dkv.partition_C(cK);
  const int64_t kv_stride = int64_t(p.heads_kv) * D;
  Element* dk = p.dk + ((int64_t(w.b) * w.sk + w.kv0) * p.heads_kv + w.hk) * D;
  Element* dv = p.dv + ((int64_t(w.b) * w.sk + w.kv0) * p.heads_kv + w.hk) * D;
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < decltype(size(dk_acc))::value; i += 2) {  // elements i, i + 1: adjacent columns
    const int kr = int(get<0>(tdKcdK(i))), col = int(get<1>(tdKcdK(i)));
    if (kr >= w.nk) continue;
    cutlass::Array<Element, 2> vk, vv;
    vk[0] = Element(dk_acc(i) * p.scale);
    vk[1] = Element(dk_acc(i + 1) * p.scale);
    vv[0] = Element(dv_acc(i));
    vv[1] = Element(dv_acc(i + 1));
    *reinterpret_cast<cutlass::Array<Element, 2>*>(dk + kr * kv_stride + col) = vk;
    *reinterpret_cast<cutlass::Array<Element, 2>*>(dv + kr * kv_stride + col) = vv;
  }
}

// Launches `kernel` (Tr::kThreads threads, Tr::kSmemBytes of shared memory) on one block per
// (BN keys, kv head, batch).
template <typename Tr, typename Kernel>
const char* bwd_launch(Kernel kernel, typename Tr::Params p, const JaMhaBwdArgs& a, cudaStream_t stream,
                       const char* what) {
  const dim3 grid(unsigned((a.p.seq_k + Tr::BN - 1) / Tr::BN), unsigned(a.p.heads_kv), unsigned(a.p.batch));
  p.chunk = causal_chunk(grid.x);  // read only by causal grids (grid_place)
  return mha_gpu::launch_with_smem(kernel, grid, Tr::kThreads, Tr::kSmemBytes, stream, p, what);
}

}  // namespace mha_sm90
}  // namespace ja
