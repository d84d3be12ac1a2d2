// Building blocks of the CPU flash-attention kernels (mha_fwd_cpu.h, mha_bwd_cpu.h).
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

template <typename V> struct Lanes;
template <> struct Lanes<f32x8> { static constexpr int n = 8; using Int = i32x8; };
template <> struct Lanes<f32x4> { static constexpr int n = 4; using Int = i32x4; };

template <typename V> JA_CPU_INLINE V vload(const float* p) {
  V v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
template <typename V> JA_CPU_INLINE void vstore(float* p, V v) { __builtin_memcpy(p, &v, sizeof v); }
template <typename V> JA_CPU_INLINE V splat(float v) { return V{} + v; }
template <typename V> JA_CPU_INLINE float hmax(V v) {
  float m = v[0];
  for (int i = 1; i < Lanes<V>::n; ++i) m = v[i] > m ? v[i] : m;
  return m;
}
template <typename V> JA_CPU_INLINE float hsum(V v) {
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
JA_CPU_INLINE float exp2_scalar(float x) { return exp2_v<V>(splat<V>(x))[0]; }

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
JA_CPU_INLINE void gemm(float* __restrict C, int ldc, const float* __restrict A, int lda,
                        const float* __restrict B, int ldb) {
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

// dst[r][c] = mul * src row r (rows of `D` elements, `stride` elements apart);
// rows >= rows_valid are zero so whole tiles can be processed unmasked.
template <int ROWS, int D, typename T>
JA_CPU_INLINE void load_rows(float* __restrict dst, const T* __restrict src, int64_t stride, int rows_valid,
                             float mul) {
  for (int r = 0; r < ROWS; ++r) {
    float* d = dst + r * D;
    if (r < rows_valid) {
      const T* s = src + r * stride;
      for (int c = 0; c < D; ++c) d[c] = to_f32(s[c]) * mul;
    } else {
      for (int c = 0; c < D; ++c) d[c] = 0.0f;
    }
  }
}

// dst[c][r] = src row r, element c (a transposed [D][ROWS] tile), zero-padded.
template <int ROWS, int D, typename T>
JA_CPU_INLINE void load_rows_transposed(float* __restrict dst, const T* __restrict src, int64_t stride,
                                        int rows_valid) {
  for (int r = 0; r < ROWS; ++r) {
    if (r < rows_valid) {
      const T* s = src + r * stride;
      for (int c = 0; c < D; ++c) dst[c * ROWS + r] = to_f32(s[c]);
    } else {
      for (int c = 0; c < D; ++c) dst[c * ROWS + r] = 0.0f;
    }
  }
}

template <int ROWS, int COLS>
JA_CPU_INLINE void transpose(float* __restrict dst, const float* __restrict src) {
  for (int r = 0; r < ROWS; ++r)
    for (int c = 0; c < COLS; ++c) dst[c * ROWS + r] = src[r * COLS + c];
}

template <int D, typename T>
JA_CPU_INLINE void store_row(T* __restrict dst, const float* __restrict src, float mul) {
  for (int c = 0; c < D; ++c) dst[c] = from_f32<T>(src[c] * mul);
}

// Number of keys in [kv0, kv0 + nk) that query row q may attend (bottom-right causal).
template <bool CAUSAL>
JA_CPU_INLINE int visible_keys(int64_t q, int64_t kv0, int nk, int64_t seq_q, int64_t seq_k) {
  if (!CAUSAL) return nk;
  const int64_t last = q + seq_k - seq_q;  // last visible key index
  return int(std::min<int64_t>(nk, std::max<int64_t>(0, last - kv0 + 1)));
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
