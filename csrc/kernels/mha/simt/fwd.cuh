// Flash-attention forward on the GPU, the SIMT kernel (CUDA and HIP from this one source), which runs every
// feature: float32, HIP, and bias and dropout everywhere (fwd_gpu.cuh sends a call here when no faster kernel
// takes it).
//
// The SIMT kernel: one block per (tile of BR query rows, query head, batch). The Q tile stays in shared
// memory; K and V tiles of BC rows stream through it, only those inside the keys the tile's rows see
// ([lo of its first row, hi of its last row): the mask's rows are non-decreasing). Each thread holds a
// (BR/8) x (BC/16) block of scores and a (BR/8) x (D/16) block of the output in registers; the online
// softmax keeps a running max and sum per row (16-lane shuffles), and P goes through shared memory for
// O += P V. Nothing of size seq x seq touches global memory. The score takes softcap, ALiBi and the bias
// (ScoreTerms); dropout scales P's kept elements after the row sum (the lse is of the undropped P).
// A key a row does not see never reaches it: its score is selected to -inf (whatever K holds), and where a
// V tile holds a NaN or an infinity the P V product skips the zeros of P (0 * inf would be NaN).
#pragma once
#include "ja/kernels/mha.h"
#include "mha/common/gpu.cuh"

namespace ja {
namespace mha_gpu {

template <typename T, int D>
constexpr int fwd_smem_bytes(int br, int bc) {
  return (br + 2 * bc) * tile_ld<T, D>() * int(sizeof(T)) + br * (bc + 1) * int(sizeof(float)) +
         (3 + (bc + 31) / 32) * br * int(sizeof(int32_t));
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

template <typename T, int D, int BR, int BC>
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
  int32_t* lo_s = reinterpret_cast<int32_t*>(p_s + BR * LDP);  // per tile row: the keys [lo, hi) it sees
  int32_t* hi_s = lo_s + BR;
  int32_t* dg_s = hi_s + BR;  // and its diagonal (ALiBi's origin)
  constexpr int W = (BC + 31) / 32;
  uint32_t* drop_s = reinterpret_cast<uint32_t*>(dg_s + BR);  // [BR][W]: dropout's keep bits of the tile

  const JaMhaProblem& p = a.p;
  const int tx = threadIdx.x % kTx, ty = threadIdx.x / kTx;
  const auto [q0, h, b, sq, sk, hq, hkv, hk, q_stride, k_stride, v_stride, o_stride, rows, s2] =
      fwd_block(a, grid_place(false, true), BR);  // the grid's order
  const int hd = int(p.head_dim), hdv = int(p.head_dim_v);
  const bool vec = vec_dims<T>(p);
  const T* k = static_cast<const T*>(a.k) + (b * sk * hkv + hk) * hd;
  const T* v = static_cast<const T*>(a.v) + (b * sk * hkv + hk) * hdv;

  load_tile<T, BR, D>(q_s, static_cast<const T*>(a.q) + ((b * sq + q0) * hq + h) * hd, q_stride, rows, hd, vec);
  for (int i = threadIdx.x; i < BR; i += kThreads) {
    const MhaRow r = i < rows ? mha_row(p, b, q0 + i) : MhaRow{0, 0, 0};  // padding rows see nothing
    lo_s[i] = int32_t(r.lo), hi_s[i] = int32_t(r.hi), dg_s[i] = int32_t(r.diag);
  }
  __syncthreads();
  const ScoreTerms terms = score_terms(p, b, h);
  const bool plain = !terms.any();
  const Dropout drop = dropout_of(p);

  float o[RM][DN];
  float m[RM], l[RM];
#pragma unroll
  for (int i = 0; i < RM; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
#pragma unroll
    for (int d = 0; d < DN; ++d) o[i][d] = 0.0f;
  }

  // Key tiles outside [lo of the first row, hi of the last row) are skipped.
  const int64_t kv_begin = lo_s[0], kv_end = hi_s[rows - 1];
  for (int64_t kv0 = kv_begin; kv0 < kv_end; kv0 += BC) {
    const int nk = int(kv_end - kv0 < BC ? kv_end - kv0 : BC);  // keys past kv_end are zeros: no row sees them
    __syncthreads();  // the previous tile's readers of k_s, v_s, p_s, drop_s are done
    if (drop.on) drop.tile_bits<BR, W>(b, h, q0, rows, kv0, nk, drop_s);
    load_tile<T, BC, D>(k_s, k + kv0 * k_stride, k_stride, nk, hd, vec);
    const bool vbad = load_tile<T, BC, D, true>(v_s, v + kv0 * v_stride, v_stride, nk, hdv, vec);
    const bool guard = __syncthreads_or(vbad);  // a NaN/inf in V: P V skips P's zeros

    float s[RM][CN];
#pragma unroll
    for (int i = 0; i < RM; ++i)
#pragma unroll
      for (int j = 0; j < CN; ++j) s[i][j] = 0.0f;
    for (int c = 0; c < hd; ++c) {
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
      const int64_t lo = lo_s[r], hi = hi_s[r], diag = dg_s[r];
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < CN; ++j) {
        const int col = tx + j * kTx;
        const int64_t key = kv0 + col;
        float x = -INFINITY;  // a key the row does not see: -inf whatever its score holds
        if (col < nk && lo <= key && key < hi) {
          float t;
          x = plain ? s[i][j] * s2 : terms(s[i][j], q0 + r, diag, key, &t) * ja_log2e;
        }
        s[i][j] = x;
        mx = fmaxf(mx, x);
      }
      const float m_new = fmaxf(m[i], ja_group_max<kTx>(mx));
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // no key seen yet: keep everything at 0
      const float alpha = ja_exp2(m[i] - m_use);
      float rs = 0.0f;
#pragma unroll
      for (int j = 0; j < CN; ++j) {
        const int col = tx + j * kTx;
        float pe = ja_exp2(s[i][j] - m_use);
        rs += pe;  // the row sum (and so the lse) is of the undropped P
        if (drop.on) pe *= drop.factor(drop_s, W, r, col);
        p_s[r * LDP + col] = pe;
      }
      l[i] = l[i] * alpha + ja_group_sum<kTx>(rs);
      m[i] = m_new;
#pragma unroll
      for (int d = 0; d < DN; ++d) o[i][d] *= alpha;
    }
    __syncthreads();

    if (!guard) {
      for (int j = 0; j < nk; ++j) {
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
    } else {
      for (int j = 0; j < nk; ++j) {  // the same sums without the products of P's zeros
        float pv[RM], vv[DN];
#pragma unroll
        for (int i = 0; i < RM; ++i) pv[i] = p_s[(ty + i * kTy) * LDP + j];
#pragma unroll
        for (int d = 0; d < DN; ++d) vv[d] = to_f32(v_s[j * LD + tx + d * kTx]);
#pragma unroll
        for (int i = 0; i < RM; ++i)
#pragma unroll
          for (int d = 0; d < DN; ++d) o[i][d] += pv[i] != 0.0f ? pv[i] * vv[d] : 0.0f;
      }
    }
  }

  T* out = static_cast<T*>(a.o) + ((b * sq + q0) * hq + h) * hdv;
  float* lse = a.lse + (b * hq + h) * sq + q0;
#pragma unroll
  for (int i = 0; i < RM; ++i) {
    const int r = ty + i * kTy;
    if (r >= rows) continue;
    const bool empty = l[i] == 0.0f;  // no visible key: output 0, lse = +inf
    const float inv = empty ? 0.0f : 1.0f / l[i];
#pragma unroll
    for (int d = 0; d < DN; ++d) {
      const int col = tx + d * kTx;
      if (col < hdv) out[r * o_stride + col] = from_f32<T>(o[i][d] * inv);
    }
    if (tx == 0) lse[r] = empty ? INFINITY : (m[i] + ja_log2(l[i])) * kLn2;
  }
}

template <typename T, int D>
const char* mha_fwd_simt_launch(const JaMhaFwdArgs& a, ja_stream_t stream) {
  using Tiles = FwdTiles<T, D>;
  if (const char* e = refuse_unhandled("mha_fwd", "SIMT", a.p, kFwdSimtFeatures)) return e;
  const int64_t q_tiles = (a.p.seq_q + Tiles::BR - 1) / Tiles::BR;
  if (const char* e = check_grid("mha_fwd", q_tiles, a.p.heads_q, a.p.batch)) return e;
  const dim3 grid(unsigned(q_tiles), unsigned(a.p.heads_q), unsigned(a.p.batch));
  return launch_with_smem(mha_fwd_kernel<T, D, Tiles::BR, Tiles::BC>, grid, kThreads, Tiles::kSmemBytes, stream, a,
                          "mha_fwd");
}

}  // namespace mha_gpu
}  // namespace ja
