// What the Hopper (sm_90a) attention kernels share, forward and backward: CuTe helpers (the CUTLASS element
// types, the [batch, seq, heads, d] tensors of the TMA copies, swizzle and wgmma atoms, the accumulators' row and
// column views, warpgroup GEMMs), the score's device functions (tanh and exp2 approximations, a row's keys), and
// the host's questions (does this device run sm_90a code; does a kernel apply to a call; the causal grid's chunk).
#pragma once
#include <atomic>
#include <cstdint>
#include <type_traits>

#include <cute/tensor.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/arch/mma_sm90.hpp>
#include <cute/arch/mma_sm90_gmma_ext.hpp>    // the 64 x {48, 80, 112} x 16 wgmmas (ss_atom)
#include <cute/atom/mma_traits_sm90_gmma_ext.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/cutlass.h>
#include <cutlass/numeric_conversion.h>
#include <cutlass/numeric_types.h>
#include <cutlass/pipeline/pipeline.hpp>

#include "ja/kernels/mha.h"
#include "ja/kernels/mha_features.h"
#include "gpu_launch.cuh"
#include "mha/common/gpu.cuh"
#include "mha/sm90/dims.h"

namespace ja {
namespace mha_sm90 {

using namespace cute;

template <typename T>
struct CutlassType;
template <>
struct CutlassType<bf16_t> {
  using type = cutlass::bfloat16_t;
};
template <>
struct CutlassType<f16_t> {
  using type = cutlass::half_t;
};

// A [batch, seq, heads, d] array in global memory as the (seq, d, heads, batch) tensor the TMA
// copies of the forward and the backward use: read-only (Element const) from a const pointer,
// writable from a mutable one (the backward's dQ accumulator). A box wider than d reads zeros past it.
template <typename Element, typename P>
CUTE_HOST_DEVICE auto bshd_tensor(P* ptr, int seq, int d, int heads, int batch) {
  using E = std::conditional_t<std::is_const_v<P>, Element const, Element>;
  return make_tensor(make_gmem_ptr(static_cast<E*>(ptr)), make_shape(seq, d, heads, batch),
                     make_stride(int64_t(heads) * d, _1{}, int64_t(d), int64_t(seq) * heads * d));
}

// The widest 16-bit K-major swizzle atom whose width (64, 32 or 16 elements) divides D.
template <typename Element, int D>
using SmemAtomK = std::conditional_t<
    D % 64 == 0, GMMA::Layout_K_SW128_Atom<Element>,
    std::conditional_t<D % 32 == 0, GMMA::Layout_K_SW64_Atom<Element>, GMMA::Layout_K_SW32_Atom<Element>>>;

// One wgmma atom of shape 64 x N x 16 (A and B in shared memory, majors MA and MB) for an N that
// ss_op_selector would split: it offers only n = 8, 16, 24, 32, 64, 96, 128, 192, 256 unless every
// extended shape is compiled in (CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED), and splits N = 48, 80 or 112
// into narrower wgmmas that each read A from shared memory again (and, with the warpgroups side by side
// along N, interleave their columns).
template <typename Element, int M, int N, int K, GMMA::Major MA = GMMA::Major::K, GMMA::Major MB = GMMA::Major::K>
auto ss_atom() {
  constexpr bool bf = std::is_same_v<Element, cutlass::bfloat16_t>;
  if constexpr (N == 48)
    return std::conditional_t<bf, SM90::GMMA::MMA_64x48x16_F32BF16BF16_SS<MA, MB>,
                              SM90::GMMA::MMA_64x48x16_F32F16F16_SS<MA, MB>>{};
  else if constexpr (N == 80)
    return std::conditional_t<bf, SM90::GMMA::MMA_64x80x16_F32BF16BF16_SS<MA, MB>,
                              SM90::GMMA::MMA_64x80x16_F32F16F16_SS<MA, MB>>{};
  else if constexpr (N == 112)
    return std::conditional_t<bf, SM90::GMMA::MMA_64x112x16_F32BF16BF16_SS<MA, MB>,
                              SM90::GMMA::MMA_64x112x16_F32F16F16_SS<MA, MB>>{};
  else return GMMA::ss_op_selector<Element, Element, float, Shape<Int<M>, Int<N>, Int<K>>, MA, MB>();
}

// One wgmma atom of shape 64 x N x 16 with A from registers, for the N that rs_op_selector would split
// (as ss_atom): O += P V at head dims 80 and 160.
template <typename Element, int M, int N, int K, GMMA::Major MA, GMMA::Major MB>
auto rs_atom() {
  constexpr bool bf = std::is_same_v<Element, cutlass::bfloat16_t>;
  if constexpr (N == 80)
    return std::conditional_t<bf, SM90::GMMA::MMA_64x80x16_F32BF16BF16_RS<MA, MB>,
                              SM90::GMMA::MMA_64x80x16_F32F16F16_RS<MA, MB>>{};
  else if constexpr (N == 160)
    return std::conditional_t<bf, SM90::GMMA::MMA_64x160x16_F32BF16BF16_RS<MA, MB>,
                              SM90::GMMA::MMA_64x160x16_F32F16F16_RS<MA, MB>>{};
  else return GMMA::rs_op_selector<Element, Element, float, Shape<Int<M>, Int<N>, Int<K>>, MA, MB>();
}

// The N of a wgmma atom.
template <typename Atom>
constexpr int atom_n() {
  return decltype(size<1>(typename MMA_Traits<Atom>::Shape_MNK{}))::value;
}

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

// tanh on the multifunction unit (relative error about 2^-11); not volatile, so the compiler schedules it.
CUTE_DEVICE float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// 2^x for x <= 0 on the FMA pipe (FlashAttention-4's trick for when the multifunction unit is the
// bottleneck): x = n + f with n the nearest integer (by adding 1.5 * 2^23) and f in [-0.5, 0.5], 2^f by a
// degree-3 polynomial (a least-squares fit in relative error; max relative error 7.8e-5), n added to the
// exponent bits. Below -125 (and at -inf, a masked score) it is 0, as exp2 underflows there.
CUTE_DEVICE float exp2_fma(float x) {
  const float xc = fmaxf(x, -125.0f);
  const float t = xc + 12582912.0f;
  const float f = xc - (t - 12582912.0f);
  const float p = fmaf(fmaf(fmaf(0.0550886838f, f, 0.242604051f), f, 0.693276242f), f, 0.99992894f);
  const float r = __int_as_float(__float_as_int(p) + (__float_as_int(t) << 23));
  return x < -125.0f ? 0.0f : r;
}

// The keys [lo, hi) row i of batch b sees, and its diagonal (ja::mha_row), with lo and hi clamped to
// [0, seq_k] and hi >= lo whatever `rows` holds, so no tile range reaches past the keys. CAUSAL: the
// causal instances, whose mask is always CAUSAL.
template <bool CAUSAL>
CUTE_DEVICE MhaRow sm90_row(JaMhaProblem const& pr, int b, int i) {
  if (CAUSAL) {
    const int64_t diag = i + pr.seq_k - pr.seq_q;
    return MhaRow{0, mha_clamp(diag + 1, 0, pr.seq_k), diag};
  }
  MhaRow r = mha_row(pr, b, i);
  r.lo = mha_clamp(r.lo, 0, pr.seq_k);
  r.hi = mha_clamp(r.hi, r.lo, pr.seq_k);
  return r;
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

// The (head, batch) pairs per chunk of a causal grid's block order (mha_gpu::grid_place) for the Hopper
// forward and backward, which hold one block per multiprocessor (their registers): as many as one wave of
// blocks covers, floor(multiprocessors / tiles a head), at least 1. Chunks of 1, 2, 4, 8, 16 and all pairs
// were compared on the H200 (bf16, causal, head dims 128 and 256, 8 to 64 tiles a head, with and without
// grouped kv heads) by editing this function and timing `python3 -m benchmarks.gpu.bench_gpu --only
// attention [--head-dim 256]`: at head dim 128 the best chunk was this rule's within noise, and both
// extremes, one chunk of all pairs and one pair a chunk, were clearly slower in the backward. At head dim
// 256 the rule was within noise of the best forward and slightly behind the best backward (twice the
// rule's chunk), still clearly ahead of one chunk of all pairs; the model's head-dim-256 train step
// (`--only model`) did not tell the rule and one chunk of all pairs apart.
inline int64_t causal_chunk(int64_t tiles) {
  const int64_t per = multiprocessors() / (tiles > 0 ? tiles : 1);
  return per > 0 ? per : 1;
}

// Whether the current device runs the sm_90a instances (compute capability 9.0; cached per device).
inline bool device_is_sm90() {
  static std::atomic<int> cache[64];  // 1 no, 2 yes
  const int dev = ja::current_device();
  if (dev < 0) return false;
  return ja::per_device(cache, dev, [](int d) { return ja::compute_capability(d) == 90 ? 2 : 1; }) == 2;
}

// Whether the Hopper kernels of instance head dim D run problem pr (both directions): the instance
// sm90/dims.h picks for its head dims, features within `features`, a mask that needs rows has them,
// sizes within int32 and the grid's limits, and a softcap that is 0 or positive.
template <int D>
bool sm90_applies(const JaMhaProblem& pr, uint32_t features) {
  const int64_t lim = int64_t(1) << 30;
  if (pr.batch <= 0 || pr.seq_q <= 0 || pr.seq_k <= 0 || pr.heads_q <= 0 || pr.heads_kv <= 0) return false;
  if (pr.batch >= 65536 || pr.heads_q >= 65536 || pr.seq_q >= lim || pr.seq_k >= lim) return false;
  if (pr.heads_q % pr.heads_kv != 0) return false;
  if (sm90_instance_head_dim(pr.head_dim, pr.head_dim_v) != D) return false;
  if (mha_unhandled_feature(pr, features)) return false;
  if (pr.mask == kMaskRows && pr.rows == nullptr) return false;
  if (!(pr.softcap >= 0.0f)) return false;  // negative or NaN: not a softcap the kernels define
  if (pr.alibi && pr.softcap == 0.0f && pr.scale == 0.0f) return false;  // the forward's ALiBi has no units
  return true;
}

}  // namespace mha_sm90
}  // namespace ja
