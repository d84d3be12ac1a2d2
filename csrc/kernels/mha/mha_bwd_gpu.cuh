// Flash-attention backward on the GPU (CUDA and HIP from this one source).
//
// Three kernels on the caller's stream:
//  1. mha_bwd_preprocess: delta = rowsum(dO * O) per query row, and zeroes the
//     float32 dQ accumulator (both are workspace buffers owned by the caller).
//  2. mha_bwd_dkdv: one block per (tile of BC keys, kv head, batch). It keeps
//     its dK and dV tile in registers and walks every query tile of every
//     query head of its GQA group, recomputing P = exp2(S * scale * log2 e -
//     lse * log2 e) from the forward's lse (no seq x seq matrix is stored):
//       dV += P^T dO, dP = dO V^T, dS = P * (dP - delta), dK += dS^T Q,
//       dQ += dS K * scale  (float32 atomics into dq_accum).
//     A block owns its keys for all heads of the group, so dK/dV need no atomics.
//     For bfloat16/float16 on CUDA (use_mma<T>()) this kernel is replaced by
//     the same structure on the matrix units, mha_bwd_gpu_mma.cuh.
//  3. mha_bwd_convert_dq: dq = dq_accum rounded to the input dtype.
#pragma once
#include <algorithm>
#include <initializer_list>

#include "ja/kernels/mha.h"
#include "mha/mha_bwd_gpu_mma.cuh"
#include "mha/mha_gpu_common.cuh"

namespace ja {
namespace mha_gpu {

template <typename T, int D>
constexpr int bwd_smem_bytes(int bc, int br) {
  return (2 * bc + 2 * br) * tile_ld<T, D>() * int(sizeof(T)) + 2 * bc * (br + 1) * int(sizeof(float)) +
         2 * br * int(sizeof(float));
}

// Largest (BC, BR) of (64,64), (64,32), (32,32), (32,16), (16,16) that fits without
// opt-in; where none does (float32, head_dim 256: 68 KiB), (16, 16) with opt-in, which
// a HIP device's 64 KiB of LDS cannot hold (kFits false: the launch returns an error).
template <typename T, int D>
struct BwdTiles {
  static constexpr bool fits(int bc, int br) { return bwd_smem_bytes<T, D>(bc, br) <= kSmemBudget; }
  static constexpr int BC = fits(64, 32) ? 64 : fits(32, 16) ? 32 : 16;
  static constexpr int BR = fits(BC, BC) ? BC : fits(BC, BC / 2) && BC / 2 >= kTx ? BC / 2 : kTx;
  static constexpr int kSmemBytes = bwd_smem_bytes<T, D>(BC, BR);
  static constexpr bool kFits = kSmemBytes <= kSmemMax;
  static_assert(D % kTx == 0 && BC % kTy == 0 && BR % kTx == 0 && BR % kTy == 0,
                "tile sizes must match the thread layout");
};

// Keys per block of the dK/dV kernel that runs for T: the MMA kernel's tile for 16-bit
// inputs where it exists, the SIMT kernel's otherwise (only the one used is instantiated).
template <typename T, int D, bool MMA>
struct BwdKeysPerBlock {
  static constexpr int value = BwdTiles<T, D>::BC;
};
#if JA_HAS_WARP_MMA
template <typename T, int D>
struct BwdKeysPerBlock<T, D, true> {
  static constexpr int value = BwdMmaTiles<T, D>::BC;
};
#endif

// One 16-lane group per query row: delta[b, h, i] = sum_c dO * O; dq_accum row = 0.
template <typename T, int D>
JA_GLOBAL void __launch_bounds__(kThreads) mha_bwd_preprocess(JaMhaBwdArgs a) {
  const int64_t rows = a.p.batch * a.p.seq_q * a.p.heads_q;  // row index = (b * sq + i) * hq + h
  const int tx = threadIdx.x % kTx;
  // The loop bound is uniform across the block, so every lane reaches the shuffles.
  for (int64_t base = int64_t(blockIdx.x) * kTy; base < rows; base += int64_t(gridDim.x) * kTy) {
    const int64_t row = base + threadIdx.x / kTx;
    const bool valid = row < rows;
    float sum = 0.0f;
    if (valid) {
      const T* o = static_cast<const T*>(a.o) + row * D;
      const T* g = static_cast<const T*>(a.dout) + row * D;
      float* acc = a.dq_accum + row * D;
      for (int c = tx; c < D; c += kTx) {
        sum += to_f32(o[c]) * to_f32(g[c]);
        acc[c] = 0.0f;
      }
    }
    sum = ja_group_sum<kTx>(sum);
    if (valid && tx == 0) {
      const int64_t h = row % a.p.heads_q, bi = row / a.p.heads_q;  // bi = b * sq + i
      const int64_t b = bi / a.p.seq_q, i = bi % a.p.seq_q;
      a.delta[(b * a.p.heads_q + h) * a.p.seq_q + i] = sum;
    }
  }
}

template <typename T, int D, int BC, int BR, bool CAUSAL>
JA_GLOBAL void __launch_bounds__(kThreads) mha_bwd_dkdv(JaMhaBwdArgs a) {
  constexpr int LD = tile_ld<T, D>();
  constexpr int LDT = BR + 1;   // row stride of the transposed score tiles
  constexpr int RJ = BC / kTy;  // key rows per thread
  constexpr int CI = BR / kTx;  // query columns per thread (score tiles)
  constexpr int RI = BR / kTy;  // query rows per thread (dQ)
  constexpr int DN = D / kTx;   // head-dim columns per thread
  extern __shared__ __align__(16) unsigned char smem_raw[];  // bwd_smem_bytes(BC, BR)
  T* k_s = reinterpret_cast<T*>(smem_raw);
  T* v_s = k_s + BC * LD;
  T* q_s = v_s + BC * LD;
  T* do_s = q_s + BR * LD;
  float* pt_s = reinterpret_cast<float*>(do_s + BR * LD);  // P^T (4-byte aligned: LD * sizeof(T) is)
  float* dst_s = pt_s + BC * LDT;                          // dS^T
  float* lse_s = dst_s + BC * LDT;                         // lse * log2(e)
  float* delta_s = lse_s + BR;

  const int tx = threadIdx.x % kTx, ty = threadIdx.x / kTx;
  const int64_t kv0 = int64_t(blockIdx.x) * BC, hk = blockIdx.y, b = blockIdx.z;
  const int64_t sq = a.p.seq_q, sk = a.p.seq_k, hq = a.p.heads_q, hkv = a.p.heads_kv;
  const int64_t group = hq / hkv;
  const int nk = int(sk - kv0 < BC ? sk - kv0 : BC);
  const int64_t q_stride = hq * D, kv_stride = hkv * D;
  const float s2 = a.p.scale * ja_log2e;

  load_tile<T, BC, D>(k_s, static_cast<const T*>(a.k) + ((b * sk + kv0) * hkv + hk) * D, kv_stride, nk);
  load_tile<T, BC, D>(v_s, static_cast<const T*>(a.v) + ((b * sk + kv0) * hkv + hk) * D, kv_stride, nk);

  float dk[RJ][DN], dv[RJ][DN];
#pragma unroll
  for (int j = 0; j < RJ; ++j)
#pragma unroll
    for (int d = 0; d < DN; ++d) dk[j][d] = dv[j][d] = 0.0f;

  const int64_t q_begin = CAUSAL ? first_query_for_key(kv0, sq, sk) / BR * BR : 0;
  for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
    const float* lse = a.lse + (b * hq + h) * sq;
    const float* delta = a.delta + (b * hq + h) * sq;
    for (int64_t q0 = q_begin; q0 < sq; q0 += BR) {
      const int rows = int(sq - q0 < BR ? sq - q0 : BR);
      __syncthreads();  // the previous tile's readers of q_s, do_s, pt_s, dst_s are done
      const int64_t qoff = ((b * sq + q0) * hq + h) * D;
      load_tile<T, BR, D>(q_s, static_cast<const T*>(a.q) + qoff, q_stride, rows);
      load_tile<T, BR, D>(do_s, static_cast<const T*>(a.dout) + qoff, q_stride, rows);
      for (int i = threadIdx.x; i < BR; i += kThreads) {
        lse_s[i] = i < rows ? lse[q0 + i] * ja_log2e : INFINITY;
        delta_s[i] = i < rows ? delta[q0 + i] : 0.0f;
      }
      __syncthreads();

      // S^T = K Q^T and dP^T = V dO^T for this thread's (key, query) block.
      float st[RJ][CI], dpt[RJ][CI];
#pragma unroll
      for (int j = 0; j < RJ; ++j)
#pragma unroll
        for (int i = 0; i < CI; ++i) st[j][i] = dpt[j][i] = 0.0f;
      for (int c = 0; c < D; ++c) {
        float kv[RJ], vv[RJ], qv[CI], gv[CI];
#pragma unroll
        for (int j = 0; j < RJ; ++j) {
          kv[j] = to_f32(k_s[(ty + j * kTy) * LD + c]);
          vv[j] = to_f32(v_s[(ty + j * kTy) * LD + c]);
        }
#pragma unroll
        for (int i = 0; i < CI; ++i) {
          qv[i] = to_f32(q_s[(tx + i * kTx) * LD + c]);
          gv[i] = to_f32(do_s[(tx + i * kTx) * LD + c]);
        }
#pragma unroll
        for (int j = 0; j < RJ; ++j)
#pragma unroll
          for (int i = 0; i < CI; ++i) {
            st[j][i] += kv[j] * qv[i];
            dpt[j][i] += vv[j] * gv[i];
          }
      }
#pragma unroll
      for (int j = 0; j < RJ; ++j) {
        const int kr = ty + j * kTy;
#pragma unroll
        for (int i = 0; i < CI; ++i) {
          const int qr = tx + i * kTx;
          const bool ok = kr < nk && qr < rows && key_visible(CAUSAL, q0 + qr, kv0 + kr, sq, sk);
          const float p = ok ? ja_exp2(st[j][i] * s2 - lse_s[qr]) : 0.0f;  // lse = +inf gives 0 too
          pt_s[kr * LDT + qr] = p;
          dst_s[kr * LDT + qr] = p * (dpt[j][i] - delta_s[qr]);
        }
      }
      __syncthreads();

      // dV += P^T dO and dK += dS^T Q (this thread's key rows).
      for (int i = 0; i < BR; ++i) {
        float pv[RJ], sv[RJ], gv[DN], qv[DN];
#pragma unroll
        for (int j = 0; j < RJ; ++j) {
          pv[j] = pt_s[(ty + j * kTy) * LDT + i];
          sv[j] = dst_s[(ty + j * kTy) * LDT + i];
        }
#pragma unroll
        for (int d = 0; d < DN; ++d) {
          gv[d] = to_f32(do_s[i * LD + tx + d * kTx]);
          qv[d] = to_f32(q_s[i * LD + tx + d * kTx]);
        }
#pragma unroll
        for (int j = 0; j < RJ; ++j)
#pragma unroll
          for (int d = 0; d < DN; ++d) {
            dv[j][d] += pv[j] * gv[d];
            dk[j][d] += sv[j] * qv[d];
          }
      }

      // dQ += dS K * scale, one query row at a time to bound registers.
#pragma unroll
      for (int i = 0; i < RI; ++i) {
        const int qr = ty + i * kTy;
        float acc[DN];
#pragma unroll
        for (int d = 0; d < DN; ++d) acc[d] = 0.0f;
        for (int j = 0; j < BC; ++j) {
          const float sv = dst_s[j * LDT + qr];
#pragma unroll
          for (int d = 0; d < DN; ++d) acc[d] += sv * to_f32(k_s[j * LD + tx + d * kTx]);
        }
        if (qr < rows) {
          float* dq = a.dq_accum + qoff + qr * q_stride;
#pragma unroll
          for (int d = 0; d < DN; ++d) ja_atomic_add(dq + tx + d * kTx, acc[d] * a.p.scale);
        }
      }
    }
  }

  T* dk_out = static_cast<T*>(a.dk) + ((b * sk + kv0) * hkv + hk) * D;
  T* dv_out = static_cast<T*>(a.dv) + ((b * sk + kv0) * hkv + hk) * D;
#pragma unroll
  for (int j = 0; j < RJ; ++j) {
    const int kr = ty + j * kTy;
    if (kr >= nk) continue;
#pragma unroll
    for (int d = 0; d < DN; ++d) {
      dk_out[kr * kv_stride + tx + d * kTx] = from_f32<T>(dk[j][d] * a.p.scale);
      dv_out[kr * kv_stride + tx + d * kTx] = from_f32<T>(dv[j][d]);
    }
  }
}

template <typename T>
JA_GLOBAL void __launch_bounds__(kThreads) mha_bwd_convert_dq(const float* acc, T* dq, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads)
    dq[i] = from_f32<T>(acc[i]);
}

}  // namespace mha_gpu

template <typename T, int D, bool CAUSAL>
const char* mha_bwd_gpu(const JaMhaBwdArgs& a, void* stream) {
  using Tiles = mha_gpu::BwdTiles<T, D>;
  using mha_gpu::kThreads;
  const ja_stream_t s = static_cast<ja_stream_t>(stream);
  const int64_t q_rows = a.p.batch * a.p.seq_q * a.p.heads_q;
  if (q_rows == 0 && a.p.batch * a.p.seq_k * a.p.heads_kv == 0) return nullptr;
  if (const char* e = mha_gpu::use_mma<T>()
                          ? mha_gpu::refuse_unhandled("mha_bwd", "mma.sync", a, mha_gpu::kBwdMmaFeatures)
                          : mha_gpu::refuse_unhandled("mha_bwd", "SIMT", a, mha_gpu::kBwdSimtFeatures))
    return e;
  for (const void* p : {a.q, a.k, a.v, a.dout})
    if (!mha_gpu::aligned16(p)) return ja_error("mha_bwd: q, k, v and dout must be 16-byte aligned on the GPU");
  constexpr int kBC = mha_gpu::BwdKeysPerBlock<T, D, mha_gpu::use_mma<T>()>::value;
  const int64_t kv_tiles = (a.p.seq_k + kBC - 1) / kBC;
  if (const char* e = mha_gpu::check_grid("mha_bwd", kv_tiles, a.p.heads_kv, a.p.batch)) return e;
  const int64_t max_blocks = int64_t(1) << 20;  // grid-stride loops cover the rest

  if (q_rows > 0) {
    const int64_t blocks = std::min<int64_t>((q_rows + mha_gpu::kTy - 1) / mha_gpu::kTy, max_blocks);
    mha_gpu::mha_bwd_preprocess<T, D><<<unsigned(blocks), kThreads, 0, s>>>(a);
    if (const char* e = mha_gpu::launch_status("mha_bwd (preprocess)")) return e;
  }
#if JA_HAS_WARP_MMA
  // 16-bit inputs on the matrix units; float32 keeps the SIMT kernel (exact float32 products).
  if constexpr (mha_gpu::use_mma<T>()) {
    if (const char* e = mha_gpu::mha_bwd_mma_launch<T, D, CAUSAL>(a, s)) return e;
  } else
#endif
  {
    if constexpr (!Tiles::kFits) {
      return ja_error("mha_bwd: %s with head_dim %d needs %d bytes of shared memory per block, more than "
                      "this GPU has (%d); use bfloat16 or float16", dtype_name(dtype_of<T>::value), D,
                      Tiles::kSmemBytes, mha_gpu::kSmemMax);
    } else if (kv_tiles > 0) {
      const dim3 grid(unsigned(kv_tiles), unsigned(a.p.heads_kv), unsigned(a.p.batch));
      if (const char* e = mha_gpu::launch_with_smem(mha_gpu::mha_bwd_dkdv<T, D, Tiles::BC, Tiles::BR, CAUSAL>,
                                                    grid, kThreads, Tiles::kSmemBytes, s, a, "mha_bwd (dK/dV/dQ)"))
        return e;
    }
  }
  if (q_rows > 0) {
    const int64_t n = q_rows * a.p.head_dim;
    const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, max_blocks);
    mha_gpu::mha_bwd_convert_dq<T><<<unsigned(blocks), kThreads, 0, s>>>(a.dq_accum, static_cast<T*>(a.dq), n);
    if (const char* e = mha_gpu::launch_status("mha_bwd (convert dQ)")) return e;
  }
  return nullptr;
}

}  // namespace ja
