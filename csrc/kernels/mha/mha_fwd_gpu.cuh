// Flash-attention forward on the GPU (CUDA and HIP from this one source).
//
// One block per (tile of BR query rows, query head, batch). The Q tile stays
// in shared memory; K and V tiles of BC rows stream through it. Each thread
// holds a (BR/8) x (BC/16) block of scores and a (BR/8) x (D/16) block of the
// output in registers; the online softmax keeps a running max and sum per row
// (16-lane shuffles), and P goes through shared memory for O += P V. Nothing
// of size seq x seq touches global memory.
#pragma once
#include "ja/kernels/mha.h"
#include "mha/mha_fwd_gpu_decode.cuh"
#include "mha/mha_fwd_gpu_mma.cuh"
#include "mha/mha_gpu_common.cuh"

namespace ja {
namespace mha_gpu {

template <typename T, int D>
constexpr int fwd_smem_bytes(int br, int bc) {
  return (br + 2 * bc) * tile_ld<T, D>() * int(sizeof(T)) + br * (bc + 1) * int(sizeof(float));
}

// Largest tiles that fit the shared-memory budget without opt-in; where even the
// smallest do not (float32, head_dim 256: 50 KiB), the smallest, with opt-in.
template <typename T, int D>
struct FwdTiles {
  static constexpr int BR = fwd_smem_bytes<T, D>(64, 16) <= kSmemBudget   ? 64
                            : fwd_smem_bytes<T, D>(32, 16) <= kSmemBudget ? 32
                                                                          : 16;
  static constexpr int BC = fwd_smem_bytes<T, D>(BR, 64) <= kSmemBudget   ? 64
                            : fwd_smem_bytes<T, D>(BR, 32) <= kSmemBudget ? 32
                                                                          : 16;
  static constexpr int kSmemBytes = fwd_smem_bytes<T, D>(BR, BC);
  static_assert(kSmemBytes <= kSmemMax, "MHA forward tiles exceed shared memory");
  static_assert(D % kTx == 0 && BR % kTy == 0 && BC % kTx == 0, "tile sizes must match the thread layout");
};

template <typename T, int D, int BR, int BC, bool CAUSAL>
JA_GLOBAL void __launch_bounds__(kThreads) mha_fwd_kernel(JaMhaFwdArgs a) {
  constexpr int LD = tile_ld<T, D>();
  constexpr int LDP = BC + 1;
  constexpr int RM = BR / kTy;  // rows per thread
  constexpr int CN = BC / kTx;  // score columns per thread
  constexpr int DN = D / kTx;   // output columns per thread
  extern __shared__ __align__(16) unsigned char smem_raw[];  // fwd_smem_bytes(BR, BC)
  T* q_s = reinterpret_cast<T*>(smem_raw);
  T* k_s = q_s + BR * LD;
  T* v_s = k_s + BC * LD;
  float* p_s = reinterpret_cast<float*>(v_s + BC * LD);  // 4-byte aligned: LD * sizeof(T) is

  const int tx = threadIdx.x % kTx, ty = threadIdx.x / kTx;
  const auto [q0, h, b, sq, sk, hq, hkv, hk, q_stride, kv_stride, rows, s2] =
      fwd_block<D>(a, grid_place(false, true), BR);  // the grid's order
  const T* k = static_cast<const T*>(a.k) + (b * sk * hkv + hk) * D;
  const T* v = static_cast<const T*>(a.v) + (b * sk * hkv + hk) * D;

  load_tile<T, BR, D>(q_s, static_cast<const T*>(a.q) + ((b * sq + q0) * hq + h) * D, q_stride, rows);

  float o[RM][DN];
  float m[RM], l[RM];
#pragma unroll
  for (int i = 0; i < RM; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
#pragma unroll
    for (int d = 0; d < DN; ++d) o[i][d] = 0.0f;
  }

  // Keys after the last one visible to the tile's last row are skipped.
  int64_t kv_end = sk;
  if (CAUSAL) {
    kv_end = q0 + rows + sk - sq;
    kv_end = kv_end < 0 ? 0 : (kv_end > sk ? sk : kv_end);
  }
  for (int64_t kv0 = 0; kv0 < kv_end; kv0 += BC) {
    const int nk = int(sk - kv0 < BC ? sk - kv0 : BC);
    __syncthreads();  // the previous tile's readers of k_s, v_s, p_s are done
    load_tile<T, BC, D>(k_s, k + kv0 * kv_stride, kv_stride, nk);
    load_tile<T, BC, D>(v_s, v + kv0 * kv_stride, kv_stride, nk);
    __syncthreads();

    float s[RM][CN];
#pragma unroll
    for (int i = 0; i < RM; ++i)
#pragma unroll
      for (int j = 0; j < CN; ++j) s[i][j] = 0.0f;
    for (int c = 0; c < D; ++c) {
      float qv[RM], kv[CN];
#pragma unroll
      for (int i = 0; i < RM; ++i) qv[i] = to_f32(q_s[(ty + i * kTy) * LD + c]);
#pragma unroll
      for (int j = 0; j < CN; ++j) kv[j] = to_f32(k_s[(tx + j * kTx) * LD + c]);
#pragma unroll
      for (int i = 0; i < RM; ++i)
#pragma unroll
        for (int j = 0; j < CN; ++j) s[i][j] += qv[i] * kv[j];
    }

#pragma unroll
    for (int i = 0; i < RM; ++i) {
      const int r = ty + i * kTy;
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < CN; ++j) {
        const int col = tx + j * kTx;
        const bool ok = r < rows && col < nk && key_visible(CAUSAL, q0 + r, kv0 + col, sq, sk);
        s[i][j] = ok ? s[i][j] * s2 : -INFINITY;
        mx = fmaxf(mx, s[i][j]);
      }
      const float m_new = fmaxf(m[i], ja_group_max<kTx>(mx));
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // no key seen yet: keep everything at 0
      const float alpha = ja_exp2(m[i] - m_use);
      float rs = 0.0f;
#pragma unroll
      for (int j = 0; j < CN; ++j) {
        const float p = ja_exp2(s[i][j] - m_use);
        p_s[r * LDP + tx + j * kTx] = p;
        rs += p;
      }
      l[i] = l[i] * alpha + ja_group_sum<kTx>(rs);
      m[i] = m_new;
#pragma unroll
      for (int d = 0; d < DN; ++d) o[i][d] *= alpha;
    }
    __syncthreads();

    for (int j = 0; j < BC; ++j) {
      float pv[RM], vv[DN];
#pragma unroll
      for (int i = 0; i < RM; ++i) pv[i] = p_s[(ty + i * kTy) * LDP + j];
#pragma unroll
      for (int d = 0; d < DN; ++d) vv[d] = to_f32(v_s[j * LD + tx + d * kTx]);
#pragma unroll
      for (int i = 0; i < RM; ++i)
#pragma unroll
        for (int d = 0; d < DN; ++d) o[i][d] += pv[i] * vv[d];
    }
  }

  T* out = static_cast<T*>(a.o) + ((b * sq + q0) * hq + h) * D;
  float* lse = a.lse + (b * hq + h) * sq + q0;
#pragma unroll
  for (int i = 0; i < RM; ++i) {
    const int r = ty + i * kTy;
    if (r >= rows) continue;
    const bool empty = l[i] == 0.0f;  // no visible key: output 0, lse = +inf
    const float inv = empty ? 0.0f : 1.0f / l[i];
#pragma unroll
    for (int d = 0; d < DN; ++d) out[r * q_stride + tx + d * kTx] = from_f32<T>(o[i][d] * inv);
    if (tx == 0) lse[r] = empty ? INFINITY : (m[i] + ja_log2(l[i])) * kLn2;
  }
}

}  // namespace mha_gpu

template <typename T, int D, bool CAUSAL>
const char* mha_fwd_gpu(const JaMhaFwdArgs& a, void* stream) {
  using Tiles = mha_gpu::FwdTiles<T, D>;
  if (a.p.batch == 0 || a.p.seq_q == 0 || a.p.heads_q == 0) return nullptr;
  if (!mha_gpu::aligned16(a.q) || !mha_gpu::aligned16(a.k) || !mha_gpu::aligned16(a.v))
    return ja_error("mha_fwd: q, k and v must be 16-byte aligned on the GPU");
#if JA_HAS_WARP_MMA
  // 16-bit inputs on the matrix units; float32 keeps the SIMT kernel (exact float32 products).
  // Few query rows per kv head (decode): split-KV over the keys (mha_fwd_gpu_decode.cuh).
  if constexpr (mha_gpu::use_mma<T>()) {
    if (mha_gpu::decode_applies(a))
      return mha_gpu::mha_decode_launch<T, D, CAUSAL>(a, static_cast<ja_stream_t>(stream));
    return mha_gpu::mha_fwd_mma_launch<T, D, CAUSAL>(a, static_cast<ja_stream_t>(stream));
  } else
#endif
  {
    if (const char* e = mha_gpu::refuse_unhandled("mha_fwd", "SIMT", a.p, mha_gpu::kFwdSimtFeatures)) return e;
    const int64_t q_tiles = (a.p.seq_q + Tiles::BR - 1) / Tiles::BR;
    if (const char* e = mha_gpu::check_grid("mha_fwd", q_tiles, a.p.heads_q, a.p.batch)) return e;
    const dim3 grid(unsigned(q_tiles), unsigned(a.p.heads_q), unsigned(a.p.batch));
    return mha_gpu::launch_with_smem(mha_gpu::mha_fwd_kernel<T, D, Tiles::BR, Tiles::BC, CAUSAL>, grid,
                                     mha_gpu::kThreads, Tiles::kSmemBytes, static_cast<ja_stream_t>(stream), a,
                                     "mha_fwd");
  }
}

}  // namespace ja
