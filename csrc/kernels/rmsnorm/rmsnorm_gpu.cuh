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
#include "gpu_launch.cuh"

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

// v[j] summed over the block, for N values at once (the rows of a block), with one barrier: each
// warp's sums go to shared memory (N * THREADS / 32 floats), and every thread adds up all warps'.
// smem must not be written again by this block (one call per kernel).
template <int THREADS, int N>
JA_DEVICE void block_sums(float (&v)[N], float* smem) {
  constexpr int kWarps = THREADS / ja_warp_size();
#pragma unroll
  for (int j = 0; j < N; ++j) v[j] = ja_warp_sum(v[j]);
  if (threadIdx.x % ja_warp_size() == 0) {
#pragma unroll
    for (int j = 0; j < N; ++j) smem[j * kWarps + threadIdx.x / ja_warp_size()] = v[j];
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < N; ++j) {
    float t = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) t += smem[j * kWarps + w];
    v[j] = t;
  }
}

// When a one-row block (RPB = 1) reads the weight (several-row blocks keep it in registers).
// (Asking for its lines in L1 before the reduction, prefetch.global.L1, measured slower than
// both on the H200: benchmarks/gpu/tune_rmsnorm.cu.)
enum RmsWeight : int {
  kWeightAfter = 0,  // after the reduction (an L1/L2 hit): fewest registers, most blocks resident
  kWeightEarly = 1,  // loaded with the row, held in registers across the reduction
};

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
// RPB: consecutive rows per block, loaded together and reduced together (one
// barrier for all of them), with the weight read once per block into
// registers. With RPB = 1 the weight is read
// after the reduction instead (an L1/L2 hit), which leaves the registers to more
// resident blocks, hence more rows in flight per multiprocessor.
// MIN_BLOCKS: resident blocks per multiprocessor asked of the register allocator.
// RES: a residual is added first (a.residual is set).
// WMODE: when a one-row block reads the weight (RmsWeight).
template <typename T, bool RES, int THREADS, int REGS, int RPB = 1, int MIN_BLOCKS = 1, int WMODE = kWeightAfter>
JA_GLOBAL void __launch_bounds__(THREADS, MIN_BLOCKS) rmsnorm_fwd_kernel(JaRmsNormArgs a) {
  constexpr int VEC = 16 / sizeof(T);
  using V = Vec<T, VEC>;
  __shared__ float smem[(THREADS / 32) * RPB + 1];  // block_sums: RPB per warp; block_sum: one per warp + 1
  pdl_wait();  // launched with PDL (gpu_launch.cuh): the previous kernel's writes are visible from here
  pdl_launch_dependents();
  const int64_t h = a.hidden;
  const int64_t first = int64_t(blockIdx.x) * RPB;
  const int64_t last = first + RPB < a.rows ? first + RPB : a.rows;
  const T* w = static_cast<const T*>(a.weight);
  const bool vec_ok = (h % VEC) == 0;
  const int64_t nvec = vec_ok ? h / VEC : 0;
  const bool fits = vec_ok && nvec <= int64_t(THREADS) * REGS;

  if (fits) {
    // The block's RPB rows are processed together: every load (x, residual and the weight) is
    // issued before any arithmetic, so all of them are in flight at once, and the rows' sums of
    // squares go through one block reduction.
    constexpr bool WREG = RPB > 1 || WMODE == kWeightEarly;  // the weight in registers
    V xv[RPB][REGS], rv[RES ? RPB : 1][REGS], wv[WREG ? REGS : 1];
    auto row_ok = [&](int j) { return first + j < last; };  // uniform: the last block may have fewer rows
#pragma unroll
    for (int j = 0; j < RPB; ++j) {
      if (row_ok(j)) {
        const int64_t off = (first + j) * h;
        load_row<V, THREADS, REGS, RES>(
            xv[j], rv[RES ? j : 0], reinterpret_cast<const V*>(static_cast<const T*>(a.x) + off),
            RES ? reinterpret_cast<const V*>(static_cast<const T*>(a.residual) + off) : nullptr, nvec);
      }
    }
    if constexpr (WREG) {
#pragma unroll
      for (int r = 0; r < REGS; ++r) {
        const int64_t i = int64_t(threadIdx.x) + int64_t(r) * THREADS;
        if (i < nvec) wv[r] = reinterpret_cast<const V*>(w)[i];
      }
    }
    // x (+ residual) in float32, element k of vector r of row j: computed for the sum of squares and
    // again, after reg_barrier, for the output, so the rows stay in registers in their input dtype only.
    auto value = [&](int j, int r, int k) {
      return RES ? to_f32(xv[j][r].v[k]) + to_f32(rv[RES ? j : 0][r].v[k]) : to_f32(xv[j][r].v[k]);
    };
    float acc[RPB];
#pragma unroll
    for (int j = 0; j < RPB; ++j) {
      V* res_out = RES ? reinterpret_cast<V*>(static_cast<T*>(a.residual_out) + (first + j) * h) : nullptr;
      float part[REGS];  // one sum per vector: independent chains
#pragma unroll
      for (int r = 0; r < REGS; ++r) {
        part[r] = 0.f;
        const int64_t i = int64_t(threadIdx.x) + int64_t(r) * THREADS;
        if (row_ok(j) && i < nvec) {
          V ov;
#pragma unroll
          for (int k = 0; k < VEC; ++k) {
            const float f = value(j, r, k);
            part[r] += f * f;
            ov.v[k] = from_f32<T>(f);
          }
          if (RES) res_out[i] = ov;
        }
      }
      acc[j] = 0.f;
#pragma unroll
      for (int r = 0; r < REGS; ++r) acc[j] += part[r];
    }
    block_sums<THREADS, RPB>(acc, smem);
#pragma unroll
    for (int j = 0; j < RPB; ++j) {
#pragma unroll
      for (int r = 0; r < REGS; ++r) {
        reg_barrier(xv[j][r]);
        if (RES) reg_barrier(rv[j][r]);
      }
    }
#pragma unroll
    for (int j = 0; j < RPB; ++j) {
      if (!row_ok(j)) break;
      const float inv_rms = ja_rsqrt(acc[j] / float(h) + a.eps);
      V* out = reinterpret_cast<V*>(static_cast<T*>(a.out) + (first + j) * h);
#pragma unroll
      for (int r = 0; r < REGS; ++r) {
        const int64_t i = int64_t(threadIdx.x) + int64_t(r) * THREADS;
        if (i < nvec) {
          V wr;
          if constexpr (WREG) wr = wv[r];
          else wr = reinterpret_cast<const V*>(w)[i];
          V ov;
#pragma unroll
          for (int k = 0; k < VEC; ++k) ov.v[k] = from_f32<T>(value(j, r, k) * inv_rms * to_f32(wr.v[k]));
          out[i] = ov;
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
template <typename T, bool RES, int THREADS, int REGS, int RPB = 1, int MIN_BLOCKS = 1, int WMODE = kWeightAfter>
ja_error_t rmsnorm_launch(const JaRmsNormArgs& a, ja_stream_t s) {
  const dim3 grid(unsigned((a.rows + RPB - 1) / RPB));
  return launch_pdl(rmsnorm_fwd_kernel<T, RES, THREADS, REGS, RPB, MIN_BLOCKS, WMODE>, grid, dim3(THREADS), 0, s, a);
}

// One row per block by default, for plain RMSNorm and with a residual: with RPB = 1 the
// weight is read after the reduction, so the kernel needs 55 registers (70 with a residual)
// and a multiprocessor holds enough blocks to keep 40-100 KiB of rows in flight, which is
// what the copy rate needs at large sizes. PLAIN_RPB (rows per block without a residual,
// where `two_rows` holds) and RES_W (where a residual's one-row block reads the weight) are
// the exceptions that benchmarks/gpu/tune_rmsnorm.cu measured faster on the H200 with a cold
// L2 at every size it applies to (hidden 4096 and 5120, 1k-32k rows).
template <typename T, int THREADS, int REGS, int PLAIN_RPB = 1, int RES_W = kWeightAfter>
ja_error_t rmsnorm_launch_rows(const JaRmsNormArgs& a, ja_stream_t s, bool two_rows = true) {
  if (a.residual) return rmsnorm_launch<T, true, THREADS, REGS, 1, 1, RES_W>(a, s);
  if (PLAIN_RPB > 1 && two_rows) return rmsnorm_launch<T, false, THREADS, REGS, PLAIN_RPB, 1>(a, s);
  return rmsnorm_launch<T, false, THREADS, REGS, 1, 1>(a, s);
}

template <typename T>
const char* rmsnorm_fwd_gpu(const JaRmsNormArgs& a, void* stream) {
  if (a.rows == 0 || a.hidden == 0) return nullptr;
  if (a.rows > 0x7fffffffLL) return ja_error("rmsnorm: %lld rows exceed the GPU grid limit", (long long)a.rows);
  const ja_stream_t s = static_cast<ja_stream_t>(stream);
  const int64_t nvec = a.hidden / (16 / int64_t(sizeof(T)));
  ja_error_t err;
  // Block shape by row length (in 16-byte vectors): blocks that hold the common widths
  // exactly (hidden 4096, 5120 and 7168 in 16-bit: 512, 640 and 896 vectors, 128 x 4,
  // 160 x 4 and, without a residual, 128 x 7), so no warp idles through the row. The
  // exceptions benchmarks/gpu/tune_rmsnorm.cu chose on the H200 (against one row per block
  // with the weight read after the reduction): plain rows two to a block at 512 vectors up to
  // 8k rows and at 640 vectors; 896 vectors plain as 128 x 7 rather than 224 x 4. Four rows to
  // a block lost at every size; a residual's weight held in registers at 512 vectors stopped
  // gaining once the rows of a block were reduced together (within the runs' noise).
  if (nvec <= 64) {
    err = rmsnorm_launch_rows<T, 64, 1>(a, s);
  } else if (nvec <= 256) {
    err = rmsnorm_launch_rows<T, 128, 2>(a, s);
  } else if (nvec <= 512) {
    err = rmsnorm_launch_rows<T, 128, 4, 2, kWeightEarly>(a, s, a.rows <= 8192);
  } else if (nvec <= 640) {
    err = rmsnorm_launch_rows<T, 160, 4, 2>(a, s);
  } else if (nvec <= 896) {
    if (a.residual) err = rmsnorm_launch_rows<T, 224, 4>(a, s);
    else err = rmsnorm_launch_rows<T, 128, 7>(a, s);
  } else if (nvec <= 1024) {
    err = rmsnorm_launch_rows<T, 256, 4>(a, s);
  } else if (nvec <= 2048) {
    err = rmsnorm_launch_rows<T, 512, 4>(a, s);
  } else {
    err = rmsnorm_launch_rows<T, 1024, 4>(a, s);  // longer rows stream
  }
  if (err != ja_success) return ja_error("rmsnorm: kernel launch failed: %s", ja_get_error_string(err));
  return nullptr;
}

}  // namespace ja
