// Flash-attention forward for Hopper (sm_90a): warpgroup MMA fed by TMA.
//
// One block of three warpgroups per (128 query rows, query head, batch). Warpgroup 0
// is the producer: one elected lane loads the Q tile and streams K and V tiles of
// kBlockN keys into a two-stage shared-memory pipeline with TMA (cutlass
// PipelineTmaAsync: a full and an empty mbarrier per stage); it gives most of its
// registers to the consumers (setmaxnreg). Warpgroups 1 and 2 each own 64 query rows:
// S = Q K^T by wgmma with both operands in shared memory, the online softmax on the
// accumulators in registers (exp2 domain, scale * log2(e) folded in), P rounded to the
// input dtype in registers, and O += P V by wgmma with P from registers. The two
// products of consecutive key tiles overlap: S of tile n-1 is issued before P V of
// tile n, and the softmax of tile n-1 runs while P V of tile n is on the tensor cores
// (FlashAttention-3's intra-warpgroup pipelining); a pair of named barriers lets the two
// consumer warpgroups take turns issuing their products (FA-3's ping-pong). Key tiles are
// visited from the last to the first, so the tiles that need masking (the seq_k
// boundary, the causal diagonal) come first.
//
// Conventions are those of the other forward kernels (ja/kernels/mha.h): bottom-right
// causal alignment, rows with no visible key get output 0 and lse = +inf, lse is the
// natural log. Rows and keys past the ends of q, k and v are zero-filled by the TMA
// unit and masked; out and lse are stored only for rows < seq_q.
//
// Its speed against cuDNN: `python3 benchmarks/gpu/bench_gpu.py --only attention [--head-dim D]` on an
// H200 (the numbers live in that run's output, not here). Left to try: kBlockN = 176 without causal
// (FA-3's choice at d128), an epilogue through shared memory (16-byte or TMA stores), a persistent grid.
// Causal blocks start heaviest first across the heads and batches of a chunk that one wave of blocks covers
// (mha_gpu::grid_place, causal_chunk: the measurements are there).
//
// Built only for sm_90a (the gpu_sm90a kind of the mha_fwd module in
// jax_aiter/jit/optCompilerConfig.json), with the CUTLASS/CuTe headers of the pinned
// nvidia-cutlass package; mha_fwd_sm90.inst.in wraps it and mha_fwd_dispatch.cpp calls
// it before the mma.sync kernels when the device is sm_90 (JA_MHA_FWD_SM90=0 turns it off).
#pragma once
#include <atomic>
#include <cstdint>
#include <type_traits>

#include <cute/tensor.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/arch/mma_sm90.hpp>
#include <cute/arch/mma_sm90_gmma_ext.hpp>    // the 64x80x16 wgmma (head dim 256's S = Q K^T)
#include <cute/atom/mma_traits_sm90_gmma_ext.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/cutlass.h>
#include <cutlass/numeric_conversion.h>
#include <cutlass/numeric_types.h>
#include <cutlass/pipeline/pipeline.hpp>

#include "ja/kernels/mha.h"
#include "mha/mha_fwd_gpu_decode.cuh"

namespace ja {
namespace mha_sm90 {

using namespace cute;

template <typename T> struct CutlassType;
template <> struct CutlassType<bf16_t> { using type = cutlass::bfloat16_t; };
template <> struct CutlassType<f16_t> { using type = cutlass::half_t; };

// A [batch, seq, heads, D] array in global memory as the (seq, D, heads, batch) tensor the TMA
// copies of the forward and the backward use: read-only (Element const) from a const pointer,
// writable from a mutable one (the backward's dQ accumulator).
template <typename Element, int D, typename P>
CUTE_HOST_DEVICE auto bshd_tensor(P* ptr, int seq, int heads, int batch) {
  using E = std::conditional_t<std::is_const_v<P>, Element const, Element>;
  return make_tensor(make_gmem_ptr(static_cast<E*>(ptr)), make_shape(seq, int(D), heads, batch),
                     make_stride(int64_t(heads) * D, _1{}, int64_t(D), int64_t(seq) * heads * D));
}

// Head dims with a Hopper instance (the others keep the mma.sync kernel).
constexpr bool supported_head_dim(int d) { return d == 64 || d == 128 || d == 256; }

template <typename Element_, int D>
struct Traits {
  using Element = Element_;
  static constexpr int kHeadDim = D;
  static constexpr int kBlockM = 128;                 // query rows per block: 2 consumer warpgroups x 64
  static constexpr int kBlockN = D <= 128 ? 128 : 80;  // keys per tile (D = 256: what fits 2 stages)
  static constexpr int kStages = 2;
  static constexpr int kConsumers = 2;  // consumer warpgroups
  static constexpr int kMmaThreads = 128 * kConsumers;
  static constexpr int kThreads = kMmaThreads + 128;
  static_assert(D % 64 == 0, "the 128-byte swizzled tiles need head_dim % 64 == 0");

  using TileShape = Shape<Int<kBlockM>, Int<kBlockN>, Int<D>>;
  using AtomLayout = Layout<Shape<Int<kConsumers>, _1, _1>>;
  // S = Q K^T. ss_op_selector only offers n = 8, 16, 32, 64, ... unless every extended shape is
  // compiled in (CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED): for kBlockN = 80 it picks 64x16x16, five
  // wgmmas per k step that read Q from shared memory five times. One 64x80x16 wgmma per k step
  // reads it once.
  using MmaAtom0 = std::conditional_t<
      kBlockN == 80,
      std::conditional_t<std::is_same_v<Element, cutlass::bfloat16_t>,
                         SM90::GMMA::MMA_64x80x16_F32BF16BF16_SS<GMMA::Major::K, GMMA::Major::K>,
                         SM90::GMMA::MMA_64x80x16_F32F16F16_SS<GMMA::Major::K, GMMA::Major::K>>,
      decltype(GMMA::ss_op_selector<Element, Element, float, TileShape>())>;
  static_assert(decltype(size<1>(typename MMA_Traits<MmaAtom0>::Shape_MNK{}))::value == kBlockN,
                "S = Q K^T should be one wgmma wide along the key tile (a narrower atom re-reads Q per slice)");
  using TiledMma0 = decltype(make_tiled_mma(MmaAtom0{}, AtomLayout{}));
  using TiledMma1 = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<Int<kBlockM>, Int<D>, Int<kBlockN>>, GMMA::Major::K,
                           GMMA::Major::MN>(),
      AtomLayout{}));

  using SmemLayoutQ = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{}, Shape<Int<kBlockM>, Int<D>>{}));
  using SmemLayoutK =
      decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{}, Shape<Int<kBlockN>, Int<D>, Int<kStages>>{}));
  // V^T as the B operand of O += P V: a view of the same bytes, (D, kBlockN, stage).
  using SmemLayoutVt = decltype(composition(
      SmemLayoutK{},
      make_layout(Shape<Int<D>, Int<kBlockN>, Int<kStages>>{}, Stride<Int<kBlockN>, _1, Int<kBlockN * D>>{})));

  using ShapeQKV = Shape<int32_t, int32_t, int32_t, int32_t>;  // (seq, head_dim, heads, batch)
  using StrideQKV = Stride<int64_t, _1, int64_t, int64_t>;
  using TmaQ = decltype(make_tma_copy(
      SM90_TMA_LOAD{},
      make_tensor(make_gmem_ptr(static_cast<Element const*>(nullptr)), ShapeQKV{}, StrideQKV{}), SmemLayoutQ{},
      Shape<Int<kBlockM>, Int<D>>{}, _1{}));
  using TmaKV = decltype(make_tma_copy(
      SM90_TMA_LOAD{},
      make_tensor(make_gmem_ptr(static_cast<Element const*>(nullptr)), ShapeQKV{}, StrideQKV{}),
      take<0, 2>(SmemLayoutK{}), Shape<Int<kBlockN>, Int<D>>{}, _1{}));

  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
  using PipelineState = typename Pipeline::PipelineState;

  static constexpr uint32_t kBytesQ = uint32_t(size(SmemLayoutQ{}) * sizeof(Element));
  static constexpr uint32_t kBytesKV = uint32_t(size(take<0, 2>(SmemLayoutK{})) * sizeof(Element));

  struct SharedStorage {
    array_aligned<Element, cosize_v<SmemLayoutQ>, 1024> q;
    array_aligned<Element, cosize_v<SmemLayoutK>, 1024> k;
    array_aligned<Element, cosize_v<SmemLayoutK>, 1024> v;
    cutlass::arch::ClusterTransactionBarrier barrier_q;
    typename Pipeline::SharedStorage pipeline_k;
    typename Pipeline::SharedStorage pipeline_v;
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= 227 * 1024, "MHA forward (sm90) tiles exceed shared memory");

  struct Params {
    TmaQ tma_q;
    TmaKV tma_k, tma_v;
    ShapeQKV shape_q, shape_k;
    Element* o;
    float* lse;
    int64_t o_row_stride, o_batch_stride;  // elements; o is [batch, seq_q, heads_q, D]
    int32_t heads_q, group;                // query heads per kv head
    float scale_log2;
    int64_t chunk;  // causal: (head, batch) pairs per chunk of the block order (causal_chunk)
  };
};

// Named barriers (ids after cutlass's reserved ones): the consumer warpgroups' turns.
enum : int { kBarrierWG1 = 1, kBarrierWG2 = 2 };

template <int kNRows>
struct Softmax {
  float row_max[kNRows], row_sum[kNRows];
};

// Accumulator layout ((2, 2, V), MMA_M, MMA_N) as (rows = (2, MMA_M), cols = (2, V, MMA_N)).
template <typename Layout>
CUTE_DEVICE auto acc_rowcol(Layout l) {
  static_assert(decltype(rank<0>(l))::value == 3 && decltype(rank(l))::value == 3);
  return make_layout(make_layout(get<0, 1>(l), get<1>(l)), make_layout(get<0, 0>(l), get<0, 2>(l), get<2>(l)));
}

// The same registers as the A operand of an RS wgmma with k = 16: ((2, 2, 2), MMA_M, (V / 2, MMA_N)).
template <typename Layout>
CUTE_DEVICE auto acc_as_a(Layout l) {
  auto d = logical_divide(get<0>(l), Shape<Underscore, Underscore, _2>{});
  return make_layout(make_layout(get<0>(d), get<1>(d), get<2, 0>(d)), get<1>(l), make_layout(get<2, 1>(d), get<2>(l)));
}

CUTE_DEVICE float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
CUTE_DEVICE float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// Issues (and commits) C (+)= A B over the k blocks; waits for all but WAIT groups when WAIT >= 0.
template <bool ZERO_INIT, int WAIT, typename TiledMma, typename TA, typename TB, typename TC>
CUTE_DEVICE void gemm(TiledMma& mma, TA const& a, TB const& b, TC& c) {
  constexpr bool kRS = !is_base_of<GMMA::DescriptorIterator, typename TiledMma::FrgTypeA>::value;
  if constexpr (kRS) warpgroup_fence_operand(const_cast<TA&>(a));
  warpgroup_fence_operand(c);
  warpgroup_arrive();
  if constexpr (ZERO_INIT) mma.accumulate_ = GMMA::ScaleOut::Zero;
  CUTLASS_PRAGMA_UNROLL
  for (int kb = 0; kb < size<2>(a); ++kb) {
    cute::gemm(mma, a(_, _, kb), b(_, _, kb), c);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  if constexpr (WAIT >= 0) warpgroup_wait<WAIT>();
  warpgroup_fence_operand(c);
  if constexpr (kRS) warpgroup_fence_operand(const_cast<TA&>(a));
}

template <typename Tr, bool CAUSAL>
__global__ void __launch_bounds__(Tr::kThreads, 1) mha_fwd_sm90_kernel(CUTE_GRID_CONSTANT typename Tr::Params const p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Element = typename Tr::Element;
  constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN;
  using TileQ = Shape<Int<BM>, Int<Tr::kHeadDim>>;
  using TileKV = Shape<Int<BN>, Int<Tr::kHeadDim>>;
  using Pipeline = typename Tr::Pipeline;
  using PipelineState = typename Tr::PipelineState;

  extern __shared__ __align__(1024) char smem_raw[];
  auto& ss = *reinterpret_cast<typename Tr::SharedStorage*>(smem_raw);

  // Causal: the longest rows (each head's last query tile) start first (mha_gpu::grid_place).
  const mha_gpu::GridPlace at = mha_gpu::grid_place(CAUSAL, true, p.chunk);
  const int m_block = int(at.tile), h = int(at.head), b = int(at.batch);
  const int hk = h / p.group;
  const int sq = get<0>(p.shape_q), sk = get<0>(p.shape_k);
  const int warp = cutlass::canonical_warp_idx_sync();
  const int wg = cutlass::canonical_warp_group_idx();
  const bool lane_leader = cute::elect_one_sync();

  int n_blocks = (sk + BN - 1) / BN;
  if (CAUSAL) {
    const int last = (m_block + 1) * BM + sk - sq;  // one past the last key the tile's last row sees
    n_blocks = min(n_blocks, last <= 0 ? 0 : (last + BN - 1) / BN);
  }

  if (warp == 0 && lane_leader) {
    cute::prefetch_tma_descriptor(p.tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(p.tma_k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(p.tma_v.get_tma_descriptor());
    ss.barrier_q.init(1);
  }
  typename Pipeline::Params pp;
  pp.transaction_bytes = Tr::kBytesKV;
  pp.role = wg == 0 ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
  pp.is_leader = threadIdx.x % 128 == 0;
  pp.num_consumers = Tr::kMmaThreads;
  Pipeline pipe_k(ss.pipeline_k, pp, Shape<_1, _1, _1>{});
  Pipeline pipe_v(ss.pipeline_v, pp, Shape<_1, _1, _1>{});
  __syncthreads();  // barrier init visible to every thread

  Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename Tr::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Tr::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename Tr::SmemLayoutK{});

  if (wg == 0) {  // producer
    cutlass::arch::warpgroup_reg_dealloc<24>();
    if (warp == 0 && n_blocks > 0) {
      Tensor mQ = p.tma_q.get_tma_tensor(p.shape_q);
      Tensor mK = p.tma_k.get_tma_tensor(p.shape_k);
      Tensor mV = p.tma_v.get_tma_tensor(p.shape_k);
      Tensor gQ = local_tile(mQ(_, _, h, b), TileQ{}, make_coord(m_block, _0{}));                 // (BM, D)
      Tensor gK = local_tile(mK(_, _, hk, b), TileKV{}, make_coord(_, _0{}));                     // (BN, D, n)
      Tensor gV = local_tile(mV(_, _, hk, b), TileKV{}, make_coord(_, _0{}));
      Tensor sQx = make_tensor(sQ.data(), make_layout(sQ.layout(), Layout<_1>{}));
      Tensor gQx = make_tensor(gQ.data(), make_layout(gQ.layout(), Layout<_1>{}));
      auto [tQg, tQs] = tma_partition(p.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQx), group_modes<0, 2>(gQx));
      auto [tKg, tKs] = tma_partition(p.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
      auto [tVg, tVs] = tma_partition(p.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));
      PipelineState wk = cutlass::make_producer_start_state<Pipeline>();
      PipelineState wv = cutlass::make_producer_start_state<Pipeline>();
      if (lane_leader) {
        ss.barrier_q.arrive_and_expect_tx(Tr::kBytesQ);
        copy(p.tma_q.with(reinterpret_cast<cutlass::arch::ClusterTransactionBarrier::ValueType&>(ss.barrier_q), 0),
             tQg, tQs);
        for (int n = n_blocks - 1; n >= 0; --n) {
          pipe_k.producer_acquire(wk);
          copy(p.tma_k.with(*pipe_k.producer_get_barrier(wk), 0), tKg(_, n), tKs(_, wk.index()));
          ++wk;
          pipe_v.producer_acquire(wv);
          copy(p.tma_v.with(*pipe_v.producer_get_barrier(wv), 0), tVg(_, n), tVs(_, wv.index()));
          ++wv;
        }
      }
    }
    return;
  }

  // Consumers: warpgroup wg owns rows [64 (wg - 1), 64 wg) of the tile.
  cutlass::arch::warpgroup_reg_alloc<240>();
  const int tid = int(threadIdx.x) - 128;
  typename Tr::TiledMma0 mma0;
  typename Tr::TiledMma1 mma1;
  auto thr0 = mma0.get_thread_slice(tid);
  auto thr1 = mma1.get_thread_slice(tid);
  Tensor sVt = make_tensor(make_smem_ptr(ss.v.data()), typename Tr::SmemLayoutVt{});
  Tensor tSrQ = thr0.partition_fragment_A(sQ);
  Tensor tSrK = thr0.partition_fragment_B(sK);
  Tensor tOrV = thr1.partition_fragment_B(sVt);
  Tensor tOrO = partition_fragment_C(mma1, TileQ{});
  clear(tOrO);
  mma1.accumulate_ = GMMA::ScaleOut::One;

  Tensor cS = make_identity_tensor(Shape<Int<BM>, Int<BN>>{});
  Tensor tScS = thr0.partition_C(cS);
  Tensor tScS_rc = make_tensor(tScS.data(), acc_rowcol(tScS.layout()));
  constexpr int kRows = decltype(size<0>(tScS_rc))::value;  // rows of this thread (2)
  float row_max[kRows], row_sum[kRows], scale_o[kRows];
  CUTLASS_PRAGMA_UNROLL
  for (int r = 0; r < kRows; ++r) row_max[r] = -INFINITY, row_sum[r] = 0.0f, scale_o[r] = 1.0f;
  const float s2 = p.scale_log2;

  // Masks keys >= seq_k and (causal) keys above the diagonal in key tile n.
  auto mask = [&](auto& tSrS, int n, bool causal_part) {
    Tensor s = make_tensor(tSrS.data(), acc_rowcol(tSrS.layout()));
    const int key_end = sk - n * BN;
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kRows; ++r) {
      int limit = key_end;
      if (CAUSAL && causal_part) {
        const int row = int(get<0>(tScS_rc(r, 0)));
        limit = min(limit, row + 1 + sk - sq + m_block * BM - n * BN);
      }
      CUTLASS_PRAGMA_UNROLL
      for (int c = 0; c < size<1>(s); ++c)
        if (int(get<1>(tScS_rc(r, c))) >= limit) s(r, c) = -INFINITY;
    }
  };
  // Online softmax of a score tile: new row maxima, O's rescale factors, P = exp2(s * s2 - max * s2).
  auto softmax = [&](auto& tSrS, bool first) {
    Tensor s = make_tensor(tSrS.data(), acc_rowcol(tSrS.layout()));
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kRows; ++r) {
      float mx = first ? -INFINITY : row_max[r];
      CUTLASS_PRAGMA_UNROLL
      for (int c = 0; c < size<1>(s); ++c) mx = fmaxf(mx, s(r, c));
      mx = quad_max(mx);
      // A row that has seen no key yet keeps max -inf: use 0 so exp2 gives 0, never NaN.
      const float m_use = mx == -INFINITY ? 0.0f : mx * s2;
      scale_o[r] = first ? 1.0f : ja_exp2_approx(row_max[r] * s2 - m_use);
      row_max[r] = mx;
      float sum = 0.0f;
      CUTLASS_PRAGMA_UNROLL
      for (int c = 0; c < size<1>(s); ++c) {
        s(r, c) = ja_exp2_approx(s(r, c) * s2 - m_use);
        sum += s(r, c);
      }
      row_sum[r] = (first ? 0.0f : row_sum[r] * scale_o[r]) + sum;
    }
  };
  auto rescale_o = [&]() {
    Tensor o = make_tensor(tOrO.data(), acc_rowcol(tOrO.layout()));
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kRows; ++r)
      CUTLASS_PRAGMA_UNROLL
      for (int c = 0; c < size<1>(o); ++c) o(r, c) *= scale_o[r];
  };
  Tensor tSrS0 = partition_fragment_C(mma0, Shape<Int<BM>, Int<BN>>{});
  Tensor tOrP = make_tensor<Element>(acc_as_a(tSrS0.layout()));
  auto to_p = [&](auto const& tSrS) {
    constexpr int N = decltype(size(tSrS))::value;
    cutlass::NumericArrayConverter<Element, float, N> cvt;
    *reinterpret_cast<cutlass::Array<Element, N>*>(tOrP.data()) =
        cvt(*reinterpret_cast<cutlass::Array<float, N> const*>(tSrS.data()));
  };
  auto wait = [](Pipeline& pipe, PipelineState& st) {
    auto token = pipe.consumer_try_wait(st);
    pipe.consumer_wait(st, token);
  };
  // Ping-pong: warpgroup 1 issues first, then they alternate.
  auto turn_wait = [&]() { cutlass::arch::NamedBarrier::sync(Tr::kMmaThreads, wg == 1 ? kBarrierWG1 : kBarrierWG2); };
  auto turn_pass = [&]() { cutlass::arch::NamedBarrier::arrive(Tr::kMmaThreads, wg == 1 ? kBarrierWG2 : kBarrierWG1); };

  if (n_blocks > 0) {
    if (wg == 2) cutlass::arch::NamedBarrier::arrive(Tr::kMmaThreads, kBarrierWG1);
    PipelineState rk, rv;
    ss.barrier_q.wait(0);
    int n = n_blocks - 1;
    {
      Tensor tSrS = partition_fragment_C(mma0, Shape<Int<BM>, Int<BN>>{});
      wait(pipe_k, rk);
      turn_wait();
      gemm<true, -1>(mma0, tSrQ, tSrK(_, _, _, rk.index()), tSrS);
      turn_pass();
      warpgroup_wait<0>();
      pipe_k.consumer_release(rk);
      ++rk;
      mask(tSrS, n, true);
      softmax(tSrS, true);
      to_p(tSrS);
    }
    // One step: S of tile n - 1 while P V of tile n runs. MASKED: tile n - 1 may cross the causal diagonal.
    auto step = [&](auto masked) {
      Tensor tSrS = partition_fragment_C(mma0, Shape<Int<BM>, Int<BN>>{});
      wait(pipe_k, rk);
      turn_wait();
      gemm<true, -1>(mma0, tSrQ, tSrK(_, _, _, rk.index()), tSrS);  // S of tile n - 1
      rescale_o();                                                   // O for tile n's maxima
      wait(pipe_v, rv);
      gemm<false, -1>(mma1, tOrP, tOrV(_, _, _, rv.index()), tOrO);  // O += P V of tile n
      turn_pass();
      warpgroup_wait<1>();
      pipe_k.consumer_release(rk);
      if constexpr (decltype(masked)::value) mask(tSrS, n - 1, true);
      softmax(tSrS, false);
      warpgroup_wait<0>();
      pipe_v.consumer_release(rv);
      ++rk;
      ++rv;
      to_p(tSrS);
    };
    // Causal: the tiles after the first that may cross the diagonal come first, masked; the rest
    // need no mask (two loops, so the unmasked one carries no test).
    if constexpr (CAUSAL) {
      constexpr int kMaskSteps = (BM + BN - 1) / BN;
      CUTLASS_PRAGMA_NO_UNROLL
      for (int i = 0; i < kMaskSteps && n > 0; ++i, --n) step(cute::true_type{});
    }
    CUTLASS_PRAGMA_NO_UNROLL
    for (; n > 0; --n) step(cute::false_type{});
    rescale_o();
    wait(pipe_v, rv);
    gemm<false, 0>(mma1, tOrP, tOrV(_, _, _, rv.index()), tOrO);
    pipe_v.consumer_release(rv);
  }

  // Epilogue: normalise, store rows < seq_q of out and lse.
  Tensor cO = make_identity_tensor(TileQ{});
  Tensor tOcO = thr1.partition_C(cO);
  Tensor tOcO_rc = make_tensor(tOcO.data(), acc_rowcol(tOcO.layout()));
  Tensor o = make_tensor(tOrO.data(), acc_rowcol(tOrO.layout()));
  static_assert(decltype(size<0>(tOcO_rc))::value == kRows);
  Element* out = p.o + int64_t(b) * p.o_batch_stride + int64_t(h) * get<1>(p.shape_q);
  float* lse = p.lse + (int64_t(b) * p.heads_q + h) * sq;
  CUTLASS_PRAGMA_UNROLL
  for (int r = 0; r < kRows; ++r) {
    const float sum = quad_sum(row_sum[r]);
    const bool empty = !(sum > 0.0f);  // no visible key: output 0, lse = +inf
    const float inv = empty ? 0.0f : 1.0f / sum;
    const int row = m_block * BM + int(get<0>(tOcO_rc(r, 0)));
    if (row >= sq) continue;
    Element* orow = out + int64_t(row) * p.o_row_stride;
    CUTLASS_PRAGMA_UNROLL
    for (int c = 0; c < size<1>(o); c += 2) {  // columns c and c + 1 are adjacent
      const int col = int(get<1>(tOcO_rc(r, c)));
      cutlass::Array<Element, 2> v;
      v[0] = Element(o(r, c) * inv);
      v[1] = Element(o(r, c + 1) * inv);
      *reinterpret_cast<cutlass::Array<Element, 2>*>(orow + col) = v;
    }
    if (int(get<1>(tOcO_rc(r, 0))) == 0)
      lse[row] = empty ? INFINITY : row_max[r] * s2 * 0.6931471805599453f + __logf(sum);
  }
#else
  __trap();  // built for another target than sm_90a: never launched (the host checks the device)
#endif
}

// The (head, batch) pairs per chunk of a causal grid's block order (mha_gpu::grid_place) for the Hopper
// forward and backward, which hold one block per multiprocessor (their registers): as many as one wave of
// blocks covers, floor(multiprocessors / tiles a head), at least 1. Measured (H200, bf16, head dim 128,
// causal, chunks of 1, 2, 4, 8, 16 and all pairs, one run): the best chunk was 16, 8, 4 and 2 pairs at
// 8, 16, 32 and 64 tiles a head (b4 s1024 and b4 s4096 with 32 heads, b4 s2048 and b1 s8192 with 32 query
// and 8 kv heads) within the runs' noise, this rule's; one chunk of all pairs took up to 1.3x as long (the
// backward at b4 s4096: 4.28 against 3.28-3.34 ms), and one pair a chunk up to 1.2x (the backward at b4
// s2048 with 8 kv heads: 1.04 against 0.87 ms). At head dim 256 (16 query / 8 kv heads; b4 s2048, b2 s4096,
// b1 s8192; one run) the rule's forward was within 1% of the best chunk and its backward 1-3% slower than the
// best (twice the rule's chunk), where one chunk of all pairs took up to 1.17x (the backward at b4 s2048: 1.53
// against 1.31 ms); in the model's head-dim-256 train step the rule and one chunk of all pairs gave the same
// ratio to plain JAX within the runs' noise (1.007 and 1.012 against 1.006 and 1.005, alternating runs).
inline int64_t causal_chunk(int64_t tiles) {
  const int64_t per = mha_gpu::multiprocessors() / (tiles > 0 ? tiles : 1);
  return per > 0 ? per : 1;
}

template <typename T, int D, bool CAUSAL>
const char* mha_fwd_sm90_launch(const JaMhaFwdArgs& a, cudaStream_t stream) {
  using Tr = Traits<typename CutlassType<T>::type, D>;
  using Element = typename Tr::Element;
  const int sq = int(a.p.seq_q), sk = int(a.p.seq_k), hq = int(a.p.heads_q), hkv = int(a.p.heads_kv), bt = int(a.p.batch);
  auto tensor = [&](const void* ptr, int seq, int heads) { return bshd_tensor<Element, D>(ptr, seq, heads, bt); };
  const dim3 grid(unsigned((sq + Tr::kBlockM - 1) / Tr::kBlockM), unsigned(hq), unsigned(bt));
  typename Tr::Params p{
      make_tma_copy(SM90_TMA_LOAD{}, tensor(a.q, sq, hq), typename Tr::SmemLayoutQ{},
                    Shape<Int<Tr::kBlockM>, Int<D>>{}, _1{}),
      make_tma_copy(SM90_TMA_LOAD{}, tensor(a.k, sk, hkv), take<0, 2>(typename Tr::SmemLayoutK{}),
                    Shape<Int<Tr::kBlockN>, Int<D>>{}, _1{}),
      make_tma_copy(SM90_TMA_LOAD{}, tensor(a.v, sk, hkv), take<0, 2>(typename Tr::SmemLayoutK{}),
                    Shape<Int<Tr::kBlockN>, Int<D>>{}, _1{}),
      make_shape(sq, int(D), hq, bt),
      make_shape(sk, int(D), hkv, bt),
      static_cast<Element*>(a.o),
      a.lse,
      int64_t(hq) * D,
      int64_t(sq) * hq * D,
      hq,
      hq / hkv,
      a.p.scale * ja_log2e,
      causal_chunk(grid.x)};  // read only by causal grids (grid_place)
  return mha_gpu::launch_with_smem(mha_fwd_sm90_kernel<Tr, CAUSAL>, grid, Tr::kThreads, Tr::kSmemBytes, stream, p,
                                   "mha_fwd (sm90)");
}

// Whether the current device runs the sm_90a instances (compute capability 9.0; cached per device).
inline bool device_is_sm90() {
  static std::atomic<int> cache[64];  // 1 no, 2 yes
  const int dev = ja::current_device();
  if (dev < 0) return false;
  return ja::per_device(cache, dev, [](int d) { return ja::compute_capability(d) == 90 ? 2 : 1; }) == 2;
}

// Runs the Hopper kernel when it applies: sets *handled and returns the launch status;
// otherwise leaves *handled = 0 and the caller takes the mma.sync / SIMT / decode path.
// It does not apply on another device, to empty shapes, to decode shapes (few query rows
// per kv head: the split-KV kernel), to unaligned pointers, or to sizes past int32.
template <typename T, int D, bool CAUSAL>
const char* mha_fwd_sm90(const JaMhaFwdArgs& a, void* stream, int* handled) {
  *handled = 0;
  const int64_t lim = int64_t(1) << 30;
  if (a.p.batch <= 0 || a.p.seq_q <= 0 || a.p.seq_k <= 0 || a.p.heads_q <= 0 || a.p.heads_kv <= 0) return nullptr;
  if (a.p.batch >= 65536 || a.p.heads_q >= 65536 || a.p.seq_q >= lim || a.p.seq_k >= lim) return nullptr;
  if (!mha_gpu::aligned16(a.q) || !mha_gpu::aligned16(a.k) || !mha_gpu::aligned16(a.v) || !mha_gpu::aligned16(a.o))
    return nullptr;
  if (mha_gpu::decode_applies(a) || !device_is_sm90()) return nullptr;
  if (mha_unhandled_feature(a.p, mha_gpu::kFwdSm90Features)) return nullptr;
  *handled = 1;
  return mha_fwd_sm90_launch<T, D, CAUSAL>(a, static_cast<cudaStream_t>(stream));
}

}  // namespace mha_sm90
}  // namespace ja
