// Flash-attention forward for Hopper (sm_90a): warpgroup MMA fed by TMA.
//
// One block of three warpgroups per (128 query rows, query head, batch). Warpgroup 0
// is the producer: one elected lane loads the Q tile and streams K and V tiles of
// kBlockN keys into a two-stage shared-memory pipeline with TMA (cutlass
// PipelineTmaAsync: a full and an empty mbarrier per stage); it gives most of its
// registers to the consumers (setmaxnreg). Warpgroups 1 and 2 each own 64 query rows:
// S = Q K^T by wgmma with both operands in shared memory, the online softmax on the
// accumulators in registers (exp2 domain, log2(e) folded in), P rounded to the
// input dtype in registers, and O += P V by wgmma with P from registers. The two
// products of consecutive key tiles overlap: S of tile n-1 is issued before P V of
// tile n, and the softmax of tile n-1 runs while P V of tile n is on the tensor cores
// (FlashAttention-3's intra-warpgroup pipelining); a pair of named barriers lets the two
// consumer warpgroups take turns issuing their products (FA-3's ping-pong).
//
// The mask (ja/kernels/mha.h): every row i sees the keys [lo_i, hi_i) (NONE: [0, seq_k); CAUSAL:
// bottom-right aligned; ROWS: read from `rows`: windows, varlen, segments). As lo and hi are
// non-decreasing, the block's rows see keys [lo of its first row, hi of its last row) in all, and
// key tiles outside that range are never loaded or computed. Tiles wholly inside [lo of the last
// row, hi of the first row) are seen whole by every row and take no per-element mask; the others
// (the tiles that straddle a row's lo or hi, and the seq_k boundary) are masked element by element.
// Key tiles are visited from the last to the first: the masked tiles on the right (the diagonal),
// then the unmasked ones, then the masked ones on the left (a window's or a document's start).
//
// The score's terms (kernels per SOFTCAP x ALIBI, taken when a call has them): the softmax runs on x in
// units u of the score (s = u x; the exponent's factor is u log2(e)): u = scale and x = q.k without softcap
// (as the plain kernel), u = softcap and x = tanh(q.k * scale / softcap) with it, with tanh.approx.f32
// (relative error about 2^-11, on the multifunction unit beside exp2: one more of its operations per
// score, where a tanh from exp2 and a reciprocal would take two); ALiBi adds -slope / u * |diag_i - j|
// (computed in float32 as |float(diag_i - tile start) - column|, exact below 2^24 keys). ALiBi without
// softcap at scale 0 has no such unit and is declined. With softcap, two multifunction operations a score
// (tanh, exp2) outlast the tensor cores' work on the tile at head dim 128, so a fraction of the exp2s
// (every kSoftcapEmu-th column) runs on the FMA pipe instead (exp2_fma: a degree-3 polynomial, relative
// error below 7.8e-5, under the rounding of P to the input dtype; exactly 0 for masked scores).
//
// Head dims: a kernel of head dim D (sm90/dims.h: 64, 96, 128, 192, 256) runs any d, d_v <= D that
// are multiples of 8; TMA fills the columns past the tensor's d with zeros (Q K^T adds 0, the extra
// columns of P V are not stored). The 192 kernel (held by the 256 instance) runs d_v <= 128 with a
// 128-column V (DV = 128).
//
// Conventions are those of the other forward kernels (ja/kernels/mha.h): rows with no visible key get
// output 0 and lse = +inf, lse is the natural log. Rows and keys past the ends of q, k and v are
// zero-filled by the TMA unit and masked; out and lse are stored only for rows < seq_q. A key a row does
// not see never enters its softmax, but in a tile that straddles the mask its V row is still multiplied
// by P = 0, and IEEE 0 * NaN is NaN: a row whose output comes out non-finite is computed again, exactly,
// over the keys it sees (common/exact.cuh), so NaN or Inf reaches a row only when the row sees it.
// Tiles wholly outside the mask are never read.
//
// Its speed against cuDNN: `python3 benchmarks/gpu/bench_gpu.py --only attention [--head-dim D]` on an
// H200 (the numbers live in that run's output, not here); kernel-level timings of each feature against
// the plain kernel: benchmarks/gpu/check_mha_fwd_sm90.cu. Left to try: kBlockN = 176 without causal
// (FA-3's choice at d128), an epilogue through shared memory (16-byte or TMA stores), a persistent grid.
// Causal blocks start heaviest first across the heads and batches of a chunk that one wave of blocks covers
// (mha_gpu::grid_place, causal_chunk: the reasons are there).
//
// Built only for sm_90a (the gpu_sm90a kind of the mha_fwd module in
// jax_aiter/jit/optCompilerConfig.json), with the CUTLASS/CuTe headers of the pinned
// nvidia-cutlass package; sm90/fwd.inst.in wraps it (its launch: sm90/fwd_launch.cuh) and fwd_dispatch.cpp
// calls it before the mma.sync kernels when the device is sm_90 (unless the call names another family:
// implementation=).
#pragma once
#include "mha/common/exact.cuh"
#include "mha/sm90/fwd_args.cuh"

namespace ja {
namespace mha_sm90 {

// SOFTCAP, ALIBI: the score's terms; EMU > 0: every EMU-th column's exp2 on the FMA pipe (exp2_fma).
template <typename Tr, bool CAUSAL, bool SOFTCAP, bool ALIBI, int EMU>
__global__ void __launch_bounds__(Tr::kThreads, 1) mha_fwd_sm90_kernel(CUTE_GRID_CONSTANT typename Tr::Params const p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Element = typename Tr::Element;
  constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN;
  using TileQ = Shape<Int<BM>, Int<Tr::kHeadDim>>;
  using TileK = Shape<Int<BN>, Int<Tr::kHeadDim>>;
  using TileV = Shape<Int<BN>, Int<Tr::kHeadDimV>>;
  using TileO = Shape<Int<BM>, Int<Tr::kHeadDimV>>;
  using Pipeline = typename Tr::Pipeline;
  using PipelineState = typename Tr::PipelineState;

  extern __shared__ __align__(1024) char smem_raw[];
  auto& ss = *reinterpret_cast<typename Tr::SharedStorage*>(smem_raw);

  // Causal: the longest rows (each head's last query tile) start first (mha_gpu::grid_place).
  const mha_gpu::GridPlace at = mha_gpu::grid_place(CAUSAL, true, p.chunk);
  const int m_block = int(at.tile), h = int(at.head), b = int(at.batch);
  const int hk = h / p.group;
  const int sq = get<0>(p.shape_q);
  const int warp = cutlass::canonical_warp_idx_sync();
  const int wg = cutlass::canonical_warp_group_idx();
  const bool lane_leader = cute::elect_one_sync();

  // The block's rows [r0, r1] see keys [first.lo, last.hi) in all: key tiles [n_min, n_max).
  const int r0 = m_block * BM, r1 = min(sq, r0 + BM) - 1;
  const MhaRow first = sm90_row<CAUSAL>(p.pr, b, r0), last = sm90_row<CAUSAL>(p.pr, b, r1);
  const int n_min = int(first.lo) / BN;
  const int n_max = last.hi > first.lo ? int(last.hi + BN - 1) / BN : n_min;

  if (warp == 0 && lane_leader) {
    cute::prefetch_tma_descriptor(p.tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(p.tma_k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(p.tma_v.get_tma_descriptor());
    ss.barrier_q.init(1);
  }
  typename Pipeline::Params pk, pv;
  pk.role = wg == 0 ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
  pk.is_leader = threadIdx.x % 128 == 0;
  pk.num_consumers = Tr::kMmaThreads;
  pv = pk;
  pk.transaction_bytes = Tr::kBytesK;
  pv.transaction_bytes = Tr::kBytesV;
  Pipeline pipe_k(ss.pipeline_k, pk, Shape<_1, _1, _1>{});
  Pipeline pipe_v(ss.pipeline_v, pv, Shape<_1, _1, _1>{});
  __syncthreads();  // barrier init visible to every thread

  Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename Tr::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Tr::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename Tr::SmemLayoutV{});

  if (wg == 0) {  // producer
    cutlass::arch::warpgroup_reg_dealloc<24>();
    if (warp == 0 && n_max > n_min) {
      Tensor mQ = p.tma_q.get_tma_tensor(p.shape_q);
      Tensor mK = p.tma_k.get_tma_tensor(p.shape_k);
      Tensor mV = p.tma_v.get_tma_tensor(p.shape_v);
      Tensor gQ = local_tile(mQ(_, _, h, b), TileQ{}, make_coord(m_block, _0{}));  // (BM, D)
      Tensor gK = local_tile(mK(_, _, hk, b), TileK{}, make_coord(_, _0{}));      // (BN, D, n)
      Tensor gV = local_tile(mV(_, _, hk, b), TileV{}, make_coord(_, _0{}));      // (BN, DV, n)
      Tensor sQx = make_tensor(sQ.data(), make_layout(sQ.layout(), Layout<_1>{}));
      Tensor gQx = make_tensor(gQ.data(), make_layout(gQ.layout(), Layout<_1>{}));
      auto [tQg, tQs] = tma_partition(p.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQx), group_modes<0, 2>(gQx));
      auto [tKg, tKs] = tma_partition(p.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
      auto [tVg, tVs] = tma_partition(p.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));
      PipelineState wk = cutlass::make_producer_start_state<Pipeline>();
      PipelineState wv = cutlass::make_producer_start_state<Pipeline>();
      if (lane_leader) {
        ss.barrier_q.arrive_and_expect_tx(Tr::kBytesQ);
        copy(p.tma_q.with(reinterpret_cast<cutlass::arch::ClusterTransactionBarrier::ValueType&>(ss.barrier_q), 0), tQg,
             tQs);
        for (int n = n_max - 1; n >= n_min; --n) {
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
  Tensor tOrO = partition_fragment_C(mma1, TileO{});
  clear(tOrO);
  mma1.accumulate_ = GMMA::ScaleOut::One;

  Tensor cS = make_identity_tensor(Shape<Int<BM>, Int<BN>>{});
  Tensor tScS = thr0.partition_C(cS);
  Tensor tScS_rc = make_tensor(tScS.data(), acc_rowcol(tScS.layout()));
  // Thread 0's columns (known at compile time); this thread's are those plus col_off.
  Tensor t0ScS = mma0.get_thread_slice(0).partition_C(cS);
  Tensor t0ScS_rc = make_tensor(t0ScS.data(), acc_rowcol(t0ScS.layout()));
  const int col_off = int(get<1>(tScS_rc(0, 0)));
  constexpr int kRows = decltype(size<0>(tScS_rc))::value;  // rows of this thread (2)
  constexpr int kCols = decltype(size<1>(tScS_rc))::value;
  float row_max[kRows], row_sum[kRows], scale_o[kRows];
  // This thread's rows: the keys [lo, hi) each sees, less col_off (compared with thread 0's columns),
  // and (ALiBi) its diagonal less col_off. Rows past seq_q take the last row's (never stored).
  int lo_r[kRows], hi_r[kRows];
  float diag_r[kRows];
  CUTLASS_PRAGMA_UNROLL
  for (int r = 0; r < kRows; ++r) {
    row_max[r] = -INFINITY, row_sum[r] = 0.0f, scale_o[r] = 1.0f;
    const MhaRow row = sm90_row<CAUSAL>(p.pr, b, min(r0 + int(get<0>(tScS_rc(r, 0))), r1));
    lo_r[r] = int(row.lo) - col_off;
    hi_r[r] = int(row.hi) - col_off;
    diag_r[r] = float(int(row.diag) - col_off);
  }
  const float s2 = p.s2;
  float neg_slope = 0.0f;  // ALIBI: -slope / u of head h
  if constexpr (ALIBI) neg_slope = -p.alibi[int64_t(b) * p.alibi_batch_stride + h] * p.alibi_mul;

  // The score's terms (SOFTCAP, ALIBI) and the mask (MASKED) of key tile n, in place on the accumulators.
  auto score = [&](auto& tSrS, int n, auto masked) {
    Tensor s = make_tensor(tSrS.data(), acc_rowcol(tSrS.layout()));
    const int k0 = n * BN;
    if constexpr (SOFTCAP) {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(s); ++i) s(i) = tanh_approx(s(i) * p.tanh_in);
    }
    if constexpr (ALIBI) {
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < kRows; ++r) {
        const float d0 = diag_r[r] - float(k0);  // diag - (k0 + col_off): |d0 - col| = |diag - key|
        CUTLASS_PRAGMA_UNROLL
        for (int c = 0; c < kCols; ++c)
          s(r, c) = fmaf(neg_slope, fabsf(d0 - float(int(get<1>(t0ScS_rc(0, c))))), s(r, c));
      }
    }
    if constexpr (decltype(masked)::value) {
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < kRows; ++r) {
        const int lo = lo_r[r] - k0, hi = hi_r[r] - k0;
        CUTLASS_PRAGMA_UNROLL
        for (int c = 0; c < kCols; ++c) {
          const int col = int(get<1>(t0ScS_rc(0, c)));
          if (col < lo || col >= hi) s(r, c) = -INFINITY;
        }
      }
    }
  };
  // Online softmax of a score tile: new row maxima, O's rescale factors, P = exp2(s * s2 - max * s2).
  auto softmax = [&](auto& tSrS, bool is_first) {
    Tensor s = make_tensor(tSrS.data(), acc_rowcol(tSrS.layout()));
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kRows; ++r) {
      float mx = is_first ? -INFINITY : row_max[r];
      CUTLASS_PRAGMA_UNROLL
      for (int c = 0; c < kCols; ++c) mx = fmaxf(mx, s(r, c));
      mx = quad_max(mx);
      // A row that has seen no key yet keeps max -inf: use 0 so exp2 gives 0, never NaN.
      const float m_use = mx == -INFINITY ? 0.0f : mx * s2;
      scale_o[r] = is_first ? 1.0f : ja_exp2_approx(row_max[r] * s2 - m_use);
      row_max[r] = mx;
      float sum = 0.0f;
      CUTLASS_PRAGMA_UNROLL
      for (int c = 0; c < kCols; ++c) {
        const float x = s(r, c) * s2 - m_use;
        s(r, c) = EMU > 0 && c % (EMU > 0 ? EMU : 1) == EMU - 1 ? exp2_fma(x) : ja_exp2_approx(x);
        sum += s(r, c);
      }
      row_sum[r] = (is_first ? 0.0f : row_sum[r] * scale_o[r]) + sum;
    }
  };
  auto rescale_o = [&]() {
    Tensor o = make_tensor(tOrO.data(), acc_rowcol(tOrO.layout()));
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kRows; ++r) CUTLASS_PRAGMA_UNROLL
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

  if (n_max > n_min) {
    if (wg == 2) cutlass::arch::NamedBarrier::arrive(Tr::kMmaThreads, kBarrierWG1);
    PipelineState rk, rv;
    ss.barrier_q.wait(0);
    int n = n_max - 1;
    {
      Tensor tSrS = partition_fragment_C(mma0, Shape<Int<BM>, Int<BN>>{});
      wait(pipe_k, rk);
      turn_wait();
      gemm<true, -1>(mma0, tSrQ, tSrK(_, _, _, rk.index()), tSrS);
      turn_pass();
      warpgroup_wait<0>();
      pipe_k.consumer_release(rk);
      ++rk;
      score(tSrS, n, cute::true_type{});
      softmax(tSrS, true);
      to_p(tSrS);
    }
    // One step: S of tile n - 1 while P V of tile n runs. MASKED: tile n - 1 takes the per-element mask.
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
      score(tSrS, n - 1, masked);
      softmax(tSrS, false);
      warpgroup_wait<0>();
      pipe_v.consumer_release(rv);
      ++rk;
      ++rv;
      to_p(tSrS);
    };
    // Every row sees the whole of the key tiles [n_all_lo, n_all_hi) (empty where n_all_lo >= n_all_hi):
    // the tiles at or after max(n_all_lo, n_all_hi) come first, masked, then the unmasked ones, then the
    // masked ones before n_all_lo (three loops, so the unmasked one carries no test).
    const int n_all_lo = int(last.lo + BN - 1) / BN, n_all_hi = int(first.hi) / BN;
    const int n_right = max(n_all_lo, n_all_hi);
    CUTLASS_PRAGMA_NO_UNROLL
    for (; n > n_min && n - 1 >= n_right; --n) step(cute::true_type{});
    CUTLASS_PRAGMA_NO_UNROLL
    for (; n > n_min && n - 1 >= n_all_lo; --n) step(cute::false_type{});
    CUTLASS_PRAGMA_NO_UNROLL
    for (; n > n_min; --n) step(cute::true_type{});
    rescale_o();
    wait(pipe_v, rv);
    gemm<false, 0>(mma1, tOrP, tOrV(_, _, _, rv.index()), tOrO);
    pipe_v.consumer_release(rv);
  }

  // Epilogue: normalise, store rows < seq_q and columns < dv of out, and lse.
  Tensor cO = make_identity_tensor(TileO{});
  Tensor tOcO = thr1.partition_C(cO);
  Tensor tOcO_rc = make_tensor(tOcO.data(), acc_rowcol(tOcO.layout()));
  Tensor o = make_tensor(tOrO.data(), acc_rowcol(tOrO.layout()));
  static_assert(decltype(size<0>(tOcO_rc))::value == kRows);
  Element* out = p.o + int64_t(b) * p.o_batch_stride + int64_t(h) * p.dv;
  float* lse = p.lse + (int64_t(b) * p.heads_q + h) * sq;
  CUTLASS_PRAGMA_UNROLL
  for (int r = 0; r < kRows; ++r) {
    const float sum = quad_sum(row_sum[r]);
    const bool empty = !(sum > 0.0f);  // no visible key: output 0, lse = +inf
    const float inv = empty ? 0.0f : 1.0f / sum;
    const int row = r0 + int(get<0>(tOcO_rc(r, 0)));
    if (row >= sq) continue;
    Element* orow = out + int64_t(row) * p.o_row_stride;
    CUTLASS_PRAGMA_UNROLL
    for (int c = 0; c < size<1>(o); c += 2) {  // columns c and c + 1 are adjacent
      const int col = int(get<1>(tOcO_rc(r, c)));
      if (col >= p.dv) continue;  // dv is a multiple of 8: columns c and c + 1 fall on one side
      cutlass::Array<Element, 2> v;
      v[0] = Element(o(r, c) * inv);
      v[1] = Element(o(r, c + 1) * inv);
      *reinterpret_cast<cutlass::Array<Element, 2>*>(orow + col) = v;
    }
    if (int(get<1>(tOcO_rc(r, 0))) == 0)
      lse[row] = empty ? INFINITY : row_max[r] * s2 * 0.6931471805599453f + __logf(sum);
  }
  // Rows whose output came out NaN or infinite (a warp holds 16 whole rows): computed again, exactly, by the
  // warp (common/exact.cuh). Finite results pass this check only.
  {
    uint32_t bad = 0;
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kRows; ++r) {
      bool nf = !isfinite(row_sum[r]);
      CUTLASS_PRAGMA_UNROLL
      for (int c = 0; c < size<1>(o); ++c) nf |= !isfinite(o(r, c));
      if (nf) bad |= 1u << (int(get<0>(tOcO_rc(r, 0))) % 16);
    }
    bad = __reduce_or_sync(0xffffffffu, bad);
    if (bad) {
      __syncwarp();  // this warp's stores above come first
      const int base = r0 + (int(get<0>(tOcO_rc(0, 0))) & ~15);
      for (; bad; bad &= bad - 1) {
        const int row = base + __ffs(bad) - 1;
        if (row < sq)
          mha_gpu::exact_fwd_row(p.pr, p.q, p.k, p.v, p.o, p.lse, b, h, row, sm90_row<CAUSAL>(p.pr, b, row));
      }
    }
  }
#else
  __trap();  // built for another target than sm_90a: never launched (the host checks the device)
#endif
}

}  // namespace mha_sm90
}  // namespace ja
