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

// 2^x for x <= ~127, 0 below -126 (so exp2(-inf) == 0). Round-to-nearest
// range reduction, then a degree-7 Taylor polynomial of 2^f on [-0.5, 0.5]
// (truncation error < 1e-8 relative, below float32 rounding).
JA_CPU_INLINE float exp2_approx(float x) {
  const float t = std::min(std::max(x, -126.0f), 127.0f);
  const float k = (t + 12582912.0f) - 12582912.0f;  // 1.5 * 2^23: round to nearest integer
  const float f = t - k;
  float p = 1.5252733804059841e-5f;
  p = p * f + 1.5403530393381609e-4f;
  p = p * f + 1.3333558146428443e-3f;
  p = p * f + 9.6181291076284772e-3f;
  p = p * f + 5.5504108664821580e-2f;
  p = p * f + 2.4022650695910071e-1f;
  p = p * f + 6.9314718055994531e-1f;
  p = p * f + 1.0f;
  const uint32_t bits = uint32_t(int32_t(k) + 127) << 23;
  const float y = p * bits_to_f32(bits);
  return x < -126.0f ? 0.0f : y;
}

// Eight partial results keep these reductions vectorisable without -ffast-math.
JA_CPU_INLINE float row_max(const float* x, int n) {
  float part[8];
  for (int i = 0; i < 8; ++i) part[i] = -kInf;
  int j = 0;
  for (; j + 8 <= n; j += 8)
    for (int i = 0; i < 8; ++i) part[i] = std::max(part[i], x[j + i]);
  for (; j < n; ++j) part[0] = std::max(part[0], x[j]);
  float m = part[0];
  for (int i = 1; i < 8; ++i) m = std::max(m, part[i]);
  return m;
}

JA_CPU_INLINE float row_sum(const float* x, int n) {
  float part[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  int j = 0;
  for (; j + 8 <= n; j += 8)
    for (int i = 0; i < 8; ++i) part[i] += x[j + i];
  for (; j < n; ++j) part[0] += x[j];
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
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
// 4 x 16 register blocks: four broadcast A values times one 16-wide row of B
// per k step (8 AVX2 accumulators).
template <int M, int N, int K, bool ACC>
JA_CPU_INLINE void gemm(float* __restrict C, int ldc, const float* __restrict A, int lda,
                        const float* __restrict B, int ldb) {
  static_assert(M % 4 == 0 && N % 16 == 0, "gemm: M must be a multiple of 4 and N of 16");
  for (int i = 0; i < M; i += 4) {
    for (int j0 = 0; j0 < N; j0 += 16) {
      float acc[4][16];
      for (int r = 0; r < 4; ++r)
        for (int j = 0; j < 16; ++j) acc[r][j] = ACC ? C[(i + r) * ldc + j0 + j] : 0.0f;
      const float* a0 = A + (i + 0) * lda;
      const float* a1 = A + (i + 1) * lda;
      const float* a2 = A + (i + 2) * lda;
      const float* a3 = A + (i + 3) * lda;
      for (int k = 0; k < K; ++k) {
        const float* b = B + k * ldb + j0;
        const float x0 = a0[k], x1 = a1[k], x2 = a2[k], x3 = a3[k];
        for (int j = 0; j < 16; ++j) {
          acc[0][j] += x0 * b[j];
          acc[1][j] += x1 * b[j];
          acc[2][j] += x2 * b[j];
          acc[3][j] += x3 * b[j];
        }
      }
      for (int r = 0; r < 4; ++r)
        for (int j = 0; j < 16; ++j) C[(i + r) * ldc + j0 + j] = acc[r][j];
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

inline bool cpu_has_avx2_fma() {
#if defined(JA_CPU_HAS_AVX2_PATH)
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
#else
  return false;
#endif
}

// Runs Kernel's tasks [0, n) in parallel chunks, each through the AVX2+FMA
// build of Kernel::tasks when the CPU has it, else the baseline build.
template <typename Kernel, typename Args>
void run_tasks(const Args& a, int64_t n) {
  parallel_for(n, 1, [&](int64_t t0, int64_t t1) {
#if defined(JA_CPU_HAS_AVX2_PATH)
    if (cpu_has_avx2_fma()) return Kernel::tasks_avx2(a, t0, t1);
#endif
    Kernel::tasks_base(a, t0, t1);
  });
}

}  // namespace mha_cpu
}  // namespace ja
