// Flash-attention backward for Hopper (sm_90a) at head dims 192 and 256: warpgroup MMA, Q/dO tiles by TMA.
//
// The wide form of sm90/bwd_kernel.cuh's middle kernel (dK, dV and the float32 dQ accumulation); the
// preprocess and the dQ conversion are the same kernels. The head_dim <= 128 kernel keeps 64 keys x D
// of dK and of dV per warpgroup in registers: at D = 256 that is 256 registers a thread, so here the
// two warpgroups share one tile of 64 keys and split its head dims instead (as FlashAttention-3 does
// for hdim 256):
//
// One block of two warpgroups per (64 keys, kv head, batch); warpgroup w keeps dK of the block's keys
// for head-dim columns [D/2 w, D/2 (w + 1)) and dV for [DV/2 w, DV/2 (w + 1)) (at D = DV = 256, 64 x 128
// each, float32: 128 registers a thread) for the whole block. K and V are loaded once by TMA; the
// block walks every query head of its GQA group and every 64-row query tile that can see its keys, Q
// and dO by TMA through two shared-memory stages (tile i + 1 loads while tile i is computed), the rows'
// lse, delta and mask bounds through three slots. Per query tile (queries are the M dimension of the
// score products, as in FlashAttention-3):
//   S  = Q K^T, dP = dO V^T            wgmma from shared memory; warpgroup w: keys [32 w, 32 w + 32)
//   P  = exp2(x * s2 - lse * log2 e), 0 where masked (x: the score, with softcap and ALiBi)
//   dS = P * (dP - delta) (softcap: times 1 - tanh^2)
//   P, dS rounded to the input dtype, to shared memory (stmatrix): every warpgroup needs all keys
//   dV += P^T dO, dK += dS^T Q         wgmma from shared memory; warpgroup w: its columns
//   dQ  = dS K                          D / 64 slices of 64 columns (32 per warpgroup), issued between
//                                       dV and dK; each slice times scale goes through 8 KB of
//                                       shared memory per warpgroup and is added to dq_accum by
//                                       one TMA reduce-add (whole 128-byte rows) while the next
//                                       products run (deterministic: the tile's first slice waits for
//                                       its semaphore, sm90/bwd_order.cuh)
// Two block barriers a tile: one after S and dP are issued (every warpgroup is done with the
// previous tile: its P/dS buffer, Q/dO stage and row slot may be refilled), one after P and
// dS are stored. P and dS have one buffer each, which pays for the dQ staging.
//
// Why the reduce-add through shared memory: dQ is 64 KB of float32 a tile, and at this head dim
// the L2 cache's float reductions, not the tensor cores, bound the kernel. Vector atomics straight
// from the wgmma accumulators (red.global.add.v2.f32: each warp instruction writes 32 bytes of 8
// rows) reduce into an L2-resident array clearly slower than whole-row reductions (TMA, bulk
// copies, or 512-byte coalesced vector atomics). In the kernel (causal, grouped kv heads; timed by
// benchmarks/gpu/check_mha_bwd_sm90.cu) this reduce-add beat both those atomics and coalesced
// atomics read back from the staging tile, and the kernel without any dQ reduction was far faster
// still: the reductions, not the products, set its time. What is left is the reduce-add's
// latency: one 8 KB staging tile per warpgroup lets one slice be in flight.
//
// P and dS are rounded to the input dtype before their products (as FlashAttention and the
// other backward kernels do); every product accumulates in float32.
//
// Conventions are those of the other backward kernels (ja/kernels/mha.h): rows with no visible key
// (lse = +inf) contribute 0. Keys and query rows past the ends are zero-filled by TMA and masked; the
// reduce-add clips rows past seq_q and columns past d.
#pragma once
#include "mha/sm90/bwd_mainloop.cuh"
#include "mha/sm90/bwd_epilogue.cuh"
#include "mha/sm90/bwd_passes.cuh"

namespace ja {
namespace mha_sm90 {

// 64 query rows a tile, 64 keys a block (shared by the 2 warpgroups), 2 Q/dO stages. The atoms: the
// warpgroups read Q^T and dO^T by halves (D / 2, DV / 2 columns) and K^T by 32-column slices.
template <typename Element_, int D_, int DV_>
struct BwdTraitsD256
    : BwdLayouts<Element_, D_, DV_, 64, 64, 2, bwd_atom_width(D_, D_ / 2, 32), bwd_atom_width(DV_, DV_ / 2, DV_ / 2)> {
  using Layouts =
      BwdLayouts<Element_, D_, DV_, 64, 64, 2, bwd_atom_width(D_, D_ / 2, 32), bwd_atom_width(DV_, DV_ / 2, DV_ / 2)>;
  using Element = Element_;
  static constexpr int D = D_, DV = DV_;
  static constexpr int BM = Layouts::BM, BN = Layouts::BN;
  static constexpr int kSlots = 3;   // per-row slots (written one tile earlier than Q/dO land)
  static constexpr int kThreads = 256;
  static constexpr int DH = D / 2;   // dK columns per warpgroup
  static constexpr int DVH = DV / 2; // dV columns per warpgroup
  static constexpr int DQS = 64;     // dQ columns per slice (half per warpgroup: 32 floats, 128 bytes)
  static constexpr int kDqSlices = D / DQS;
  static_assert(D % DQS == 0 && (kDqSlices == 3 || kDqSlices == 4), "this kernel covers head dims 192 and 256");

  // S, dP: (queries, keys); warpgroup w computes keys [32 w, 32 w + 32).
  using TiledMmaSdP =
      decltype(make_tiled_mma(GMMA::ss_op_selector<Element, Element, float, Shape<Int<BM>, Int<BN / 2>, Int<D>>>(),
                              Layout<Shape<_1, _2, _1>>{}));
  // dV = P^T dO, dK = dS^T Q: (keys, head dim); A = P^T / dS^T (keys contiguous), B = dO^T / Q^T
  // (head dim contiguous); warpgroup w holds its half of the columns.
  using TiledMmadK =
      decltype(make_tiled_mma(GMMA::ss_op_selector<Element, Element, float, Shape<Int<BN>, Int<DH>, Int<BM>>,
                                                   GMMA::Major::MN, GMMA::Major::MN>(),
                              Layout<Shape<_1, _2, _1>>{}));
  using TiledMmadV =
      decltype(make_tiled_mma(GMMA::ss_op_selector<Element, Element, float, Shape<Int<BN>, Int<DVH>, Int<BM>>,
                                                   GMMA::Major::MN, GMMA::Major::MN>(),
                              Layout<Shape<_1, _2, _1>>{}));
  // Each warpgroup's columns one wgmma wide (the staging halves and the column splits assume it).
  static_assert(decltype(size<1>(typename TiledMmadK::Shape_MNK{}))::value == DH &&
                    decltype(size<1>(typename TiledMmadV::Shape_MNK{}))::value == DVH,
                "each warpgroup's dK, dV columns must be one wgmma wide");
  // dQ = dS K, one slice of DQS columns: A = dS (keys contiguous), B = K^T (head dim contiguous).
  using TiledMmadQ =
      decltype(make_tiled_mma(GMMA::ss_op_selector<Element, Element, float, Shape<Int<BM>, Int<DQS / 2>, Int<BN>>,
                                                   GMMA::Major::K, GMMA::Major::MN>(),
                              Layout<Shape<_1, _2, _1>>{}));

  // P and dS: (queries, keys), keys contiguous (one 128-byte swizzle row), one buffer; the
  // transposed view (keys, queries) is the A operand of dV and dK.
  using SmemLayoutPdS = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{}, Shape<Int<BM>, Int<BN>>{}));
  using SmemLayoutPdSt =
      decltype(composition(SmemLayoutPdS{}, make_layout(Shape<Int<BN>, Int<BM>>{}, Stride<Int<BM>, _1>{})));
  // One dQ slice * scale (float32, (queries, DQS columns)): warpgroup w's 32 columns (128 bytes a row)
  // are the contiguous half w, added to dq_accum by one TMA reduce-add.
  using DqStage = BwdDqStage<BM, DQS>;
  using SmemLayoutdQ = typename DqStage::Layout;

  struct SharedStorage : BwdSmem<Layouts, kSlots> {
    array_aligned<Element, cosize_v<SmemLayoutPdS>, 1024> p;
    array_aligned<Element, cosize_v<SmemLayoutPdS>, 1024> ds;
    array_aligned<float, cosize_v<SmemLayoutdQ>, 1024> dq;
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= 227 * 1024, "MHA backward (sm90, head dims 192/256) tiles exceed shared memory");

  using Params = BwdParams<Layouts, DqStage>;
};

// (MMA, N, K) operand fragment -> (MMA, 1, K): its J-th block along N.
template <int J, typename TB>
CUTE_DEVICE auto n_block_of(TB const& b) {
  constexpr int N = decltype(size<1>(b))::value;
  return logical_divide(b, Shape<Underscore, Int<N>>{})(_, make_coord(Int<J>{}, _), _);
}

template <typename Tr, bool CAUSAL, bool FEAT>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    mha_bwd_sm90_d256_kernel(CUTE_GRID_CONSTANT typename Tr::Params const p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Element = typename Tr::Element;
  constexpr int BM = Tr::BM, BN = Tr::BN, D = Tr::D, DV = Tr::DV, kStages = Tr::kStages, kSlots = Tr::kSlots;
  constexpr int DQS = Tr::DQS, kSlices = Tr::kDqSlices;
  using TileK = Shape<Int<BN>, Int<D>>;
  using TileV = Shape<Int<BN>, Int<DV>>;
  using TiledQ = Shape<Int<BM>, Int<DQS>>;

  auto& ss = bwd_smem<Tr>();
  const BwdWork w = bwd_work<BM, BN, CAUSAL>(p);
  const int b = w.b, n_iter = w.n_iter;
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
  bwd_start<Tr, CAUSAL>(p, ss, w);  // K, V and the Q/dO tiles of iterations 0 and 1

  typename Tr::TiledMmaSdP mma_sdp;
  typename Tr::TiledMmadK mma_dk;
  typename Tr::TiledMmadV mma_dv;
  typename Tr::TiledMmadQ mma_dq;
  auto thr_sdp = mma_sdp.get_thread_slice(tid);
  auto thr_dk = mma_dk.get_thread_slice(tid);
  auto thr_dv = mma_dv.get_thread_slice(tid);
  auto thr_dq = mma_dq.get_thread_slice(tid);
  auto r2s = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_sdp);
  auto thr_r2s = r2s.get_thread_slice(tid);

  Tensor tSrQ = thr_sdp.partition_fragment_A(sQ);    // (MMA, 1, K, stage)
  Tensor tSrdO = thr_sdp.partition_fragment_A(sdO);
  Tensor tSrK = thr_sdp.partition_fragment_B(sK);    // (MMA, 1, K)
  Tensor tSrV = thr_sdp.partition_fragment_B(sV);
  Tensor tdVrPt = thr_dv.partition_fragment_A(sPt);    // (MMA, 1, K)
  Tensor tdKrdSt = thr_dk.partition_fragment_A(sdSt);
  Tensor tdVrdOt = thr_dv.partition_fragment_B(sdOt);  // (MMA, 1, K, stage)
  Tensor tdKrQt = thr_dk.partition_fragment_B(sQt);
  Tensor tdQrdS = thr_dq.partition_fragment_A(sdS);     // (MMA, 1, K)
  Tensor tdQrKt = thr_dq.partition_fragment_B(sKt);     // (MMA, slices, K)
  Tensor tPsP = thr_r2s.partition_D(sP);                // (CPY, CPY_M, CPY_N)
  Tensor tdSsdS = thr_r2s.partition_D(sdS);
  Tensor tdQsdQ = thr_dq.partition_C(sdQ);              // this thread's part of a dQ slice

  Tensor tdVacc = partition_fragment_C(mma_dv, TileV{});
  Tensor tdKacc = partition_fragment_C(mma_dk, TileK{});
  clear(tdVacc);
  clear(tdKacc);

  Tensor cS = make_identity_tensor(Shape<Int<BM>, Int<BN>>{});  // (query, key)
  Tensor tScS = thr_sdp.partition_C(cS);
  Tensor tScS_rc = make_tensor(tScS.data(), acc_rowcol(tScS.layout()));
  float neg_slope = 0.0f;      // FEAT: -ALiBi slope of the iteration's query head
  // Deterministic: the tile whose semaphore this warpgroup releases once its adds have completed (at the
  // next tile's second slice: all but the newest add, the next tile's first slice, have completed). (A
  // tile later was clearly slower in benchmarks/gpu/check_mha_bwd_sm90.cu's deterministic timing at d256,
  // causal: each key block trails the next by one tile here, and the wait then stalled every block.)
  int32_t* pending = nullptr;
  int seen = INT_MIN;  // deterministic: the semaphore of the iteration's tile, read after its first barrier

  // dQ slice j of iteration it * scale through this warpgroup's half of the staging tile, to dq_accum by
  // one TMA reduce-add of its leader (the previous slice has left shared memory first). Deterministic:
  // slice 0 waits for the tile's turn, slice 1 releases the previous tile, the last slice leaves its tile
  // to release.
  auto add_dq = [&](auto const& acc, int it, int j, float scale) {
    if (wg_leader) {
      tma_store_wait<0>();
      if (j == 1 && pending) bwd_sync_release<1>(pending), pending = nullptr;
    }
    cutlass::arch::NamedBarrier::sync(128, 1 + wg);
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < decltype(size(acc))::value; i += 2) {  // elements i, i + 1: adjacent columns
      // st.shared, not a generic store: the generic one put a full memory barrier before the proxy fence
      asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(cute::cast_smem_ptr_to_uint(&tdQsdQ(i))),
                   "f"(acc(i) * scale), "f"(acc(i + 1) * scale));
    }
    cutlass::arch::fence_view_async_shared();
    cutlass::arch::NamedBarrier::sync(128, 1 + wg);
    if (wg_leader) {
      if (p.sync && j == 0) bwd_sync_wait(bwd_sem(p, w, it), w.n_block, seen);
      bwd_reduce_dq<typename Tr::DqStage>(p.tma_dq, p.shape_q, sdQ, w.head(it), b, w.tile(it), 2 * j + wg, wg);
      if (p.sync && j == kSlices - 1) pending = bwd_sem(p, w, it);
    }
  };
  Tensor acc_last = partition_fragment_C(mma_dq, TiledQ{});
  // The last slice * scale, sent during the next tile's S and dP: a copy, so that the compiler does not
  // make its read wait for those products (as it must for registers a wgmma writes).
  Tensor dq_last = make_tensor<float>(acc_last.layout());

  __syncthreads();  // the rows of the first two tiles
  ss.barrier_kv.wait(0);
  CUTLASS_PRAGMA_NO_UNROLL
  for (int it = 0; it < n_iter; ++it) {
    const int st = it % kStages, slot = it % kSlots;
    if constexpr (FEAT)
      if (p.alibi) neg_slope = -p.alibi[int64_t(b) * p.alibi_batch_stride + w.head(it)];
    ss.barrier_q[st].wait((it / kStages) & 1);

    Tensor tSrS = partition_fragment_C(mma_sdp, Shape<Int<BM>, Int<BN>>{});
    Tensor tSrdP = partition_fragment_C(mma_sdp, Shape<Int<BM>, Int<BN>>{});
    gemm<true, -1>(mma_sdp, tSrQ(_, _, _, st), tSrK, tSrS);
    gemm<true, -1>(mma_sdp, tSrdO(_, _, _, st), tSrV, tSrdP);
    if (it > 0) add_dq(dq_last, it - 1, kSlices - 1, 1.0f);
    // Every warpgroup is done with iteration it - 1 (its products have landed): P and dS may be
    // overwritten, and its Q/dO stage ((it + 1) % 2) and row slot ((it + 2) % 3) refilled.
    __syncthreads();
    if (p.sync && wg_leader) seen = bwd_sync_peek(bwd_sem(p, w, it));
    if (it >= 1 && it + 1 < n_iter && tid == 0) bwd_load_q<Tr>(p, ss, w, it + 1);  // 0 and 1 came with K, V
    if (it + 2 < n_iter) bwd_load_rows<Tr, CAUSAL>(p, ss, w, it + 2);  // read at iteration it + 2, after later barriers
    warpgroup_wait<1>();
    Tensor s = make_tensor(tSrS.data(), acc_rowcol(tSrS.layout()));
    Tensor dp = make_tensor(tSrdP.data(), acc_rowcol(tSrdP.layout()));
    // Visible iff the key lies in its query row's [lo, hi) (query rows past seq_q: lse = +inf, P = 0).
    auto key = [&](int r, int c) { return int(get<1>(tScS_rc(r, c))); };
    auto row = [&](int r, int) { return int(get<0>(tScS_rc(r, 0))); };
    auto p_ds = [&](auto stage, auto masked) {
      bwd_p_ds<decltype(stage)::value, decltype(masked)::value, FEAT>(p, s, dp, key, row, ss.lse[slot], ss.delta[slot],
                                                                      ss.bounds[slot], ss.diag[slot], neg_slope);
    };
    const bool full = w.full(it);
    if (full) p_ds(cute::Int<0>{}, cute::false_type{});
    else p_ds(cute::Int<0>{}, cute::true_type{});
    warpgroup_wait<0>();  // dP has landed
    if (full) p_ds(cute::Int<1>{}, cute::false_type{});
    else p_ds(cute::Int<1>{}, cute::true_type{});

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

    // Issue order dQ0, dV, dQ1 | dK, dQ2 [, dQ3]: each slice goes out while later products run (the
    // last one while the next tile's S and dP run), and each waits for the one before it to leave
    // shared memory, which had a large product's time to do so.
    Tensor acc0 = partition_fragment_C(mma_dq, TiledQ{});
    Tensor acc1 = partition_fragment_C(mma_dq, TiledQ{});
    gemm<true, -1>(mma_dq, tdQrdS, n_block_of<0>(tdQrKt), acc0);
    gemm<false, -1>(mma_dv, tdVrPt, tdVrdOt(_, _, _, st), tdVacc);
    gemm<true, -1>(mma_dq, tdQrdS, n_block_of<1>(tdQrKt), acc1);
    warpgroup_wait<2>();
    warpgroup_fence_operand(acc0);
    add_dq(acc0, it, 0, p.scale);
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc1);
    if constexpr (kSlices == 4) {
      Tensor acc2 = partition_fragment_C(mma_dq, TiledQ{});
      gemm<false, -1>(mma_dk, tdKrdSt, tdKrQt(_, _, _, st), tdKacc);
      gemm<true, -1>(mma_dq, tdQrdS, n_block_of<2>(tdQrKt), acc2);
      gemm<true, -1>(mma_dq, tdQrdS, n_block_of<3>(tdQrKt), acc_last);
      add_dq(acc1, it, 1, p.scale);
      warpgroup_wait<1>();
      warpgroup_fence_operand(acc2);
      add_dq(acc2, it, 2, p.scale);
    } else {
      gemm<false, -1>(mma_dk, tdKrdSt, tdKrQt(_, _, _, st), tdKacc);
      gemm<true, -1>(mma_dq, tdQrdS, n_block_of<2>(tdQrKt), acc_last);
      add_dq(acc1, it, 1, p.scale);
    }
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc_last);
    warpgroup_fence_operand(tdVacc);
    warpgroup_fence_operand(tdKacc);
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < decltype(size(acc_last))::value; ++i) dq_last(i) = acc_last(i) * p.scale;
  }
  if (n_iter > 0) add_dq(dq_last, n_iter - 1, kSlices - 1, 1.0f);
  bwd_drain_dq(wg_leader, pending);

  bwd_store_dkdv<BN, D, DV, CAUSAL>(p, w, thr_dk, tdKacc, thr_dv, tdVacc);
#else
  __trap();  // built for another target than sm_90a: never launched (the host checks the device)
#endif
}

template <typename T, int D, int DV, bool CAUSAL, bool FEAT>
const char* mha_bwd_sm90_d256_launch(const JaMhaBwdArgs& a, cudaStream_t stream) {
  using Tr = BwdTraitsD256<typename CutlassType<T>::type, D, DV>;
  return bwd_launch<Tr>(mha_bwd_sm90_d256_kernel<Tr, CAUSAL, FEAT>, a, FEAT, stream,
                        "mha_bwd (sm90, head dims 192/256)");
}

}  // namespace mha_sm90
}  // namespace ja
