// RMSNorm forward on the GPU (CUDA and HIP from this one source).
//
// One block per row. Each thread loads 16-byte vectors, keeps them in
// registers across the reduction when the row fits (the common case), and
// writes once, so every element is read and written exactly once.
#pragma once
#include "ja/api.h"
#include "ja/dtype.h"
#include "ja/gpu.h"
#include "ja/kernels/rmsnorm.h"

namespace ja {

template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Vec {
  T v[VEC];
};

template <int THREADS>
JA_DEVICE float block_sum(float v, float* smem) {
  v = ja_warp_sum(v);
  constexpr int kMaxWarps = THREADS / 32;  // upper bound for any warp width
  const int warp = threadIdx.x / ja_warp_size();
  const int lane = threadIdx.x % ja_warp_size();
  const int nwarps = THREADS / ja_warp_size();
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  float total = 0.f;
  if (threadIdx.x < ja_warp_size()) {
    total = (int(threadIdx.x) < nwarps) ? smem[threadIdx.x] : 0.f;
    total = ja_warp_sum(total);
    if (threadIdx.x == 0) smem[kMaxWarps] = total;
  }
  __syncthreads();
  return smem[kMaxWarps];
}

// REGS: vectors each thread keeps in registers; rows longer than
// THREADS * VEC * REGS take the streaming path (second read from L2).
template <typename T, int THREADS, int REGS>
JA_GLOBAL void __launch_bounds__(THREADS) rmsnorm_fwd_kernel(JaRmsNormArgs a) {
  constexpr int VEC = 16 / sizeof(T);
  using V = Vec<T, VEC>;
  __shared__ float smem[THREADS / 32 + 1];
  const int64_t h = a.hidden;
  const int64_t row = blockIdx.x;
  const T* x = static_cast<const T*>(a.x) + row * h;
  const T* res = a.residual ? static_cast<const T*>(a.residual) + row * h : nullptr;
  T* res_out = a.residual ? static_cast<T*>(a.residual_out) + row * h : nullptr;
  T* out = static_cast<T*>(a.out) + row * h;
  const T* w = static_cast<const T*>(a.weight);
  const bool vec_ok = (h % VEC) == 0;
  const int64_t nvec = vec_ok ? h / VEC : 0;
  const bool fits = vec_ok && nvec <= int64_t(THREADS) * REGS;

  float acc = 0.f;
  if (fits) {
    // Issue every load (x, residual and the weight, which is an L2 hit) before
    // any arithmetic, so the whole row is in flight at once and the weight's
    // latency hides behind the reduction.
    V xv[REGS], rv[REGS], wv[REGS];
#pragma unroll
    for (int r = 0; r < REGS; ++r) {
      const int64_t i = int64_t(threadIdx.x) + int64_t(r) * THREADS;
      if (i < nvec) {
        xv[r] = reinterpret_cast<const V*>(x)[i];
        if (res) rv[r] = reinterpret_cast<const V*>(res)[i];
        wv[r] = reinterpret_cast<const V*>(w)[i];
      }
    }
    float vals[REGS][VEC];
#pragma unroll
    for (int r = 0; r < REGS; ++r) {
      const int64_t i = int64_t(threadIdx.x) + int64_t(r) * THREADS;
      if (i < nvec) {
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          float f = to_f32(xv[r].v[k]);
          if (res) f += to_f32(rv[r].v[k]);
          vals[r][k] = f;
          acc += f * f;
        }
        if (res) {
          V ov;
#pragma unroll
          for (int k = 0; k < VEC; ++k) ov.v[k] = from_f32<T>(vals[r][k]);
          reinterpret_cast<V*>(res_out)[i] = ov;
        }
      }
    }
    const float inv_rms = ja_rsqrt(block_sum<THREADS>(acc, smem) / float(h) + a.eps);
#pragma unroll
    for (int r = 0; r < REGS; ++r) {
      const int64_t i = int64_t(threadIdx.x) + int64_t(r) * THREADS;
      if (i < nvec) {
        V ov;
#pragma unroll
        for (int k = 0; k < VEC; ++k) ov.v[k] = from_f32<T>(vals[r][k] * inv_rms * to_f32(wv[r].v[k]));
        reinterpret_cast<V*>(out)[i] = ov;
      }
    }
    return;
  }
  // Streaming path: any hidden size, scalar accesses.
  for (int64_t i = threadIdx.x; i < h; i += THREADS) {
    float f = to_f32(x[i]);
    if (res) {
      f += to_f32(res[i]);
      res_out[i] = from_f32<T>(f);
    }
    acc += f * f;
  }
  const float inv_rms = ja_rsqrt(block_sum<THREADS>(acc, smem) / float(h) + a.eps);
  for (int64_t i = threadIdx.x; i < h; i += THREADS) {
    // Re-read the stored residual sum so the normalised value matches it.
    const float f = res ? to_f32(res[i]) + to_f32(x[i]) : to_f32(x[i]);
    out[i] = from_f32<T>(f * inv_rms * to_f32(w[i]));
  }
}

template <typename T>
const char* rmsnorm_fwd_gpu(const JaRmsNormArgs& a, void* stream) {
  if (a.rows == 0 || a.hidden == 0) return nullptr;
  if (a.rows > 0x7fffffffLL) return ja_error("rmsnorm: %lld rows exceed the GPU grid limit", (long long)a.rows);
  const ja_stream_t s = static_cast<ja_stream_t>(stream);
  const int64_t nvec = a.hidden / (16 / int64_t(sizeof(T)));
  const dim3 grid(unsigned(a.rows));
  // Block shape by row length (in 16-byte vectors): about four vectors per
  // thread in small blocks, so many rows are in flight on each multiprocessor.
  if (nvec <= 64) {
    rmsnorm_fwd_kernel<T, 64, 1><<<grid, 64, 0, s>>>(a);
  } else if (nvec <= 256) {
    rmsnorm_fwd_kernel<T, 128, 2><<<grid, 128, 0, s>>>(a);
  } else if (nvec <= 512) {
    rmsnorm_fwd_kernel<T, 128, 4><<<grid, 128, 0, s>>>(a);
  } else if (nvec <= 1024) {
    rmsnorm_fwd_kernel<T, 256, 4><<<grid, 256, 0, s>>>(a);
  } else if (nvec <= 2048) {
    rmsnorm_fwd_kernel<T, 512, 4><<<grid, 512, 0, s>>>(a);
  } else {
    rmsnorm_fwd_kernel<T, 1024, 4><<<grid, 1024, 0, s>>>(a);  // longer rows stream
  }
  const ja_error_t err = ja_get_last_error();
  if (err != ja_success) return ja_error("rmsnorm: kernel launch failed: %s", ja_get_error_string(err));
  return nullptr;
}

}  // namespace ja
