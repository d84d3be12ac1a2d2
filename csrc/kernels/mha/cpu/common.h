// Building blocks of the CPU flash-attention kernels (cpu/fwd.h, cpu/bwd.h).
//
// Everything a tile touches is float32 in small row-major buffers that stay in
// L1/L2. Products go through one register-blocked micro-kernel (gemm below),
// written as plain loops GCC vectorises; exp2 is a branch-free polynomial so
// the softmax loops vectorise too (a libm call per score would cost as much as
// the products). Kernels are compiled twice, for the baseline ISA and for
// AVX2+FMA, and run_tasks picks one at run time, so the wheel stays portable.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "ja/api.h"
#include "ja/dtype.h"
#include "ja/kernels/mha.h"
#include "ja/kernels/mha_features.h"

#define JA_CPU_INLINE inline __attribute__((always_inline))

#if defined(__x86_64__) && defined(__GNUC__)
#define JA_CPU_HAS_AVX2_PATH 1
#define JA_CPU_TARGET_AVX2 __attribute__((target("avx2,fma")))
#endif

namespace ja {
namespace mha_cpu {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kInf = std::numeric_limits<float>::infinity();

// SIMD values as GCC generic vectors: f32x8 (one ymm register) for the
// AVX2+FMA build, f32x4 (one xmm register) for the baseline SSE2 build; the
// kernels take the vector type V as a template parameter. vload/vstore are
// unaligned (memcpy compiles to one vmovups/movups). Values of these types
// never cross a non-inlined call, so GCC's -Wpsabi note about their ABI does
// not apply (the mha modules build with -Wno-psabi).
typedef float f32x8 __attribute__((vector_size(32)));
typedef float f32x4 __attribute__((vector_size(16)));
typedef int32_t i32x8 __attribute__((vector_size(32)));
typedef int32_t i32x4 __attribute__((vector_size(16)));

template <typename V>
struct Lanes;
template <>
struct Lanes<f32x8> {
  static constexpr int n = 8;
  using Int = i32x8;
};
template <>
struct Lanes<f32x4> {
  static constexpr int n = 4;
  using Int = i32x4;
};

template <typename V>
JA_CPU_INLINE V vload(const float* p) {
  V v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
template <typename V>
JA_CPU_INLINE void vstore(float* p, V v) {
  __builtin_memcpy(p, &v, sizeof v);
}
template <typename V>
JA_CPU_INLINE V splat(float v) {
  return V{} + v;
}
template <typename V>
JA_CPU_INLINE float hmax(V v) {
  float m = v[0];
  for (int i = 1; i < Lanes<V>::n; ++i) m = v[i] > m ? v[i] : m;
  return m;
}
template <typename V>
JA_CPU_INLINE float hsum(V v) {
  float s = 0.0f;
  for (int i = 0; i < Lanes<V>::n; ++i) s += v[i];
  return s;
}

// 2^x lane-wise for x <= 127, exactly 0 below -126 (so 2^-inf == 0). Round-to-
// nearest range reduction, then a degree-7 Taylor polynomial of 2^f on
// [-0.5, 0.5] (truncation error < 1e-8 relative, below float32 rounding).
template <typename V>
JA_CPU_INLINE V exp2_v(V x) {
  using I = typename Lanes<V>::Int;
  const V lo = splat<V>(-126.0f), hi = splat<V>(127.0f), magic = splat<V>(12582912.0f);  // 1.5 * 2^23
  V t = x < lo ? lo : x;
  t = t > hi ? hi : t;
  const V k = (t + magic) - magic;  // t rounded to the nearest integer
  const V f = t - k;
  V p = splat<V>(1.5252733804059841e-5f);
  p = p * f + 1.5403530393381609e-4f;
  p = p * f + 1.3333558146428443e-3f;
  p = p * f + 9.6181291076284772e-3f;
  p = p * f + 5.5504108664821580e-2f;
  p = p * f + 2.4022650695910071e-1f;
  p = p * f + 6.9314718055994531e-1f;
  p = p * f + 1.0f;
  const I bits = (__builtin_convertvector(k, I) + 127) << 23;  // 2^k as float bits
  V pow2k;
  __builtin_memcpy(&pow2k, &bits, sizeof pow2k);
  const V y = p * pow2k;
  return x < lo ? V{} : y;
}

// Scalar 2^x with the same rounding as exp2_v (for the odd single value).
template <typename V>
JA_CPU_INLINE float exp2_scalar(float x) {
  return exp2_v<V>(splat<V>(x))[0];
}

template <int N, typename V>
JA_CPU_INLINE float row_max(const float* x) {
  constexpr int W = Lanes<V>::n;
  static_assert(N % W == 0, "row length must be a multiple of the vector width");
  V m = vload<V>(x);
  for (int j = W; j < N; j += W) {
    const V v = vload<V>(x + j);
    m = v > m ? v : m;
  }
  return hmax(m);
}

template <typename T>
JA_CPU_INLINE float dot_f32(const T* a, const T* b, int n) {
  float part[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  int j = 0;
  for (; j + 8 <= n; j += 8)
    for (int i = 0; i < 8; ++i) part[i] += to_f32(a[j + i]) * to_f32(b[j + i]);
  for (; j < n; ++j) part[0] += to_f32(a[j]) * to_f32(b[j]);
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

// C[M][N] = (ACC ? C : 0) + A[M][K] * B[K][N], row-major with leading dims.
// 4 x (2 vectors) register blocks: per k step, two vector loads of B's row
// times four broadcast A values, eight FMAs into eight accumulators that stay
// in registers (4 x 16 floats with AVX2, 4 x 8 with SSE2).
template <int M, int N, int K, bool ACC, typename V>
JA_CPU_INLINE void gemm(float* __restrict C, int ldc, const float* __restrict A, int lda, const float* __restrict B,
                        int ldb) {
  constexpr int W = Lanes<V>::n;
  static_assert(M % 4 == 0 && N % (2 * W) == 0, "gemm: M must be a multiple of 4 and N of two vectors");
  for (int i = 0; i < M; i += 4) {
    const float* a0 = A + (i + 0) * lda;
    const float* a1 = A + (i + 1) * lda;
    const float* a2 = A + (i + 2) * lda;
    const float* a3 = A + (i + 3) * lda;
    for (int j = 0; j < N; j += 2 * W) {
      float* c = C + i * ldc + j;
      V c00 = {}, c01 = {}, c10 = {}, c11 = {}, c20 = {}, c21 = {}, c30 = {}, c31 = {};
      if (ACC) {
        c00 = vload<V>(c), c01 = vload<V>(c + W);
        c10 = vload<V>(c + ldc), c11 = vload<V>(c + ldc + W);
        c20 = vload<V>(c + 2 * ldc), c21 = vload<V>(c + 2 * ldc + W);
        c30 = vload<V>(c + 3 * ldc), c31 = vload<V>(c + 3 * ldc + W);
      }
      const float* b = B + j;
      for (int k = 0; k < K; ++k, b += ldb) {
        const V b0 = vload<V>(b), b1 = vload<V>(b + W);
        const float x0 = a0[k], x1 = a1[k], x2 = a2[k], x3 = a3[k];
        c00 += x0 * b0, c01 += x0 * b1;
        c10 += x1 * b0, c11 += x1 * b1;
        c20 += x2 * b0, c21 += x2 * b1;
        c30 += x3 * b0, c31 += x3 * b1;
      }
      vstore(c, c00), vstore(c + W, c01);
      vstore(c + ldc, c10), vstore(c + ldc + W, c11);
      vstore(c + 2 * ldc, c20), vstore(c + 2 * ldc + W, c21);
      vstore(c + 3 * ldc, c30), vstore(c + 3 * ldc + W, c31);
    }
  }
}

// dst[r][c] = mul * src row r, element c, for r < rows_valid and c < cols_valid (rows `stride` elements
// apart); zero elsewhere, so whole tiles of the instance's padded head dim D are processed unmasked.
template <int ROWS, int D, typename T>
JA_CPU_INLINE void load_rows(float* __restrict dst, const T* __restrict src, int64_t stride, int rows_valid,
                             int cols_valid, float mul) {
  for (int r = 0; r < ROWS; ++r) {
    float* d = dst + r * D;
    int c = 0;
    if (r < rows_valid) {
      const T* s = src + r * stride;
      for (; c < cols_valid; ++c) d[c] = to_f32(s[c]) * mul;
    }
    for (; c < D; ++c) d[c] = 0.0f;
  }
}

// dst[c][r] = src row r, element c (a transposed [D][ROWS] tile), zero-padded the same way.
template <int ROWS, int D, typename T>
JA_CPU_INLINE void load_rows_transposed(float* __restrict dst, const T* __restrict src, int64_t stride, int rows_valid,
                                        int cols_valid) {
  for (int r = 0; r < ROWS; ++r) {
    int c = 0;
    if (r < rows_valid) {
      const T* s = src + r * stride;
      for (; c < cols_valid; ++c) dst[c * ROWS + r] = to_f32(s[c]);
    }
    for (; c < D; ++c) dst[c * ROWS + r] = 0.0f;
  }
}

// Whether the N floats at x (N a multiple of two vectors) are all finite: x * 0 is 0 for a finite x and NaN
// for NaN or +-inf, summed in two vector accumulators.
template <int N, typename V>
JA_CPU_INLINE bool all_finite(const float* x) {
  constexpr int W = Lanes<V>::n;
  static_assert(N % (2 * W) == 0, "all_finite: N must be a multiple of two vectors");
  V a = {}, b = {};
  for (int i = 0; i < N; i += 2 * W) a += vload<V>(x + i) * 0.0f, b += vload<V>(x + i + W) * 0.0f;
  return hsum(a + b) == 0.0f;
}

// Compensated (Kahan) sums across tiles: acc += x with the low-order bits that acc cannot hold carried in comp, so
// a long sequence of tiles (tens of millions of keys) loses nothing to acc's magnitude. Each tile's x is a fresh
// float32 sum of at most one tile of terms. Elementwise over N floats (N a multiple of the vector width).
template <int N, typename V>
JA_CPU_INLINE void kahan_add(float* __restrict acc, float* __restrict comp, const float* __restrict x) {
  constexpr int W = Lanes<V>::n;
  static_assert(N % W == 0, "kahan_add: N must be a multiple of the vector width");
  for (int i = 0; i < N; i += W) {
    const V y = vload<V>(x + i) - vload<V>(comp + i);
    const V s = vload<V>(acc + i);
    const V t = s + y;
    vstore(comp + i, (t - s) - y);
    vstore(acc + i, t);
  }
}

JA_CPU_INLINE void kahan_add(float& acc, float& comp, float x) {
  const float y = x - comp, t = acc + y;
  comp = (t - acc) - y;
  acc = t;
}

template <int ROWS, int COLS>
JA_CPU_INLINE void transpose(float* __restrict dst, const float* __restrict src) {
  for (int r = 0; r < ROWS; ++r)
    for (int c = 0; c < COLS; ++c) dst[c * ROWS + r] = src[r * COLS + c];
}

// dst[c] = src[c] * mul for c < n, rounded once to T.
template <typename T>
JA_CPU_INLINE void store_row(T* __restrict dst, const float* __restrict src, int n, float mul) {
  for (int c = 0; c < n; ++c) dst[c] = from_f32<T>(src[c] * mul);
}

// tanh lane-wise as sign(x) (1 - e) / (1 + e), e = exp(-2 |x|) by exp2_v: absolute error below 1e-7
// (what softcap * tanh needs: the score's own float32 rounding is larger); NaN stays NaN.
template <typename V>
JA_CPU_INLINE V tanh_v(V x) {
  const V ax = x < 0.0f ? -x : x;
  const V e = exp2_v<V>(ax * (-2.0f * kLog2e));
  const V t = (1.0f - e) / (1.0f + e);
  return x < 0.0f ? -t : t;
}

// The mask of a tile of query rows: for each row, its visible keys [lo, hi) and ALiBi origin diag
// (ja/kernels/mha_features.h's mha_row; lo and hi clamped to [0, seq_k], so a bad rows array cannot
// send a load out of bounds), and [kv_lo, kv_hi), the keys that any row of the tile sees.
template <int BR>
struct TileRows {
  int64_t lo[BR], hi[BR], diag[BR];
  int64_t kv_lo, kv_hi;
  int n;  // rows of the tile (the rest are padding)

  JA_CPU_INLINE void init(const JaMhaProblem& p, int64_t b, int64_t q0, int rows) {
    init_with(rows, p.seq_k, [&](int r) { return mha_row(p, b, q0 + r); });
  }
  // The same from row_of(r), the MhaRow of row r, over seq_k keys (the paged kernel's rows).
  template <typename RowOf>
  JA_CPU_INLINE void init_with(int rows, int64_t seq_k, RowOf&& row_of) {
    n = rows;
    kv_lo = seq_k, kv_hi = 0;
    for (int r = 0; r < rows; ++r) {
      const MhaRow x = row_of(r);
      lo[r] = mha_clamp(x.lo, 0, seq_k);
      hi[r] = mha_clamp(x.hi, lo[r], seq_k);
      diag[r] = x.diag;
      if (hi[r] > lo[r]) kv_lo = std::min(kv_lo, lo[r]), kv_hi = std::max(kv_hi, hi[r]);
    }
  }
  // Row r sees columns [*a, *e) of the key tile [kv0, kv0 + nk) (empty when *a >= *e).
  JA_CPU_INLINE void span(int r, int64_t kv0, int nk, int* a, int* e) const {
    *a = int(mha_clamp(lo[r] - kv0, 0, nk));
    *e = int(mha_clamp(hi[r] - kv0, 0, nk));
  }
  // Every row sees every key of the tile: no element of the tile's products is masked.
  JA_CPU_INLINE bool full(int64_t kv0, int nk) const {
    for (int r = 0; r < n; ++r)
      if (lo[r] > kv0 || hi[r] < kv0 + nk) return false;
    return true;
  }
  // Some row sees some key of the tile.
  JA_CPU_INLINE bool any(int64_t kv0, int nk) const {
    for (int r = 0; r < n; ++r)
      if (std::max(lo[r], kv0) < std::min(hi[r], kv0 + nk)) return true;
    return false;
  }
};

// The score's terms of ja/kernels/mha.h beyond q . k, for one (batch, query head), in the log2 domain.
struct ScoreTerms {
  float cap2;         // softcap * log2(e); 0: no softcap
  float alibi2;       // ALiBi slope * log2(e); 0: none
  const float* bias;  // bias of this (batch, head), row i at bias + i * seq_k; null: none
  int64_t seq_k;

  JA_CPU_INLINE static ScoreTerms of(const JaMhaProblem& p, int64_t b, int64_t h) {
    ScoreTerms t{p.softcap > 0.0f ? p.softcap * kLog2e : 0.0f, 0.0f, nullptr, p.seq_k};
    if (p.alibi) t.alibi2 = p.alibi[b * p.alibi_batch_stride + h] * kLog2e;
    if (p.bias) t.bias = p.bias + b * p.bias_batch_stride + h * p.bias_head_stride;
    return t;
  }
  // The multiplier of q . k that the row's scores start from: scale * log2(e), or scale / softcap (tanh's
  // argument) with a softcap.
  JA_CPU_INLINE static float qk_mul(const JaMhaProblem& p) {
    return p.softcap > 0.0f ? p.scale / p.softcap : p.scale * kLog2e;
  }
};

// One row of a tile of scores, in place: x[j] = q_i . k_j * ScoreTerms::qk_mul on entry; on return
// log2(e) * s_ij (softcap, ALiBi of key kv0 + j against diag, bias of row i) for the visible columns
// [a, e) and -inf for the other BC (masked and padding). With a softcap and dtanh non-null, dtanh[j]
// receives 1 - tanh^2 of the row's BC columns (the derivative of the softcap, for the backward).
template <int BC, typename V>
JA_CPU_INLINE void score_row(float* __restrict x, float* __restrict dtanh, const ScoreTerms& t, int64_t i, int64_t diag,
                             int64_t kv0, int a, int e) {
  constexpr int W = Lanes<V>::n;
  if (t.cap2 != 0.0f) {
    const V cap = splat<V>(t.cap2);
    for (int j = 0; j < BC; j += W) {
      const V th = tanh_v<V>(vload<V>(x + j));
      vstore(x + j, th * cap);
      if (dtanh) vstore(dtanh + j, 1.0f - th * th);
    }
  }
  if (t.alibi2 != 0.0f)
    for (int j = a; j < e; ++j) {
      const int64_t d = diag - (kv0 + j);
      x[j] -= t.alibi2 * float(d < 0 ? -d : d);
    }
  if (t.bias) {
    const float* row = t.bias + i * t.seq_k + kv0;
    for (int j = a; j < e; ++j) x[j] += row[j] * kLog2e;
  }
  for (int j = 0; j < a; ++j) x[j] = -kInf;
  for (int j = e; j < BC; ++j) x[j] = -kInf;
}

// Dropout: the keep-scale of row i's keys kv0 + j, j in [a, e): 1 / (1 - p) where
// mha_dropout_keep keeps the element, else 0, into mul[a, e).
JA_CPU_INLINE void dropout_row(float* __restrict mul, const JaMhaProblem& p, uint32_t threshold, float keep_scale,
                               int64_t b, int64_t h, int64_t i, int64_t kv0, int a, int e) {
  for (int j = a; j < e;) {
    const int64_t key = kv0 + j;
    const MhaPhilox r = mha_dropout_block(p.seed, b, h, i, key);
    for (int w = int(key & 3); w < 4 && j < e; ++w, ++j) mul[j] = r.x[w] >= threshold ? keep_scale : 0.0f;
  }
}

// True when the AVX2+FMA build may run: the CPU has both and JA_CPU_ISA is not
// "baseline" (which forces the portable build, e.g. to test it on any host).
inline bool use_avx2_fma() {
#if defined(JA_CPU_HAS_AVX2_PATH)
  static const bool yes = [] {
    const char* isa = std::getenv("JA_CPU_ISA");
    if (isa && std::strcmp(isa, "baseline") == 0) return false;
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return yes;
#else
  return false;
#endif
}

// Kernel::tasks<V>(args, t0, t1) compiled for AVX2+FMA (8-lane vectors) and
// for the baseline ISA (4-lane vectors); run_tasks picks one per process.
#if defined(JA_CPU_HAS_AVX2_PATH)
template <typename Kernel, typename Args>
JA_CPU_TARGET_AVX2 void tasks_avx2(const Args& a, int64_t t0, int64_t t1) {
  Kernel::template tasks<f32x8>(a, t0, t1);
}
#endif
template <typename Kernel, typename Args>
void tasks_baseline(const Args& a, int64_t t0, int64_t t1) {
  Kernel::template tasks<f32x4>(a, t0, t1);
}

// Runs Kernel's tasks [0, n) in parallel chunks.
template <typename Kernel, typename Args>
void run_tasks(const Args& a, int64_t n) {
  parallel_for(n, 1, [&](int64_t t0, int64_t t1) {
#if defined(JA_CPU_HAS_AVX2_PATH)
    if (use_avx2_fma()) return tasks_avx2<Kernel>(a, t0, t1);
#endif
    tasks_baseline<Kernel>(a, t0, t1);
  });
}

}  // namespace mha_cpu
}  // namespace ja
