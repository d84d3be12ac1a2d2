// Flash-attention backward for Hopper (sm_90a) at head_dim 256: warpgroup MMA, Q/dO tiles by TMA.
//
// The head_dim 256 form of mha_bwd_sm90.cuh's middle kernel (dK, dV and the float32 dQ
// accumulation); the preprocess and the dQ conversion are the same kernels. The head_dim <= 128
// kernel keeps 64 keys x D of dK and of dV per warpgroup in registers: at D = 256 that is 256
// registers a thread, so here the two warpgroups share one tile of 64 keys and split its head
// dim instead (as FlashAttention-3 does for hdim 256):
//
// One block of two warpgroups per (64 keys, kv head, batch); warpgroup w keeps dK and dV of the
// block's keys for head-dim columns [128 w, 128 w + 128) (64 x 128 each, float32: 128 registers
// a thread) for the whole block. K and V are loaded once by TMA; the block walks every query head
// of its GQA group and every 64-row query tile that can see its keys, Q and dO by TMA through two
// shared-memory stages (tile i + 1 loads while tile i is computed), lse and delta through three
// slots. Per query tile (queries are the M dimension of the score products, as in
// FlashAttention-3):
//   S  = Q K^T, dP = dO V^T            wgmma from shared memory; warpgroup w: keys [32 w, 32 w + 32)
//   P  = exp2(S * scale * log2 e - lse * log2 e), masked to 0
//   dS = P * (dP - delta)
//   P, dS rounded to the input dtype, to shared memory (stmatrix): every warpgroup needs all keys
//   dV += P^T dO, dK += dS^T Q         wgmma from shared memory; warpgroup w: its 128 columns
//   dQ  = dS K                          four slices of 64 columns (32 per warpgroup), issued between
//                                       dV and dK; each slice times scale goes through 8 KB of
//                                       shared memory per warpgroup and is added to dq_accum by
//                                       one TMA reduce-add (whole 128-byte rows) while the next
//                                       products run
// Two block barriers a tile: one after S and dP are issued (every warpgroup is done with the
// previous tile: its P/dS buffer, Q/dO stage and lse/delta slot may be refilled), one after P and
// dS are stored. P and dS have one buffer each, which pays for the dQ staging.
//
// Why the reduce-add through shared memory: dQ is 64 KB of float32 a tile, and at this head dim
// the L2 cache's float reductions, not the tensor cores, bound the kernel. Vector atomics straight
// from the wgmma accumulators (red.global.add.v2.f32: each warp instruction writes 32 bytes of 8
// rows) measured 2.3 TB/s of reductions into an L2-resident array; whole-row reductions (TMA,
// bulk copies, or 512-byte coalesced vector atomics) 3.8 TB/s. At b4 s2048 (16/8 heads, causal)
// the kernel took 1.21 ms with those atomics, 1.09 ms with this reduce-add, and 0.63 ms with no dQ
// reduction at all; coalesced atomics read back from the staging tile took 1.17 ms. What is left
// is the reduce-add's latency: one 8 KB staging tile per warpgroup lets one slice be in flight.
//
// P and dS are rounded to the input dtype before their products (as FlashAttention and the
// other backward kernels do); every product accumulates in float32.
//
// Conventions are those of the other backward kernels: bottom-right causal alignment (query i
// sees key j iff j <= i + seq_k - seq_q), query tiles that see none of the block's keys skipped,
// rows with no visible key (lse = +inf) contribute 0. Keys and query rows past the ends are
// zero-filled by TMA and masked; the reduce-add clips rows past seq_q.
#pragma once
#include "mha/mha_bwd_sm90_common.cuh"

namespace ja {
namespace mha_sm90 {

// 64 query rows a tile, 64 keys a block (shared by the 2 warpgroups), 2 Q/dO stages.
template <typename Element_>
struct BwdTraitsD256 : BwdLayouts<Element_, 256, 64, 64, 2> {
  using Layouts = BwdLayouts<Element_, 256, 64, 64, 2>;
  using Element = Element_;
  static constexpr int D = 256;
  static constexpr int BM = Layouts::BM, BN = Layouts::BN;
  static constexpr int kSlots = 3;   // lse/delta slots (written one tile earlier than Q/dO land)
  static constexpr int kThreads = 256;
  static constexpr int DH = D / 2;   // dK/dV columns per warpgroup
  static constexpr int kDqSlices = 4;
  static constexpr int DQS = D / kDqSlices;  // dQ columns per slice (half per warpgroup: 32 floats, 128 bytes)

  // S, dP: (queries, keys); warpgroup w computes keys [32 w, 32 w + 32).
  using TiledMmaSdP = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<Int<BM>, Int<BN / 2>, Int<D>>>(),
      Layout<Shape<_1, _2, _1>>{}));
  // dV = P^T dO, dK = dS^T Q: (keys, head dim); A = P^T / dS^T (keys contiguous), B = dO^T / Q^T
  // (head dim contiguous); warpgroup w holds columns [DH w, DH w + DH).
  using TiledMmadKV = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<Int<BN>, Int<DH>, Int<BM>>, GMMA::Major::MN,
                           GMMA::Major::MN>(),
      Layout<Shape<_1, _2, _1>>{}));
  // dQ = dS K, one slice of DQS columns: A = dS (keys contiguous), B = K^T (head dim contiguous).
  using TiledMmadQ = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<Int<BM>, Int<DQS / 2>, Int<BN>>, GMMA::Major::K,
                           GMMA::Major::MN>(),
      Layout<Shape<_1, _2, _1>>{}));

  // P and dS: (queries, keys), keys contiguous (one 128-byte swizzle row), one buffer; the
  // transposed view (keys, queries) is the A operand of dV and dK.
  using SmemLayoutPdS = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{}, Shape<Int<BM>, Int<BN>>{}));
  using SmemLayoutPdSt =
      decltype(composition(SmemLayoutPdS{}, make_layout(Shape<Int<BN>, Int<BM>>{}, Stride<Int<BM>, _1>{})));
  // One dQ slice * scale (float32, (queries, DQS columns)): warpgroup w's 32 columns (128 bytes a row)
  // are the contiguous half w, added to dq_accum by one TMA reduce-add.
  using DqStage = BwdDqStage<BM, DQS, D>;
  using SmemLayoutdQ = typename DqStage::Layout;
  using TmadQ = typename DqStage::Tma;

  struct SharedStorage : BwdSmem<Layouts, kSlots> {
    array_aligned<Element, cosize_v<SmemLayoutPdS>, 1024> p;
    array_aligned<Element, cosize_v<SmemLayoutPdS>, 1024> ds;
    array_aligned<float, cosize_v<SmemLayoutdQ>, 1024> dq;
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= 227 * 1024, "MHA backward (sm90, head_dim 256) tiles exceed shared memory");

  struct Params : BwdArgs<Element> {
    typename Layouts::TmaQ tma_q, tma_do;
    typename Layouts::TmaK tma_k, tma_v;
    TmadQ tma_dq;
  };
};

// (MMA, N, K) operand fragment -> (MMA, 1, K): its J-th block along N.
template <int J, typename TB>
CUTE_DEVICE auto n_block_of(TB const& b) {
  constexpr int N = decltype(size<1>(b))::value;
  return logical_divide(b, Shape<Underscore, Int<N>>{})(_, make_coord(Int<J>{}, _), _);
}

template <typename Tr, bool CAUSAL>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    mha_bwd_sm90_d256_kernel(CUTE_GRID_CONSTANT typename Tr::Params const p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Element = typename Tr::Element;
  constexpr int BM = Tr::BM, BN = Tr::BN, D = Tr::kHeadDim, kStages = Tr::kStages, kSlots = Tr::kSlots;
  constexpr int DQS = Tr::DQS;
  using TileK = Shape<Int<BN>, Int<D>>;
  using TiledQ = Shape<Int<BM>, Int<DQS>>;

  auto& ss = bwd_smem<Tr>();
  const BwdWork w = bwd_work<BM, BN, CAUSAL>(p);
  const int b = w.b, sq = w.sq, sk = w.sk, kv0 = w.kv0, nk = w.nk, n_iter = w.n_iter;
  const int tid = threadIdx.x;
  const int wg = tid / 128;
  const bool wg_leader = tid % 128 == 0;  // issues its warpgroup's dQ reduce-adds

  auto [sQ, sdO, sQt, sdOt, sK, sV, sKt] = bwd_smem_tensors<Tr>(ss);
  Tensor sP = make_tensor(make_smem_ptr(ss.p.data()), typename Tr::SmemLayoutPdS{});
  Tensor sPt = make_tensor(make_smem_ptr(ss.p.data()), typename Tr::SmemLayoutPdSt{});
  Tensor sdS = make_tensor(make_smem_ptr(ss.ds.data()), typename Tr::SmemLayoutPdS{});
  Tensor sdSt = make_tensor(make_smem_ptr(ss.ds.data()), typename Tr::SmemLayoutPdSt{});
  Tensor sdQ = make_tensor(make_smem_ptr(ss.dq.data()), typename Tr::SmemLayoutdQ{});

  if (tid == 0) cute::prefetch_tma_descriptor(p.tma_dq.get_tma_descriptor());
  bwd_start<Tr>(p, ss, w);  // K, V and the Q/dO tiles of iterations 0 and 1

  typename Tr::TiledMmaSdP mma_sdp;
  typename Tr::TiledMmadKV mma_dkv;
  typename Tr::TiledMmadQ mma_dq;
  auto thr_sdp = mma_sdp.get_thread_slice(tid);
  auto thr_dkv = mma_dkv.get_thread_slice(tid);
  auto thr_dq = mma_dq.get_thread_slice(tid);
  auto r2s = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_sdp);
  auto thr_r2s = r2s.get_thread_slice(tid);

  Tensor tSrQ = thr_sdp.partition_fragment_A(sQ);    // (MMA, 1, K, stage)
  Tensor tSrdO = thr_sdp.partition_fragment_A(sdO);
  Tensor tSrK = thr_sdp.partition_fragment_B(sK);    // (MMA, 1, K)
  Tensor tSrV = thr_sdp.partition_fragment_B(sV);
  Tensor tdVrPt = thr_dkv.partition_fragment_A(sPt);    // (MMA, 1, K)
  Tensor tdKrdSt = thr_dkv.partition_fragment_A(sdSt);
  Tensor tdVrdOt = thr_dkv.partition_fragment_B(sdOt);  // (MMA, 1, K, stage)
  Tensor tdKrQt = thr_dkv.partition_fragment_B(sQt);
  Tensor tdQrdS = thr_dq.partition_fragment_A(sdS);     // (MMA, 1, K)
  Tensor tdQrKt = thr_dq.partition_fragment_B(sKt);     // (MMA, slices, K)
  Tensor tPsP = thr_r2s.partition_D(sP);                // (CPY, CPY_M, CPY_N)
  Tensor tdSsdS = thr_r2s.partition_D(sdS);
  Tensor tdQsdQ = thr_dq.partition_C(sdQ);              // this thread's part of a dQ slice

  Tensor tdVacc = partition_fragment_C(mma_dkv, TileK{});
  Tensor tdKacc = partition_fragment_C(mma_dkv, TileK{});
  clear(tdVacc);
  clear(tdKacc);

  Tensor cS = make_identity_tensor(Shape<Int<BM>, Int<BN>>{});  // (query, key)
  Tensor tScS = thr_sdp.partition_C(cS);
  Tensor tScS_rc = make_tensor(tScS.data(), acc_rowcol(tScS.layout()));
  constexpr int kRows = decltype(size<0>(tScS_rc))::value;  // queries of this thread
  const float s2 = p.scale_log2;

  // dQ slice j of (query head h, query tile m) * scale through this warpgroup's half of the staging
  // tile, to dq_accum by one TMA reduce-add of its leader (the previous slice has left shared
  // memory first).
  auto add_dq = [&](auto const& acc, int h, int m, int j, float scale) {
    if (wg_leader) tma_store_wait<0>();
    cutlass::arch::NamedBarrier::sync(128, 1 + wg);
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < decltype(size(acc))::value; i += 2) {  // elements i, i + 1: adjacent columns
      // st.shared, not a generic store: the generic one put a full memory barrier before the proxy fence
      asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(cute::cast_smem_ptr_to_uint(&tdQsdQ(i))),
                   "f"(acc(i) * scale), "f"(acc(i + 1) * scale));
    }
    cutlass::arch::fence_view_async_shared();
    cutlass::arch::NamedBarrier::sync(128, 1 + wg);
    if (wg_leader) bwd_reduce_dq<typename Tr::DqStage>(p.tma_dq, p.shape_q, sdQ, h, b, m, 2 * j + wg, wg);
  };
  Tensor acc3 = partition_fragment_C(mma_dq, TiledQ{});
  // The last slice * scale, sent during the next tile's S and dP: a copy, so that the compiler does not
  // make its read wait for those products (as it must for registers a wgmma writes).
  Tensor dq3 = make_tensor<float>(acc3.layout());

  __syncthreads();  // lse, delta of the first two tiles
  ss.barrier_kv.wait(0);
  CUTLASS_PRAGMA_NO_UNROLL
  for (int it = 0; it < n_iter; ++it) {
    const int h = w.head(it), m = w.tile(it), q0 = m * BM;
    const int st = it % kStages;
    const float* lse2 = ss.lse[it % kSlots];
    const float* dlt = ss.delta[it % kSlots];
    ss.barrier_q[st].wait((it / kStages) & 1);

    Tensor tSrS = partition_fragment_C(mma_sdp, Shape<Int<BM>, Int<BN>>{});
    Tensor tSrdP = partition_fragment_C(mma_sdp, Shape<Int<BM>, Int<BN>>{});
    gemm<true, -1>(mma_sdp, tSrQ(_, _, _, st), tSrK, tSrS);
    gemm<true, -1>(mma_sdp, tSrdO(_, _, _, st), tSrV, tSrdP);
    float row_lse[kRows], row_delta[kRows];
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const int qr = int(get<0>(tScS_rc(r, 0)));
      row_lse[r] = lse2[qr];
      row_delta[r] = dlt[qr];
    }
    if (it > 0) add_dq(dq3, w.head(it - 1), w.tile(it - 1), 3, 1.0f);
    // Every warpgroup is done with iteration it - 1 (its products have landed): P and dS may be
    // overwritten, and its Q/dO stage ((it + 1) % 2) and lse/delta slot ((it + 2) % 3) refilled.
    __syncthreads();
    if (it >= 1 && it + 1 < n_iter && tid == 0) bwd_load_q<Tr>(p, ss, w, it + 1);  // 0 and 1 came with K, V
    if (it + 2 < n_iter) bwd_load_rows<Tr>(p, ss, w, it + 2);  // read at iteration it + 2, after later barriers
    warpgroup_wait<1>();
    Tensor s = make_tensor(tSrS.data(), acc_rowcol(tSrS.layout()));
    Tensor dp = make_tensor(tSrdP.data(), acc_rowcol(tSrdP.layout()));
    // Visible iff key < seq_k, query < seq_q (lse), and (causal) key - query <= q0 + sk - sq - kv0.
    bwd_p_ds<CAUSAL>(
        s, dp, [&](int r, int c) { return int(get<1>(tScS_rc(r, c))); },
        [&](int r, int) { return int(get<0>(tScS_rc(r, 0))); }, [&](int r, int) { return row_lse[r]; },
        [&](int r, int) { return row_delta[r]; }, s2, nk, q0 + sk - sq - kv0, [] { warpgroup_wait<0>(); });

    // P and dS rounded to the input dtype, to shared memory by stmatrix.
    {
      Tensor rP = make_tensor<Element>(tSrS.layout());
      Tensor rdS = make_tensor<Element>(tSrdP.layout());
      bwd_round(tSrS, rP);
      bwd_round(tSrdP, rdS);
      copy(r2s, thr_r2s.retile_S(rP), tPsP);
      copy(r2s, thr_r2s.retile_S(rdS), tdSsdS);
    }
    cutlass::arch::fence_view_async_shared();
    __syncthreads();  // P and dS complete

    // Issue order dQ0, dV, dQ1 | dK, dQ2, dQ3: each slice goes out while later products run (slice 3
    // while the next tile's S and dP run), and each waits for the one before it to leave shared
    // memory, which had a large product's time to do so.
    Tensor acc0 = partition_fragment_C(mma_dq, TiledQ{});
    Tensor acc1 = partition_fragment_C(mma_dq, TiledQ{});
    gemm<true, -1>(mma_dq, tdQrdS, n_block_of<0>(tdQrKt), acc0);
    gemm<false, -1>(mma_dkv, tdVrPt, tdVrdOt(_, _, _, st), tdVacc);
    gemm<true, -1>(mma_dq, tdQrdS, n_block_of<1>(tdQrKt), acc1);
    warpgroup_wait<2>();
    warpgroup_fence_operand(acc0);
    add_dq(acc0, h, m, 0, p.scale);
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc1);
    Tensor acc2 = partition_fragment_C(mma_dq, TiledQ{});
    gemm<false, -1>(mma_dkv, tdKrdSt, tdKrQt(_, _, _, st), tdKacc);
    gemm<true, -1>(mma_dq, tdQrdS, n_block_of<2>(tdQrKt), acc2);
    gemm<true, -1>(mma_dq, tdQrdS, n_block_of<3>(tdQrKt), acc3);
    add_dq(acc1, h, m, 1, p.scale);
    warpgroup_wait<1>();
    warpgroup_fence_operand(acc2);
    add_dq(acc2, h, m, 2, p.scale);
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc3);
    warpgroup_fence_operand(tdVacc);
    warpgroup_fence_operand(tdKacc);
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < decltype(size(acc3))::value; ++i) dq3(i) = acc3(i) * p.scale;
  }
  if (n_iter > 0) add_dq(dq3, w.head(n_iter - 1), w.tile(n_iter - 1), 3, 1.0f);
  if (wg_leader) tma_store_wait<0>();

  bwd_store_dkdv<Tr>(p, w, thr_dkv, tdKacc, tdVacc);
#else
  __trap();  // built for another target than sm_90a: never launched (the host checks the device)
#endif
}

template <typename T, bool CAUSAL>
const char* mha_bwd_sm90_d256_launch(const JaMhaBwdArgs& a, cudaStream_t stream) {
  using Tr = BwdTraitsD256<typename CutlassType<T>::type>;
  const int sq = int(a.p.seq_q), sk = int(a.p.seq_k), hq = int(a.p.heads_q), hkv = int(a.p.heads_kv), bt = int(a.p.batch);
  typename Tr::Params p{bwd_args<typename Tr::Element, Tr::kHeadDim>(a), bwd_tma_q<Tr>(a.q, sq, hq, bt),
                        bwd_tma_q<Tr>(a.dout, sq, hq, bt), bwd_tma_k<Tr>(a.k, sk, hkv, bt),
                        bwd_tma_k<Tr>(a.v, sk, hkv, bt),
                        Tr::DqStage::tma(a.dq_accum, sq, hq, bt)};
  return bwd_launch<Tr>(mha_bwd_sm90_d256_kernel<Tr, CAUSAL>, p, a, stream, "mha_bwd (sm90, head_dim 256)");
}

}  // namespace mha_sm90
}  // namespace ja
