// Flash-attention backward for Hopper (sm_90a): warpgroup MMA, Q/dO tiles by TMA.
//
// The middle kernel of the backward (dK, dV and the float32 dQ accumulation); the
// preprocess (delta = rowsum(dO * O), zeroed dq_accum) is mha_bwd_gpu.cuh's kernel, the dQ
// conversion its kernel four elements a thread (the same rounding). Head dims 64 and 128 run the
// kernel below; head dim 256, whose dK and dV would not fit a warpgroup's registers here, runs
// mha_bwd_sm90_d256.cuh's (64 keys a block, the head dim split over the warpgroups).
//
// One block of two warpgroups per (128 keys, kv head, batch); warpgroup w owns key rows
// [64 w, 64 w + 64) of the tile and keeps their dK and dV (64 x D each, float32) in
// wgmma accumulators for the whole block. K and V are loaded once by TMA; the block then
// walks every query head of its GQA group and every 64-row query tile that can see its
// keys, Q and dO by TMA through three shared-memory stages (tile i + 2 is loaded while tile i
// is computed), lse and delta staged in shared memory, dS double-buffered, so one block barrier
// per tile suffices. Per query tile (keys are the M dimension of the products, as in the
// mma.sync kernel):
//   S^T  = K Q^T, dP^T = V dO^T                   wgmma, both operands in shared memory
//   P^T  = exp2(S^T * scale * log2 e - lse * log2 e), masked to 0
//   dS^T = P^T * (dP^T - delta)
//   dV  += P^T dO, dK += dS^T Q                    wgmma, A (P^T, dS^T) from registers
//   dQ   = dS K (64 x D, split by columns over the warpgroups; dS through shared memory,
//          stored by stmatrix)
//          times scale, through shared memory, added to dq_accum by a TMA reduce-add per
//          warpgroup (issued in order dV, dQ, dK: dQ goes out while dK runs)
// P and dS are rounded to the input dtype before their products (as FlashAttention and
// the mma.sync kernel do); every product accumulates in float32.
//
// Conventions are those of the other backward kernels: bottom-right causal alignment
// (query i sees key j iff j <= i + seq_k - seq_q), query tiles that see none of the
// block's keys skipped, rows with no visible key (lse = +inf) contribute 0. Keys and
// query rows past the ends are zero-filled by TMA and masked.
#pragma once
#include "mha/mha_bwd_sm90_common.cuh"
#include "mha/mha_bwd_sm90_d256.cuh"  // head_dim 256: the head dim split over the warpgroups

namespace ja {
namespace mha_sm90 {

// 64 query rows a tile, 128 keys a block (2 warpgroups x 64), 3 Q/dO stages.
template <typename Element_, int D>
struct BwdTraits : BwdLayouts<Element_, D, 64, 128, 3> {
  using Layouts = BwdLayouts<Element_, D, 64, 128, 3>;
  using Element = Element_;
  static constexpr int BM = Layouts::BM, BN = Layouts::BN, kStages = Layouts::kStages;
  static constexpr int kSlots = kStages;  // lse/delta slots
  static constexpr int kThreads = 256;
  static_assert(D % 64 == 0 && D <= 128, "this kernel covers head_dim 64 and 128 (256: mha_bwd_sm90_d256.cuh)");

  using TiledMmaSdP = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<BM>, Int<D>>>(), Layout<Shape<_2, _1, _1>>{}));
  using TiledMmadKV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<D>, Int<BM>>, GMMA::Major::K, GMMA::Major::MN>(),
      Layout<Shape<_2, _1, _1>>{}));
  using TiledMmadQ = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<D / 2>, Int<BN>>, GMMA::Major::MN,
                           GMMA::Major::MN>(),
      Layout<Shape<_1, _2, _1>>{}));

  // dS as the A operand of dQ = dS K: (queries, keys), queries contiguous.
  using SmemLayoutdS = decltype(tile_to_shape(GMMA::Layout_MN_SW128_Atom<Element>{}, Shape<Int<BM>, Int<BN>>{}));
  // The same memory as (keys, queries), the accumulator's shape, for the stmatrix store of dS.
  using SmemLayoutdSt =
      decltype(composition(SmemLayoutdS{}, make_layout(Shape<Int<BN>, Int<BM>>{}, Stride<Int<BM>, _1>{})));
  // dQ * scale (float32) of a query tile, (queries, head_dim); warpgroup w's columns [w D/2, (w + 1) D/2)
  // are the contiguous half w, added to dq_accum by one TMA reduce-add.
  using DqStage = BwdDqStage<BM, D, D>;
  using SmemLayoutdQ = typename DqStage::Layout;
  using TmadQ = typename DqStage::Tma;

  struct SharedStorage : BwdSmem<Layouts, kSlots> {
    array_aligned<Element, cosize_v<SmemLayoutdS>, 1024> ds[2];
    array_aligned<float, cosize_v<SmemLayoutdQ>, 1024> dq;
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= 227 * 1024, "MHA backward (sm90) tiles exceed shared memory");

  struct Params : BwdArgs<Element> {
    typename Layouts::TmaQ tma_q, tma_do;
    typename Layouts::TmaK tma_k, tma_v;
    TmadQ tma_dq;
  };
};

template <typename Tr, bool CAUSAL>
__global__ void __launch_bounds__(Tr::kThreads, 1) mha_bwd_sm90_kernel(CUTE_GRID_CONSTANT typename Tr::Params const p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Element = typename Tr::Element;
  constexpr int BM = Tr::BM, BN = Tr::BN, D = Tr::kHeadDim, kStages = Tr::kStages;
  using TileQ = Shape<Int<BM>, Int<D>>;
  using TileK = Shape<Int<BN>, Int<D>>;

  auto& ss = bwd_smem<Tr>();
  const BwdWork w = bwd_work<BM, BN, CAUSAL>(p);
  const int b = w.b, sq = w.sq, sk = w.sk, kv0 = w.kv0, nk = w.nk, n_iter = w.n_iter;
  const int tid = threadIdx.x;

  auto [sQ, sdO, sQt, sdOt, sK, sV, sKt] = bwd_smem_tensors<Tr>(ss);
  Tensor sdS = make_tensor(make_smem_ptr(ss.ds[0].data()), typename Tr::SmemLayoutdS{});
  Tensor sdS1 = make_tensor(make_smem_ptr(ss.ds[1].data()), typename Tr::SmemLayoutdS{});

  if (tid == 0) cute::prefetch_tma_descriptor(p.tma_dq.get_tma_descriptor());
  bwd_start<Tr>(p, ss, w);

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
  const float s2 = p.scale_log2;

  __syncthreads();  // lse, delta of the first two tiles
  ss.barrier_kv.wait(0);
  CUTLASS_PRAGMA_NO_UNROLL
  for (int it = 0; it < n_iter; ++it) {
    const int h = w.head(it), m = w.tile(it);
    const int q0 = m * BM;
    const int st = it % kStages;
    // lse (log2 domain; +inf past seq_q gives P = 0) and delta of the tile's rows.
    const float* lse2 = ss.lse[it % Tr::kSlots];  // the slot bwd_load_rows wrote
    const float* dlt = ss.delta[it % Tr::kSlots];
    ss.barrier_q[st].wait((it / kStages) & 1);

    Tensor tSrS = partition_fragment_C(mma_sdp, Shape<Int<BN>, Int<BM>>{});
    Tensor tSrdP = partition_fragment_C(mma_sdp, Shape<Int<BN>, Int<BM>>{});
    gemm<true, -1>(mma_sdp, tSrK, tSrQ(_, _, _, st), tSrS);
    gemm<true, -1>(mma_sdp, tSrV, tSrdO(_, _, _, st), tSrdP);
    warpgroup_wait<1>();
    Tensor s = make_tensor(tSrS.data(), acc_rowcol(tSrS.layout()));
    Tensor dp = make_tensor(tSrdP.data(), acc_rowcol(tSrdP.layout()));
    // Visible iff key < seq_k, query < seq_q (lse), and (causal) key - query <= q0 + sk - sq - kv0.
    bwd_p_ds<CAUSAL>(
        s, dp, [&](int r, int) { return int(get<0>(tScS_rc(r, 0))); },
        [&](int r, int c) { return int(get<1>(tScS_rc(r, c))); },
        [&](int r, int c) { return lse2[int(get<1>(tScS_rc(r, c)))]; },
        [&](int r, int c) { return dlt[int(get<1>(tScS_rc(r, c)))]; }, s2, nk, q0 + sk - sq - kv0,
        [] { warpgroup_wait<0>(); });

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
    if (wg_leader) tma_store_wait<0>();  // the previous tile's dQ has left shared memory
    // dS complete; every warpgroup is done with iteration it - 1: its Q/dO stage
    // ((it + 2) % 3), its lse/delta slot and dS buffer ((it + 1) % 2) may be refilled;
    // the dQ tile in shared memory may be overwritten.
    __syncthreads();
    if (it + 2 < n_iter) {
      if (tid == 0) bwd_load_q<Tr>(p, ss, w, it + 2);
      bwd_load_rows<Tr>(p, ss, w, it + 2);  // read at iteration it + 2, after iteration it + 1's barrier
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
      if (wg_leader) bwd_reduce_dq<typename Tr::DqStage>(p.tma_dq, p.shape_q, sdQ, h, b, m, wg, wg);
    }
    warpgroup_wait<0>();
    warpgroup_fence_operand(tdKacc);
  }
  if (wg_leader) tma_store_wait<0>();

  bwd_store_dkdv<Tr>(p, w, thr_dkv, tdKacc, tdVacc);
#else
  __trap();  // built for another target than sm_90a: never launched (the host checks the device)
#endif
}

template <typename T, int D, bool CAUSAL>
const char* mha_bwd_sm90_launch(const JaMhaBwdArgs& a, cudaStream_t stream) {
  using Tr = BwdTraits<typename CutlassType<T>::type, D>;
  const int sq = int(a.p.seq_q), sk = int(a.p.seq_k), hq = int(a.p.heads_q), hkv = int(a.p.heads_kv), bt = int(a.p.batch);
  typename Tr::Params p{
      bwd_args<typename Tr::Element, D>(a),
      bwd_tma_q<Tr>(a.q, sq, hq, bt),
      bwd_tma_q<Tr>(a.dout, sq, hq, bt),
      bwd_tma_k<Tr>(a.k, sk, hkv, bt),
      bwd_tma_k<Tr>(a.v, sk, hkv, bt),
      Tr::DqStage::tma(a.dq_accum, sq, hq, bt)};
  return bwd_launch<Tr>(mha_bwd_sm90_kernel<Tr, CAUSAL>, p, a, stream, "mha_bwd (sm90)");
}

// mha_bwd_convert_dq four elements a thread (n4 = elements / 4, dq 8-byte aligned): the same
// rounding of each element, fewer and wider accesses.
template <typename T>
__global__ void __launch_bounds__(256) convert_dq4(const float4* acc, T* dq, int64_t n4) {
  for (int64_t i = int64_t(blockIdx.x) * 256 + threadIdx.x; i < n4; i += int64_t(gridDim.x) * 256) {
    const float4 v = acc[i];
    struct alignas(8) Four {
      T e[4];
    } o;
    o.e[0] = from_f32<T>(v.x);
    o.e[1] = from_f32<T>(v.y);
    o.e[2] = from_f32<T>(v.z);
    o.e[3] = from_f32<T>(v.w);
    reinterpret_cast<Four*>(dq)[i] = o;
  }
}

constexpr bool bwd_supported_head_dim(int d) { return d == 64 || d == 128 || d == 256; }

// Runs the whole backward (preprocess, this kernel, dQ conversion) when the Hopper kernel
// applies: sets *handled and returns the launch status; otherwise leaves *handled = 0 and the
// caller takes the mma.sync / SIMT path. It does not apply on another device, to empty shapes,
// to unaligned pointers, or to sizes past int32.
template <typename T, int D, bool CAUSAL>
const char* mha_bwd_sm90(const JaMhaBwdArgs& a, void* stream, int* handled) {
  *handled = 0;
  const int64_t lim = int64_t(1) << 30;
  if (a.p.batch <= 0 || a.p.seq_q <= 0 || a.p.seq_k <= 0 || a.p.heads_q <= 0 || a.p.heads_kv <= 0) return nullptr;
  if (a.p.batch >= 65536 || a.p.heads_q >= 65536 || a.p.seq_q >= lim || a.p.seq_k >= lim) return nullptr;
  if (a.p.batch * a.p.seq_q * a.p.heads_q * D >= (int64_t(1) << 31)) return nullptr;
  for (const void* ptr : {a.q, a.k, a.v, a.dout, static_cast<const void*>(a.dk), static_cast<const void*>(a.dv),
                          static_cast<const void*>(a.dq_accum)})
    if (!mha_gpu::aligned16(ptr)) return nullptr;
  if (!device_is_sm90()) return nullptr;
  if (mha_unhandled_feature(a, mha_gpu::kBwdSm90Features)) return nullptr;
  *handled = 1;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  using mha_gpu::kThreads;
  const int64_t q_rows = a.p.batch * a.p.seq_q * a.p.heads_q;
  const int64_t max_blocks = int64_t(1) << 20;
  {
    const int64_t blocks = std::min<int64_t>((q_rows + mha_gpu::kTy - 1) / mha_gpu::kTy, max_blocks);
    mha_gpu::mha_bwd_preprocess<T, D><<<unsigned(blocks), kThreads, 0, s>>>(a);
    if (const char* e = mha_gpu::launch_status("mha_bwd (preprocess)")) return e;
  }
  if constexpr (D == 256) {
    if (const char* e = mha_bwd_sm90_d256_launch<T, CAUSAL>(a, s)) return e;
  } else {
    if (const char* e = mha_bwd_sm90_launch<T, D, CAUSAL>(a, s)) return e;
  }
  {
    const int64_t n = q_rows * D;  // a multiple of 4; dq_accum is 16-byte aligned
    if ((reinterpret_cast<uintptr_t>(a.dq) & 7u) == 0) {
      const int64_t blocks = std::min<int64_t>((n / 4 + 255) / 256, max_blocks);
      convert_dq4<T><<<unsigned(blocks), 256, 0, s>>>(reinterpret_cast<const float4*>(a.dq_accum),
                                                      static_cast<T*>(a.dq), n / 4);
    } else {
      const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, max_blocks);
      mha_gpu::mha_bwd_convert_dq<T><<<unsigned(blocks), kThreads, 0, s>>>(a.dq_accum, static_cast<T*>(a.dq), n);
    }
    if (const char* e = mha_gpu::launch_status("mha_bwd (convert dQ)")) return e;
  }
  return nullptr;
}

}  // namespace mha_sm90
}  // namespace ja
