// The Hopper backward's epilogue: dK and dV from a block's accumulators to memory (a key whose gradients came
// out NaN or infinite computed again, exactly), and the end of its dQ reduce-adds.
#pragma once
#include "mha/sm90/bwd_mainloop.cuh"

namespace ja {
namespace mha_sm90 {

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

// After a block's last tile: its warpgroup's last dQ reduce-add has left shared memory and, deterministic, the
// semaphore of the tile it added to is released.
CUTE_DEVICE void bwd_drain_dq(bool wg_leader, int32_t* pending) {
  if (wg_leader) {
    tma_store_wait<0>();
    if (pending) bwd_sync_release(pending);
  }
}

}  // namespace mha_sm90
}  // namespace ja
