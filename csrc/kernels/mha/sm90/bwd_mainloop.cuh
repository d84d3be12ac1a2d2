// The Hopper backward's main loop parts both kernels share: shared memory, a block's work (its key block and
// the query tiles that see it), the loads of K/V, of the Q/dO tiles and of the rows' statistics and mask bounds,
// and P and dS with the score's terms (sm90/bwd_args.cuh says how).
#pragma once
#include "mha/sm90/bwd_order.cuh"

namespace ja {
namespace mha_sm90 {

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

}  // namespace mha_sm90
}  // namespace ja
