// SiLU-and-mul on the GPU (CUDA and HIP from this one source).
//
// A grid-stride loop over 16-byte vectors of the output; each output vector
// reads one gate vector and one up vector. Rows whose width is not a multiple
// of the vector take the scalar path.
#pragma once
#include <algorithm>

#include "ja/api.h"
#include "ja/dtype.h"
#include "ja/gpu.h"
#include "ja/kernels/activation.h"
#include "gpu_launch.cuh"

namespace ja {

// v / (1 + e^-v) with the fast division (a reciprocal approximation and a multiply, within 2 ulp of
// float32) and e^-v as 2^(-v log2 e) on the special-function unit alone, as __expf computes it: the
// IEEE division's instructions, and __expf's rescaling of results below 2^-126, are a measurable part
// of this kernel at 1k-4k rows (on the H200: benchmarks/gpu/tune_rmsnorm.cu). Flushing e^-v below
// 2^-126 (v > 87.3) to 0 changes nothing, since 1 + e^-v rounds to 1 there anyway.
// For e^-v in [2^126, 2^128) (v in about [-88.7, -87.3]) it gives 0 where the division gives a
// value under 1e-36; v = -inf gives NaN as the division does.
JA_DEVICE float silu_dev(float v) { return __fdividef(v, 1.0f + ja_exp2_approx(v * -ja_log2e)); }

template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) SVec {
  T v[VEC];
};

// Rows on grid y (looping when there are more than the grid allows), 16-byte
// vectors of a row on grid x, UNROLL vectors per thread: no 64-bit divisions,
// and every load of a thread is issued before its arithmetic.
template <typename T, int UNROLL>
JA_GLOBAL void silu_and_mul_vec_kernel(JaSiluAndMulArgs a) {
  constexpr int VEC = 16 / sizeof(T);
  using V = SVec<T, VEC>;
  pdl_wait();  // launched with PDL (gpu_launch.cuh): the previous kernel's writes are visible from here
  pdl_launch_dependents();
  const int64_t dv = a.d / VEC;
  const V* x = static_cast<const V*>(a.x);
  V* out = static_cast<V*>(a.out);
  const int64_t c0 = (int64_t(blockIdx.x) * blockDim.x * UNROLL) + threadIdx.x;
  for (int64_t r = blockIdx.y; r < a.rows; r += gridDim.y) {
    const V* gate = x + r * 2 * dv;
    const V* up = gate + dv;
    V g[UNROLL], u[UNROLL];
#pragma unroll
    for (int j = 0; j < UNROLL; ++j) {
      const int64_t c = c0 + int64_t(j) * blockDim.x;
      if (c < dv) {
        g[j] = gate[c];
        u[j] = up[c];
      }
    }
#pragma unroll
    for (int j = 0; j < UNROLL; ++j) {
      const int64_t c = c0 + int64_t(j) * blockDim.x;
      if (c < dv) {
        V o;
#pragma unroll
        for (int k = 0; k < VEC; ++k) o.v[k] = from_f32<T>(silu_dev(to_f32(g[j].v[k])) * to_f32(u[j].v[k]));
        out[r * dv + c] = o;
      }
    }
  }
}

template <typename T>
JA_GLOBAL void silu_and_mul_scalar_kernel(JaSiluAndMulArgs a) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t total = a.rows * a.d;
  const T* x = static_cast<const T*>(a.x);
  T* out = static_cast<T*>(a.out);
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / a.d, c = i - r * a.d;
    out[i] = from_f32<T>(silu_dev(to_f32(x[r * 2 * a.d + c])) * to_f32(x[r * 2 * a.d + a.d + c]));
  }
}

template <typename T>
const char* silu_and_mul_gpu(const JaSiluAndMulArgs& a, void* stream) {
  const int64_t total = a.rows * a.d;
  if (total == 0) return nullptr;
  const ja_stream_t s = static_cast<ja_stream_t>(stream);
  constexpr int VEC = 16 / sizeof(T);
  constexpr int kThreads = 256;  // the scalar path
  ja_error_t err;
  if (a.d % VEC == 0) {
    // 128 vectors of a row per block, which tiles the common widths exactly (hidden 4096-8192
    // in 16-bit: 512-1024 vectors): 64 threads x 2 vectors, or at up to 1k rows 128 x 1 (more
    // loads in flight across the device when the whole op is one wave). Chosen on the H200
    // (benchmarks/gpu/tune_rmsnorm.cu, cold L2) over 256 x 2 at every row count it tried.
    const int64_t dv = a.d / VEC;
    const bool small = a.rows <= 1024;
    const int threads = small ? 128 : 64, unroll = small ? 1 : 2;
    const dim3 grid(unsigned((dv + threads * unroll - 1) / (threads * unroll)),
                    unsigned(std::min<int64_t>(a.rows, 65535)));
    err = small ? launch_pdl(silu_and_mul_vec_kernel<T, 1>, grid, dim3(threads), 0, s, a)
                : launch_pdl(silu_and_mul_vec_kernel<T, 2>, grid, dim3(threads), 0, s, a);
  } else {
    const int64_t blocks = std::min<int64_t>((total + kThreads - 1) / kThreads, int64_t(1) << 20);
    err = launch_pdl(silu_and_mul_scalar_kernel<T>, dim3(unsigned(blocks)), dim3(kThreads), 0, s, a);
  }
  if (err != ja_success) return ja_error("silu_and_mul: kernel launch failed: %s", ja_get_error_string(err));
  return nullptr;
}

}  // namespace ja
