// Flash-attention backward for Hopper (sm_90a): warpgroup MMA, Q/dO tiles by TMA.
//
// The middle kernel of the backward (dK, dV and the float32 dQ accumulation); the preprocess
// (delta = rowsum(dO * O), zeroed dq_accum; deterministic: the semaphores) and the dQ conversion are
// sm90/bwd_passes.cuh's. Instance head dims 64, 96 and 128 run the kernel below; 192 and 256, whose
// dK and dV would not fit a warpgroup's registers here, run sm90/bwd_kernel_d256.cuh's (64 keys a block, the
// head dim split over the warpgroups); sm90/bwd_launch.cuh picks between them.
//
// One block of two warpgroups per (128 keys, kv head, batch); warpgroup w owns key rows
// [64 w, 64 w + 64) of the tile and keeps their dK and dV (64 x D each, float32) in
// wgmma accumulators for the whole block. K and V are loaded once by TMA; the block then
// walks every query head of its GQA group and every 64-row query tile that can see its
// keys (sm90/bwd_order.cuh: the mask's query range), Q and dO by TMA through three
// shared-memory stages (tile i + 2 is loaded while tile i is computed), the rows' lse, delta
// and mask bounds staged in shared memory, dS double-buffered, so one block barrier per tile
// suffices. Per query tile (keys are the M dimension of the products, as in the mma.sync kernel):
//   S^T  = K Q^T, dP^T = V dO^T                   wgmma, both operands in shared memory
//   P^T  = exp2(x * s2 - lse * log2 e), 0 where masked (x: the score, with softcap and ALiBi)
//   dS^T = P^T * (dP^T - delta) (softcap: times 1 - tanh^2)
//   dV  += P^T dO, dK += dS^T Q                    wgmma, A (P^T, dS^T) from registers
//   dQ   = dS K (64 x D, split by columns over the warpgroups; dS through shared memory,
//          stored by stmatrix)
//          times scale, through shared memory, added to dq_accum by a TMA reduce-add per
//          warpgroup (issued in order dV, dQ, dK: dQ goes out while dK runs); deterministic:
//          in the order of the tile's semaphore
// P and dS are rounded to the input dtype before their products (as FlashAttention and
// the mma.sync kernel do); every product accumulates in float32.
//
// Conventions are those of the other backward kernels (ja/kernels/mha.h): rows with no visible key
// (lse = +inf) contribute 0. Keys and query rows past the ends are zero-filled by TMA and masked.
#pragma once
#include "mha/sm90/bwd_mainloop.cuh"
#include "mha/sm90/bwd_epilogue.cuh"
#include "mha/sm90/bwd_passes.cuh"

namespace ja {
namespace mha_sm90 {

// 64 query rows a tile, 128 keys a block (2 warpgroups x 64), 3 Q/dO stages.
template <typename Element_, int D>
struct BwdTraits : BwdLayouts<Element_, D, D, 64, 128, 3, bwd_atom_width(D, D / 2, D), bwd_atom_width(D, D, D)> {
  // K's atom: the dQ product's warpgroups read K^T by halves of D / 2 columns.
  using Layouts = BwdLayouts<Element_, D, D, 64, 128, 3, bwd_atom_width(D, D / 2, D), bwd_atom_width(D, D, D)>;
  using Element = Element_;
  static constexpr int BM = Layouts::BM, BN = Layouts::BN, kStages = Layouts::kStages;
  static constexpr int kSlots = kStages;  // per-row slots
  static constexpr int kThreads = 256;
  static_assert(D % 32 == 0 && D <= 128,
                "this kernel covers head dims 64, 96 and 128 (sm90/bwd_kernel_d256.cuh: more)");

  using TiledMmaSdP = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<BM>, Int<D>>>(), Layout<Shape<_2, _1, _1>>{}));
  using TiledMmadKV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<D>, Int<BM>>, GMMA::Major::K, GMMA::Major::MN>(),
      Layout<Shape<_2, _1, _1>>{}));
  // dQ = dS K: warpgroup w computes columns [w D/2, (w + 1) D/2), one wgmma wide (ss_atom: at D = 96 the
  // selector's narrower atoms would interleave the warpgroups' columns, which the dQ staging's halves
  // assume contiguous).
  using AtomdQ = decltype(ss_atom<Element, 64, D / 2, BN, GMMA::Major::MN, GMMA::Major::MN>());
  static_assert(atom_n<AtomdQ>() == D / 2, "each warpgroup's dQ columns must be one wgmma wide");
  using TiledMmadQ = decltype(make_tiled_mma(AtomdQ{}, Layout<Shape<_1, _2, _1>>{}));

  // dS as the A operand of dQ = dS K: (queries, keys), queries contiguous.
  using SmemLayoutdS = decltype(tile_to_shape(GMMA::Layout_MN_SW128_Atom<Element>{}, Shape<Int<BM>, Int<BN>>{}));
  // The same memory as (keys, queries), the accumulator's shape, for the stmatrix store of dS.
  using SmemLayoutdSt =
      decltype(composition(SmemLayoutdS{}, make_layout(Shape<Int<BN>, Int<BM>>{}, Stride<Int<BM>, _1>{})));
  // dQ * scale (float32) of a query tile, (queries, head_dim); warpgroup w's columns [w D/2, (w + 1) D/2)
  // are the contiguous half w, added to dq_accum by one TMA reduce-add.
  using DqStage = BwdDqStage<BM, D>;
  using SmemLayoutdQ = typename DqStage::Layout;

  struct SharedStorage : BwdSmem<Layouts, kSlots> {
    array_aligned<Element, cosize_v<SmemLayoutdS>, 1024> ds[2];
    array_aligned<float, cosize_v<SmemLayoutdQ>, 1024> dq;
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= 227 * 1024, "MHA backward (sm90) tiles exceed shared memory");

  using Params = BwdParams<Layouts, DqStage>;
};

template <typename Tr, bool CAUSAL, bool FEAT>
__global__ void __launch_bounds__(Tr::kThreads, 1) mha_bwd_sm90_kernel(CUTE_GRID_CONSTANT typename Tr::Params const p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Element = typename Tr::Element;
  constexpr int BM = Tr::BM, BN = Tr::BN, D = Tr::kHeadDim, kStages = Tr::kStages;
  using TileQ = Shape<Int<BM>, Int<D>>;
  using TileK = Shape<Int<BN>, Int<D>>;

  auto& ss = bwd_smem<Tr>();
  const BwdWork w = bwd_work<BM, BN, CAUSAL>(p);
  const int b = w.b, n_iter = w.n_iter;
  const int tid = threadIdx.x;

  auto [sQ, sdO, sQt, sdOt, sK, sV, sKt] = bwd_smem_tensors<Tr>(ss);
  Tensor sdS = make_tensor(make_smem_ptr(ss.ds[0].data()), typename Tr::SmemLayoutdS{});
  Tensor sdS1 = make_tensor(make_smem_ptr(ss.ds[1].data()), typename Tr::SmemLayoutdS{});

  if (tid == 0) cute::prefetch_tma_descriptor(p.tma_dq.get_tma_descriptor());
  bwd_start<Tr, CAUSAL>(p, ss, w);

  typename Tr::TiledMmaSdP mma_sdp;
  typename Tr::TiledMmadKV mma_dkv;
  typename Tr::TiledMmadQ mma_dq;
  auto thr_sdp = mma_sdp.get_thread_slice(tid);
  auto thr_dkv = mma_dkv.get_thread_slice(tid);
  auto thr_dq = mma_dq.get_thread_slice(tid);
  auto r2s_ds = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_sdp);
  auto thr_r2s_ds = r2s_ds.get_thread_slice(tid);

  Tensor tSrK = thr_sdp.partition_fragment_A(sK);    // (MMA, 1, K)
  Tensor tSrV = thr_sdp.partition_fragment_A(sV);
  Tensor tSrQ = thr_sdp.partition_fragment_B(sQ);    // (MMA, N, K, stage)
  Tensor tSrdO = thr_sdp.partition_fragment_B(sdO);
  Tensor tdVrdOt = thr_dkv.partition_fragment_B(sdOt);  // (MMA, N, K, stage)
  Tensor tdKrQt = thr_dkv.partition_fragment_B(sQt);
  Tensor tdQrdS = thr_dq.partition_fragment_A(sdS);
  Tensor tdQrdS1 = thr_dq.partition_fragment_A(sdS1);
  Tensor tdQrKt = thr_dq.partition_fragment_B(sKt);

  Tensor tdVacc = partition_fragment_C(mma_dkv, TileK{});
  Tensor tdKacc = partition_fragment_C(mma_dkv, TileK{});
  clear(tdVacc);
  clear(tdKacc);

  Tensor cS = make_identity_tensor(Shape<Int<BN>, Int<BM>>{});  // (key, query)
  Tensor tScS = thr_sdp.partition_C(cS);
  Tensor tScS_rc = make_tensor(tScS.data(), acc_rowcol(tScS.layout()));
  const int wg = tid / 128;
  const bool wg_leader = tid % 128 == 0;  // issues its warpgroup's dQ reduce-add
  Tensor sdQ = make_tensor(make_smem_ptr(ss.dq.data()), typename Tr::SmemLayoutdQ{});
  Tensor tdQsdQ = thr_dq.partition_C(sdQ);
  float neg_slope = 0.0f;  // FEAT: -ALiBi slope of the iteration's query head
  // Deterministic: the tile whose semaphore this warpgroup releases once its add has completed, an iteration
  // after issuing it. (Two iterations after, so that the wait finds the add complete, was slower in
  // benchmarks/gpu/check_mha_bwd_sm90.cu's deterministic timing at d128, as each key block then trails the
  // next by two tiles.)
  int32_t* pending = nullptr;

  __syncthreads();  // the rows of the first two tiles
  ss.barrier_kv.wait(0);
  CUTLASS_PRAGMA_NO_UNROLL
  for (int it = 0; it < n_iter; ++it) {
    const int h = w.head(it), m = w.tile(it);
    const int st = it % kStages, slot = it % Tr::kSlots;
    if constexpr (FEAT)
      if (p.alibi) neg_slope = -p.alibi[int64_t(b) * p.alibi_batch_stride + h];
    ss.barrier_q[st].wait((it / kStages) & 1);

    Tensor tSrS = partition_fragment_C(mma_sdp, Shape<Int<BN>, Int<BM>>{});
    Tensor tSrdP = partition_fragment_C(mma_sdp, Shape<Int<BN>, Int<BM>>{});
    gemm<true, -1>(mma_sdp, tSrK, tSrQ(_, _, _, st), tSrS);
    gemm<true, -1>(mma_sdp, tSrV, tSrdO(_, _, _, st), tSrdP);
    warpgroup_wait<1>();
    Tensor s = make_tensor(tSrS.data(), acc_rowcol(tSrS.layout()));
    Tensor dp = make_tensor(tSrdP.data(), acc_rowcol(tSrdP.layout()));
    // Visible iff the key lies in its query row's [lo, hi) (query rows past seq_q: lse = +inf, P = 0).
    auto key = [&](int r, int) { return int(get<0>(tScS_rc(r, 0))); };
    auto row = [&](int r, int c) { return int(get<1>(tScS_rc(r, c))); };
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

    // P^T and dS^T rounded to the input dtype, as A operands of dV and dK.
    Tensor tdVrP = make_tensor<Element>(acc_as_a(tSrS.layout()));
    Tensor tdKrdS = make_tensor<Element>(acc_as_a(tSrdP.layout()));
    bwd_round(tSrS, tdVrP);
    bwd_round(tSrdP, tdKrdS);
    // dS (queries x keys) to shared memory for dQ = dS K, by stmatrix (8 x 8 tiles, queries contiguous).
    {
      Tensor sdStb = make_tensor(make_smem_ptr(ss.ds[it % 2].data()), typename Tr::SmemLayoutdSt{});
      Tensor ds16 = make_tensor(tdKrdS.data(), tSrdP.layout());
      copy(r2s_ds, thr_r2s_ds.retile_S(ds16), thr_r2s_ds.partition_D(sdStb));
    }
    cutlass::arch::fence_view_async_shared();
    gemm<false, -1>(mma_dkv, tdVrP, tdVrdOt(_, _, _, st), tdVacc);
    if (wg_leader) {
      tma_store_wait<0>();  // the previous tile's dQ has left shared memory
      if (pending) bwd_sync_release(pending), pending = nullptr;
    }
    // dS complete; every warpgroup is done with iteration it - 1: its Q/dO stage
    // ((it + 2) % 3), its row slot and dS buffer ((it + 1) % 2) may be refilled;
    // the dQ tile in shared memory may be overwritten.
    __syncthreads();
    int seen = INT_MIN;
    if (p.sync && wg_leader) seen = bwd_sync_peek(bwd_sem(p, w, it));
    if (it + 2 < n_iter) {
      if (tid == 0) bwd_load_q<Tr>(p, ss, w, it + 2);
      bwd_load_rows<Tr, CAUSAL>(p, ss, w, it + 2);  // read at iteration it + 2, after iteration it + 1's barrier
    }

    // dQ (waits for dV), then dK, which runs while dQ goes out.
    Tensor tdQacc = partition_fragment_C(mma_dq, TileQ{});
    if (it % 2 == 0) gemm<true, 1>(mma_dq, tdQrdS, tdQrKt, tdQacc);
    else gemm<true, 1>(mma_dq, tdQrdS1, tdQrKt, tdQacc);
    gemm<false, 1>(mma_dkv, tdKrdS, tdKrQt(_, _, _, st), tdKacc);
    {
      // dQ * scale to shared memory; each warpgroup's leader adds its half to dq_accum with one
      // TMA reduce-add (float32 adds in L2, as the atomics did; rows past seq_q are clipped).
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < decltype(size(tdQacc))::value; i += 2)  // elements i, i + 1: adjacent columns
        *reinterpret_cast<float2*>(&tdQsdQ(i)) = make_float2(tdQacc(i) * p.scale, tdQacc(i + 1) * p.scale);
      cutlass::arch::fence_view_async_shared();
      cutlass::arch::NamedBarrier::sync(128, 1 + wg);
      if (wg_leader) {
        if (p.sync) {
          pending = bwd_sem(p, w, it);
          bwd_sync_wait(pending, w.n_block, seen);
        }
        bwd_reduce_dq<typename Tr::DqStage>(p.tma_dq, p.shape_q, sdQ, h, b, m, wg, wg);
      }
    }
    warpgroup_wait<0>();
    warpgroup_fence_operand(tdKacc);
  }
  bwd_drain_dq(wg_leader, pending);

  bwd_store_dkdv<BN, D, D, CAUSAL>(p, w, thr_dkv, tdKacc, thr_dkv, tdVacc);
#else
  __trap();  // built for another target than sm_90a: never launched (the host checks the device)
#endif
}

template <typename T, int D, bool CAUSAL, bool FEAT>
const char* mha_bwd_sm90_launch(const JaMhaBwdArgs& a, cudaStream_t stream) {
  using Tr = BwdTraits<typename CutlassType<T>::type, D>;
  return bwd_launch<Tr>(mha_bwd_sm90_kernel<Tr, CAUSAL, FEAT>, a, FEAT, stream, "mha_bwd (sm90)");
}

}  // namespace mha_sm90
}  // namespace ja
