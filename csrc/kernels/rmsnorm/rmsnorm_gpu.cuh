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

// See ja_reg_barrier: the row's float values are recomputed after the
// reduction instead of being held in registers across it.
template <typename V>
JA_DEVICE void reg_barrier(V& v) {
  static_assert(sizeof(V) % 4 == 0, "vector of 32-bit words");
  uint32_t* words = reinterpret_cast<uint32_t*>(&v);
#pragma unroll
  for (int i = 0; i < int(sizeof(V) / 4); ++i) ja_reg_barrier(words[i]);
}

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

// Loads one row's 16-byte vectors (and the residual's) into registers.
template <typename V, int THREADS, int REGS, bool RES>
JA_DEVICE void load_row(V (&xv)[REGS], V (&rv)[REGS], const V* x, const V* res, int64_t nvec) {
#pragma unroll
  for (int r = 0; r < REGS; ++r) {
    const int64_t i = int64_t(threadIdx.x) + int64_t(r) * THREADS;
    if (i < nvec) {
      xv[r] = x[i];
      if (RES) rv[r] = res[i];
    }
  }
}

// REGS: vectors each thread keeps in registers; rows longer than
// THREADS * VEC * REGS take the streaming path (second read from L2).
// RPB: consecutive rows per block. The next row's loads are issued before the
// current row's reduction, so a block always has a row in flight, and the
// weight is read once per block.
// MIN_BLOCKS: resident blocks per multiprocessor asked of the register allocator.
// RES: a residual is added first (a.residual is set).
template <typename T, bool RES, int THREADS, int REGS, int RPB = 1, int MIN_BLOCKS = 1>
JA_GLOBAL void __launch_bounds__(THREADS, MIN_BLOCKS) rmsnorm_fwd_kernel(JaRmsNormArgs a) {
  constexpr int VEC = 16 / sizeof(T);
  using V = Vec<T, VEC>;
  __shared__ float smem[THREADS / 32 + 1];
  const int64_t h = a.hidden;
  const int64_t first = int64_t(blockIdx.x) * RPB;
  const int64_t last = first + RPB < a.rows ? first + RPB : a.rows;
  const T* w = static_cast<const T*>(a.weight);
  const bool vec_ok = (h % VEC) == 0;
  const int64_t nvec = vec_ok ? h / VEC : 0;
  const bool fits = vec_ok && nvec <= int64_t(THREADS) * REGS;

  if (fits) {
    auto row_ptr = [&](const void* base, int64_t row) {
      return base ? reinterpret_cast<const V*>(static_cast<const T*>(base) + row * h) : nullptr;
    };
    // Issue every load (x, residual and the weight, an L2 hit) before any
    // arithmetic, so the whole row is in flight at once.
    V xv[REGS], rv[REGS], wv[REGS];
    load_row<V, THREADS, REGS, RES>(xv, rv, row_ptr(a.x, first), row_ptr(a.residual, first), nvec);
#pragma unroll
    for (int r = 0; r < REGS; ++r) {
      const int64_t i = int64_t(threadIdx.x) + int64_t(r) * THREADS;
      if (i < nvec) wv[r] = reinterpret_cast<const V*>(w)[i];
    }
    // x (+ residual) in float32, element k of vector r: computed for the sum of squares and again,
    // after reg_barrier, for the output, so the row stays in registers in its input dtype only.
    auto value = [&](int r, int k) {
      return RES ? to_f32(xv[r].v[k]) + to_f32(rv[r].v[k]) : to_f32(xv[r].v[k]);
    };
    for (int64_t row = first; row < last; ++row) {
      V xn[REGS], rn[REGS];
      const bool more = row + 1 < last;  // uniform across the block
      if (more) load_row<V, THREADS, REGS, RES>(xn, rn, row_ptr(a.x, row + 1), row_ptr(a.residual, row + 1), nvec);
      V* res_out = RES ? reinterpret_cast<V*>(static_cast<T*>(a.residual_out) + row * h) : nullptr;
      V* out = reinterpret_cast<V*>(static_cast<T*>(a.out) + row * h);
      float acc = 0.f;
#pragma unroll
      for (int r = 0; r < REGS; ++r) {
        const int64_t i = int64_t(threadIdx.x) + int64_t(r) * THREADS;
        if (i < nvec) {
          V ov;
#pragma unroll
          for (int k = 0; k < VEC; ++k) {
            const float f = value(r, k);
            acc += f * f;
            ov.v[k] = from_f32<T>(f);
          }
          if (RES) res_out[i] = ov;
        }
      }
      const float inv_rms = ja_rsqrt(block_sum<THREADS>(acc, smem) / float(h) + a.eps);
#pragma unroll
      for (int r = 0; r < REGS; ++r) {
        reg_barrier(xv[r]);
        if (RES) reg_barrier(rv[r]);
      }
#pragma unroll
      for (int r = 0; r < REGS; ++r) {
        const int64_t i = int64_t(threadIdx.x) + int64_t(r) * THREADS;
        if (i < nvec) {
          V ov;
#pragma unroll
          for (int k = 0; k < VEC; ++k) {
            ov.v[k] = from_f32<T>(value(r, k) * inv_rms * to_f32(wv[r].v[k]));
          }
          out[i] = ov;
        }
      }
      if (more) {
#pragma unroll
        for (int r = 0; r < REGS; ++r) {
          xv[r] = xn[r];
          if (RES) rv[r] = rn[r];
        }
      }
    }
    return;
  }
  // Streaming path: any hidden size, scalar accesses.
  for (int64_t row = first; row < last; ++row) {
    const T* x = static_cast<const T*>(a.x) + row * h;
    const T* res = RES ? static_cast<const T*>(a.residual) + row * h : nullptr;
    T* res_out = RES ? static_cast<T*>(a.residual_out) + row * h : nullptr;
    T* out = static_cast<T*>(a.out) + row * h;
    float acc = 0.f;
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
      const float f = res ? to_f32(res[i]) + to_f32(x[i]) : to_f32(x[i]);
      out[i] = from_f32<T>(f * inv_rms * to_f32(w[i]));
    }
  }
}

// One launch with RPB rows per block.
template <typename T, bool RES, int THREADS, int REGS, int RPB = 1, int MIN_BLOCKS = 1>
void rmsnorm_launch(const JaRmsNormArgs& a, ja_stream_t s) {
  const dim3 grid(unsigned((a.rows + RPB - 1) / RPB));
  rmsnorm_fwd_kernel<T, RES, THREADS, REGS, RPB, MIN_BLOCKS><<<grid, THREADS, 0, s>>>(a);
}

// Launch shapes chosen on an H200 (benchmarks/gpu/tune_rmsnorm.cu, bf16, rows x hidden of
// 8192 x 4096 and 32768 x 8192): without a residual, consecutive rows per block (the next
// row's loads overlap the reduction) once there are enough rows to keep at least 4096
// blocks; with a residual, whose store of x + residual already overlaps the reduction,
// one row per block with more blocks resident.
template <typename T, int THREADS, int REGS, int MIN_BLOCKS_ROWS, int MIN_BLOCKS_RES>
void rmsnorm_launch_rows(const JaRmsNormArgs& a, ja_stream_t s) {
  if (a.residual)
    rmsnorm_launch<T, true, THREADS, REGS, 1, MIN_BLOCKS_RES>(a, s);
  else if (a.rows >= 8 * 4096)
    rmsnorm_launch<T, false, THREADS, REGS, 8, MIN_BLOCKS_ROWS>(a, s);
  else if (a.rows >= 2 * 4096)
    rmsnorm_launch<T, false, THREADS, REGS, 2, MIN_BLOCKS_ROWS>(a, s);
  else
    rmsnorm_launch<T, false, THREADS, REGS, 1, MIN_BLOCKS_ROWS>(a, s);
}

template <typename T>
const char* rmsnorm_fwd_gpu(const JaRmsNormArgs& a, void* stream) {
  if (a.rows == 0 || a.hidden == 0) return nullptr;
  if (a.rows > 0x7fffffffLL) return ja_error("rmsnorm: %lld rows exceed the GPU grid limit", (long long)a.rows);
  const ja_stream_t s = static_cast<ja_stream_t>(stream);
  const int64_t nvec = a.hidden / (16 / int64_t(sizeof(T)));
  // Block shape by row length (in 16-byte vectors): up to four vectors per thread.
  if (nvec <= 64) {
    rmsnorm_launch_rows<T, 64, 1, 1, 1>(a, s);
  } else if (nvec <= 256) {
    rmsnorm_launch_rows<T, 128, 2, 1, 1>(a, s);
  } else if (nvec <= 512) {
    rmsnorm_launch_rows<T, 128, 4, 1, 4>(a, s);
  } else if (nvec <= 1024) {
    rmsnorm_launch_rows<T, 256, 4, 2, 2>(a, s);
  } else if (nvec <= 2048) {
    rmsnorm_launch_rows<T, 512, 4, 1, 1>(a, s);
  } else {
    rmsnorm_launch_rows<T, 1024, 4, 1, 1>(a, s);  // longer rows stream
  }
  const ja_error_t err = ja_get_last_error();
  if (err != ja_success) return ja_error("rmsnorm: kernel launch failed: %s", ja_get_error_string(err));
  return nullptr;
}

}  // namespace ja
