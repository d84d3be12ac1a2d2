// Flash-attention backward on the GPU, the SIMT kernels (CUDA and HIP from this one source), which run every
// feature, and the preprocess and dQ conversion that the mma.sync path shares (bwd_gpu.cuh: the dispatch).
//
// Kernels on the caller's stream:
//  1. mha_bwd_preprocess: delta = rowsum(dO * O) per query row, and (unless deterministic) zeroes the
//     float32 dQ accumulator (both are workspace buffers owned by the caller).
//  2. mha_bwd_dkdv: one block per (tile of BC keys, kv head, batch). It keeps its dK and dV tile in
//     registers and walks the query tiles of every query head of its GQA group that see its keys (the
//     mask's cols: [q_lo of its first key, q_hi of its last key)), recomputing P = exp(s - lse) from the
//     forward's lse (no seq x seq matrix is stored):
//       dV += (P * drop)^T dO, dP = (dO V^T) * drop, dS = P * (dP - delta), dX = dS * softcap'(s),
//       dK += dX^T Q * scale, and unless deterministic dQ += dX K * scale (float32 atomics into dq_accum).
//     drop is dropout's factor (0 or 1 / (1 - p), recomputed from the seed), softcap' = 1 - tanh^2; dbias
//     (the gradient of the score s) is dS. A block owns its keys for all heads of the group, so dK/dV need
//     no atomics.
//  3. deterministic: mha_bwd_dq, one block per (tile of query rows, query head, batch), walks the key
//     tiles its rows see and sums dQ = dX K * scale in a fixed order (no atomics): bitwise the same run
//     after run. It recomputes S and dP (two more products per key tile than the atomics; the dK/dV
//     kernel then skips its dQ product).
//     Otherwise mha_bwd_convert_dq: dq = dq_accum rounded to the input dtype.
// A key a row does not see never reaches its gradients: P and dX of such a pair are selected to 0 whatever
// K and V hold, and where a K tile holds a NaN or an infinity the dQ product skips dX's zeros; where a Q or dO
// tile does, the dK and dV products skip them (a hidden row's Q and dO never reach the key).
#pragma once
#include <algorithm>
#include <initializer_list>

#include "ja/kernels/mha.h"
#include "mha/common/gpu.cuh"

namespace ja {
namespace mha_gpu {

template <typename T, int D>
constexpr int bwd_smem_bytes(int bc, int br) {
  return (2 * bc + 2 * br) * tile_ld<T, D>() * int(sizeof(T)) + 2 * bc * (br + 1) * int(sizeof(float)) +
         2 * br * int(sizeof(float)) + (3 + (bc + 31) / 32) * br * int(sizeof(int32_t));
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

// The deterministic dQ kernel: Q, dO [BR][LD], K, V [BC][LD] (T), dX [BR][BC + 1], lse, delta [BR] (float),
// the rows' lo, hi, diag [BR] and dropout's keep bits [BR][ceil(BC / 32)] (int32).
template <typename T, int D>
constexpr int dq_smem_bytes(int br, int bc) {
  return (2 * br + 2 * bc) * tile_ld<T, D>() * int(sizeof(T)) + br * (bc + 1) * int(sizeof(float)) +
         2 * br * int(sizeof(float)) + (3 + (bc + 31) / 32) * br * int(sizeof(int32_t));
}

template <typename T, int D>
struct DqTiles {
  static constexpr int BR = dq_smem_bytes<T, D>(64, 32) <= kSmemBudget   ? 64
                            : dq_smem_bytes<T, D>(32, 16) <= kSmemBudget ? 32
                                                                         : 16;
  static constexpr int BC = dq_smem_bytes<T, D>(BR, 64) <= kSmemBudget   ? 64
                            : dq_smem_bytes<T, D>(BR, 32) <= kSmemBudget ? 32
                                                                         : 16;
  static constexpr int kSmemBytes = dq_smem_bytes<T, D>(BR, BC);
  static constexpr bool kFits = kSmemBytes <= kSmemMax;
  static_assert(D % kTx == 0 && BR % kTy == 0 && BC % kTx == 0, "tile sizes must match the thread layout");
};

// One 16-lane group per query row: delta[b, h, i] = sum_c dO * O; dq_accum row = 0 (unless deterministic:
// the dQ kernels write dq themselves). Row lengths are the call's head_dim_v and head_dim (D, the instance's,
// is unused: the sm_90a backward shares this kernel).
template <typename T, int D>
JA_GLOBAL void __launch_bounds__(kThreads) mha_bwd_preprocess(JaMhaBwdArgs a) {
  const JaMhaProblem& p = a.p;
  const int64_t rows = p.batch * p.seq_q * p.heads_q;  // row index = (b * sq + i) * hq + h
  const int64_t hd = p.head_dim, hdv = p.head_dim_v;
  const int tx = threadIdx.x % kTx;
  // The loop bound is uniform across the block, so every lane reaches the shuffles.
  for (int64_t base = int64_t(blockIdx.x) * kTy; base < rows; base += int64_t(gridDim.x) * kTy) {
    const int64_t row = base + threadIdx.x / kTx;
    const bool valid = row < rows;
    float sum = 0.0f;
    if (valid) {
      const T* o = static_cast<const T*>(a.o) + row * hdv;
      const T* g = static_cast<const T*>(a.dout) + row * hdv;
      for (int64_t c = tx; c < hdv; c += kTx) sum += to_f32(o[c]) * to_f32(g[c]);
      if (!a.deterministic) {
        float* acc = a.dq_accum + row * hd;
        for (int64_t c = tx; c < hd; c += kTx) acc[c] = 0.0f;
      }
    }
    sum = ja_group_sum<kTx>(sum);
    if (valid && tx == 0) {
      const int64_t h = row % p.heads_q, bi = row / p.heads_q;  // bi = b * sq + i
      const int64_t b = bi / p.seq_q, i = bi % p.seq_q;
      a.delta[(b * p.heads_q + h) * p.seq_q + i] = sum;
    }
  }
}

// Loads lse (log2 domain), delta and the mask's lo, hi, diag of query rows [q0, q0 + rows) of head h into
// shared memory (rows past `rows` see nothing).
JA_DEVICE void load_row_info(const JaMhaBwdArgs& a, int64_t b, int64_t h, int64_t q0, int rows, int br, float* lse_s,
                             float* delta_s, int32_t* lo_s, int32_t* hi_s, int32_t* dg_s) {
  const JaMhaProblem& p = a.p;
  const float* lse = a.lse + (b * p.heads_q + h) * p.seq_q;
  const float* delta = a.delta + (b * p.heads_q + h) * p.seq_q;
  for (int i = threadIdx.x; i < br; i += kThreads) {
    const bool ok = i < rows;
    const MhaRow r = ok ? mha_row(p, b, q0 + i) : MhaRow{0, 0, 0};
    lse_s[i] = ok ? lse[q0 + i] * ja_log2e : INFINITY;
    delta_s[i] = ok ? delta[q0 + i] : 0.0f;
    lo_s[i] = int32_t(r.lo), hi_s[i] = int32_t(r.hi), dg_s[i] = int32_t(r.diag);
  }
}

// The gradient of one visible score: from the score's q.k (acc) and dO . v (dpv) of row i, key j, and
// dropout's factor f of the pair (1 without dropout), returns dX (the gradient of q.k / scale's argument: dS
// times softcap's derivative) and sets *p_drop to the dropped P (the dV product's factor) and *ds to dS (dbias).
JA_DEVICE float score_grad(const ScoreTerms& terms, float f, float acc, float dpv, float lse2, float delta, int64_t i,
                           int64_t diag, int64_t j, float* p_drop, float* ds) {
  float t;
  const float x = terms(acc, i, diag, j, &t);
  const float pr = ja_exp2(x * ja_log2e - lse2);  // lse = +inf (no visible key) gives 0
  *p_drop = pr * f;
  *ds = pr * (dpv * f - delta);
  return terms.softcap > 0.0f ? *ds * (1.0f - t * t) : *ds;
}

template <typename T, int D, int BC, int BR>
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
  float* pt_s = reinterpret_cast<float*>(do_s + BR * LD);  // (P * drop)^T (4-byte aligned: LD * sizeof(T) is)
  float* dst_s = pt_s + BC * LDT;                          // dX^T
  float* lse_s = dst_s + BC * LDT;                         // lse * log2(e)
  float* delta_s = lse_s + BR;
  int32_t* lo_s = reinterpret_cast<int32_t*>(delta_s + BR);
  int32_t* hi_s = lo_s + BR;
  int32_t* dg_s = hi_s + BR;
  constexpr int W = (BC + 31) / 32;
  uint32_t* drop_s = reinterpret_cast<uint32_t*>(dg_s + BR);  // [BR][W]: dropout's keep bits of the tile

  const JaMhaProblem& p = a.p;
  const int tx = threadIdx.x % kTx, ty = threadIdx.x / kTx;
  const int64_t kv0 = int64_t(blockIdx.x) * BC, hk = blockIdx.y, b = blockIdx.z;
  const int64_t sq = p.seq_q, sk = p.seq_k, hq = p.heads_q, hkv = p.heads_kv;
  const int64_t group = hq / hkv;
  const int nk = int(sk - kv0 < BC ? sk - kv0 : BC);
  const int hd = int(p.head_dim), hdv = int(p.head_dim_v);
  const int64_t q_stride = hq * hd, o_stride = hq * hdv, k_stride = hkv * hd, v_stride = hkv * hdv;
  const bool vec = vec_dims<T>(p), det = a.deterministic != 0, softcapped = p.softcap > 0.0f;
  const Dropout drop = dropout_of(p);

  load_tile<T, BC, D>(v_s, static_cast<const T*>(a.v) + ((b * sk + kv0) * hkv + hk) * hdv, v_stride, nk, hdv, vec);
  const bool kbad = load_tile<T, BC, D, true>(k_s, static_cast<const T*>(a.k) + ((b * sk + kv0) * hkv + hk) * hd,
                                              k_stride, nk, hd, vec);
  const bool guard = __syncthreads_or(kbad);  // a NaN/inf in K: the dQ product skips dX's zeros

  float dk[RJ][DN], dv[RJ][DN];
#pragma unroll
  for (int j = 0; j < RJ; ++j)
#pragma unroll
    for (int d = 0; d < DN; ++d) dk[j][d] = dv[j][d] = 0.0f;

  // The query rows that see the block's keys: [q_lo of its first key, q_hi of its last key).
  const int64_t q_begin = mha_col(p, a.cols, a.cols_batch_stride, b, kv0).q_lo;
  const int64_t q_end = mha_col(p, a.cols, a.cols_batch_stride, b, kv0 + nk - 1).q_hi;
  for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
    const ScoreTerms terms = score_terms(p, b, h);
    float* dbias = a.dbias ? a.dbias + (b * hq + h) * sq * sk : nullptr;
    for (int64_t q0 = q_begin; q0 < q_end; q0 += BR) {
      const int rows = int(q_end - q0 < BR ? q_end - q0 : BR);
      __syncthreads();  // the previous tile's readers of q_s, do_s, pt_s, dst_s, drop_s are done
      if (drop.on) drop.tile_bits<BR, W>(b, h, q0, rows, kv0, nk, drop_s);
      const bool qbad = load_tile<T, BR, D, true>(q_s, static_cast<const T*>(a.q) + ((b * sq + q0) * hq + h) * hd,
                                                  q_stride, rows, hd, vec);
      const bool gbad = load_tile<T, BR, D, true>(do_s, static_cast<const T*>(a.dout) + ((b * sq + q0) * hq + h) * hdv,
                                                  o_stride, rows, hdv, vec);
      load_row_info(a, b, h, q0, rows, BR, lse_s, delta_s, lo_s, hi_s, dg_s);
      // a NaN/inf in Q or dO: the dK and dV products skip P's and dX's zeros (a hidden row's Q and dO)
      const bool qguard = __syncthreads_or(qbad || gbad);

      // S^T = K Q^T and dP^T = V dO^T for this thread's (key, query) block.
      float st[RJ][CI], dpt[RJ][CI];
#pragma unroll
      for (int j = 0; j < RJ; ++j)
#pragma unroll
        for (int i = 0; i < CI; ++i) st[j][i] = dpt[j][i] = 0.0f;
      for (int c = 0; c < hd; ++c) {
        float kv[RJ], qv[CI];
#pragma unroll
        for (int j = 0; j < RJ; ++j) kv[j] = to_f32(k_s[(ty + j * kTy) * LD + c]);
#pragma unroll
        for (int i = 0; i < CI; ++i) qv[i] = to_f32(q_s[(tx + i * kTx) * LD + c]);
#pragma unroll
        for (int j = 0; j < RJ; ++j)
#pragma unroll
          for (int i = 0; i < CI; ++i) st[j][i] += kv[j] * qv[i];
      }
      for (int c = 0; c < hdv; ++c) {
        float vv[RJ], gv[CI];
#pragma unroll
        for (int j = 0; j < RJ; ++j) vv[j] = to_f32(v_s[(ty + j * kTy) * LD + c]);
#pragma unroll
        for (int i = 0; i < CI; ++i) gv[i] = to_f32(do_s[(tx + i * kTx) * LD + c]);
#pragma unroll
        for (int j = 0; j < RJ; ++j)
#pragma unroll
          for (int i = 0; i < CI; ++i) dpt[j][i] += vv[j] * gv[i];
      }
#pragma unroll
      for (int j = 0; j < RJ; ++j) {
        const int kr = ty + j * kTy;
        const int64_t key = kv0 + kr;
#pragma unroll
        for (int i = 0; i < CI; ++i) {
          const int qr = tx + i * kTx;
          float pd = 0.0f, dx = 0.0f, ds = 0.0f;  // a pair the mask hides: 0 whatever K and V hold
          if (kr < nk && lo_s[qr] <= key && key < hi_s[qr])
            dx = score_grad(terms, drop.on ? drop.factor(drop_s, W, qr, kr) : 1.0f, st[j][i], dpt[j][i], lse_s[qr],
                            delta_s[qr], q0 + qr, dg_s[qr], key, &pd, &ds);
          pt_s[kr * LDT + qr] = pd;
          dst_s[kr * LDT + qr] = dx;
          // dbias = dS; with softcap dX differs from dS, so it is written from here (query rows 16 lanes
          // apart: strided); without, from dst_s below, key-contiguous.
          if (dbias && softcapped && kr < nk && qr < rows) dbias[(q0 + qr) * sk + key] = ds;
        }
      }
      __syncthreads();
      if (dbias && !softcapped)
        for (int idx = threadIdx.x; idx < rows * nk; idx += kThreads) {
          const int qr = idx / nk, kr = idx % nk;
          dbias[(q0 + qr) * sk + kv0 + kr] = dst_s[kr * LDT + qr];
        }

      // dV += (P * drop)^T dO and dK += dX^T Q (this thread's key rows).
      for (int i = 0; i < rows; ++i) {
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
        if (qguard) {
#pragma unroll
          for (int j = 0; j < RJ; ++j)
#pragma unroll
            for (int d = 0; d < DN; ++d) {
              if (pv[j] != 0.0f) dv[j][d] += pv[j] * gv[d];
              if (sv[j] != 0.0f) dk[j][d] += sv[j] * qv[d];
            }
        } else {
#pragma unroll
          for (int j = 0; j < RJ; ++j)
#pragma unroll
            for (int d = 0; d < DN; ++d) {
              dv[j][d] += pv[j] * gv[d];
              dk[j][d] += sv[j] * qv[d];
            }
        }
      }

      // dQ += dX K * scale, one query row at a time to bound registers (deterministic: mha_bwd_dq does it).
      if (!det) {
#pragma unroll
        for (int i = 0; i < RI; ++i) {
          const int qr = ty + i * kTy;
          float acc[DN];
#pragma unroll
          for (int d = 0; d < DN; ++d) acc[d] = 0.0f;
          for (int j = 0; j < nk; ++j) {
            const float sv = dst_s[j * LDT + qr];
            if (guard && sv == 0.0f) continue;  // uniform in the 16-lane group: no product of a hidden key's K
#pragma unroll
            for (int d = 0; d < DN; ++d) acc[d] += sv * to_f32(k_s[j * LD + tx + d * kTx]);
          }
          if (qr < rows) {
            float* dq = a.dq_accum + ((b * sq + q0 + qr) * hq + h) * hd;
#pragma unroll
            for (int d = 0; d < DN; ++d)
              if (tx + d * kTx < hd) ja_atomic_add(dq + tx + d * kTx, acc[d] * p.scale);
          }
        }
      }
    }
  }

  T* dk_out = static_cast<T*>(a.dk) + ((b * sk + kv0) * hkv + hk) * hd;
  T* dv_out = static_cast<T*>(a.dv) + ((b * sk + kv0) * hkv + hk) * hdv;
#pragma unroll
  for (int j = 0; j < RJ; ++j) {
    const int kr = ty + j * kTy;
    if (kr >= nk) continue;
#pragma unroll
    for (int d = 0; d < DN; ++d) {
      const int col = tx + d * kTx;
      if (col < hd) dk_out[kr * k_stride + col] = from_f32<T>(dk[j][d] * p.scale);
      if (col < hdv) dv_out[kr * v_stride + col] = from_f32<T>(dv[j][d]);
    }
  }
}

// Deterministic dQ: one block per (tile of BR query rows, query head, batch); dQ = sum over the key tiles its
// rows see, in order, of dX K * scale; written once, rounded to T.
template <typename T, int D, int BR, int BC>
JA_GLOBAL void __launch_bounds__(kThreads) mha_bwd_dq(JaMhaBwdArgs a) {
  constexpr int LD = tile_ld<T, D>();
  constexpr int LDP = BC + 1;
  constexpr int RM = BR / kTy;  // rows per thread
  constexpr int CN = BC / kTx;  // score columns per thread
  constexpr int DN = D / kTx;   // dQ columns per thread
  extern __shared__ __align__(16) unsigned char smem_raw[];  // dq_smem_bytes(BR, BC)
  T* q_s = reinterpret_cast<T*>(smem_raw);
  T* do_s = q_s + BR * LD;
  T* k_s = do_s + BR * LD;
  T* v_s = k_s + BC * LD;
  float* ds_s = reinterpret_cast<float*>(v_s + BC * LD);
  float* lse_s = ds_s + BR * LDP;
  float* delta_s = lse_s + BR;
  int32_t* lo_s = reinterpret_cast<int32_t*>(delta_s + BR);
  int32_t* hi_s = lo_s + BR;
  int32_t* dg_s = hi_s + BR;
  constexpr int W = (BC + 31) / 32;
  uint32_t* drop_s = reinterpret_cast<uint32_t*>(dg_s + BR);  // [BR][W]: dropout's keep bits of the tile

  const JaMhaProblem& p = a.p;
  const int tx = threadIdx.x % kTx, ty = threadIdx.x / kTx;
  const int64_t q0 = int64_t(blockIdx.x) * BR, h = blockIdx.y, b = blockIdx.z;
  const int64_t sq = p.seq_q, sk = p.seq_k, hq = p.heads_q, hkv = p.heads_kv, hk = h / (hq / hkv);
  const int rows = int(sq - q0 < BR ? sq - q0 : BR);
  const int hd = int(p.head_dim), hdv = int(p.head_dim_v);
  const int64_t q_stride = hq * hd, o_stride = hq * hdv, k_stride = hkv * hd, v_stride = hkv * hdv;
  const bool vec = vec_dims<T>(p);
  const T* k = static_cast<const T*>(a.k) + (b * sk * hkv + hk) * hd;
  const T* v = static_cast<const T*>(a.v) + (b * sk * hkv + hk) * hdv;
  const ScoreTerms terms = score_terms(p, b, h);
  const Dropout drop = dropout_of(p);

  load_tile<T, BR, D>(q_s, static_cast<const T*>(a.q) + ((b * sq + q0) * hq + h) * hd, q_stride, rows, hd, vec);
  load_tile<T, BR, D>(do_s, static_cast<const T*>(a.dout) + ((b * sq + q0) * hq + h) * hdv, o_stride, rows, hdv, vec);
  load_row_info(a, b, h, q0, rows, BR, lse_s, delta_s, lo_s, hi_s, dg_s);
  __syncthreads();

  float dq[RM][DN];
#pragma unroll
  for (int i = 0; i < RM; ++i)
#pragma unroll
    for (int d = 0; d < DN; ++d) dq[i][d] = 0.0f;

  const int64_t kv_begin = lo_s[0], kv_end = hi_s[rows - 1];
  for (int64_t kv0 = kv_begin; kv0 < kv_end; kv0 += BC) {
    const int nk = int(kv_end - kv0 < BC ? kv_end - kv0 : BC);
    __syncthreads();  // the previous tile's readers of k_s, v_s, ds_s, drop_s are done
    if (drop.on) drop.tile_bits<BR, W>(b, h, q0, rows, kv0, nk, drop_s);
    const bool kbad = load_tile<T, BC, D, true>(k_s, k + kv0 * k_stride, k_stride, nk, hd, vec);
    load_tile<T, BC, D>(v_s, v + kv0 * v_stride, v_stride, nk, hdv, vec);
    const bool guard = __syncthreads_or(kbad);

    float s[RM][CN], dp[RM][CN];
#pragma unroll
    for (int i = 0; i < RM; ++i)
#pragma unroll
      for (int j = 0; j < CN; ++j) s[i][j] = dp[i][j] = 0.0f;
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
    for (int c = 0; c < hdv; ++c) {
      float gv[RM], vv[CN];
#pragma unroll
      for (int i = 0; i < RM; ++i) gv[i] = to_f32(do_s[(ty + i * kTy) * LD + c]);
#pragma unroll
      for (int j = 0; j < CN; ++j) vv[j] = to_f32(v_s[(tx + j * kTx) * LD + c]);
#pragma unroll
      for (int i = 0; i < RM; ++i)
#pragma unroll
        for (int j = 0; j < CN; ++j) dp[i][j] += gv[i] * vv[j];
    }
#pragma unroll
    for (int i = 0; i < RM; ++i) {
      const int r = ty + i * kTy;
#pragma unroll
      for (int j = 0; j < CN; ++j) {
        const int col = tx + j * kTx;
        const int64_t key = kv0 + col;
        float dx = 0.0f, pd, ds;  // a pair the mask hides: 0 whatever K and V hold
        if (col < nk && lo_s[r] <= key && key < hi_s[r])
          dx = score_grad(terms, drop.on ? drop.factor(drop_s, W, r, col) : 1.0f, s[i][j], dp[i][j], lse_s[r],
                          delta_s[r], q0 + r, dg_s[r], key, &pd, &ds);
        ds_s[r * LDP + col] = dx;
      }
    }
    __syncthreads();

    for (int j = 0; j < nk; ++j) {
      float sv[RM], kv[DN];
#pragma unroll
      for (int i = 0; i < RM; ++i) sv[i] = ds_s[(ty + i * kTy) * LDP + j];
#pragma unroll
      for (int d = 0; d < DN; ++d) kv[d] = to_f32(k_s[j * LD + tx + d * kTx]);
#pragma unroll
      for (int i = 0; i < RM; ++i)
#pragma unroll
        for (int d = 0; d < DN; ++d) dq[i][d] += guard && sv[i] == 0.0f ? 0.0f : sv[i] * kv[d];
    }
  }

  T* out = static_cast<T*>(a.dq) + ((b * sq + q0) * hq + h) * hd;
#pragma unroll
  for (int i = 0; i < RM; ++i) {
    const int r = ty + i * kTy;
    if (r >= rows) continue;
#pragma unroll
    for (int d = 0; d < DN; ++d) {
      const int col = tx + d * kTx;
      if (col < hd) out[r * q_stride + col] = from_f32<T>(dq[i][d] * p.scale);
    }
  }
}

template <typename T>
JA_GLOBAL void __launch_bounds__(kThreads) mha_bwd_convert_dq(const float* acc, T* dq, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads)
    dq[i] = from_f32<T>(acc[i]);
}

constexpr int64_t kMaxBlocks = int64_t(1) << 20;  // grid-stride loops cover the rest

// The SIMT dK/dV (and, unless deterministic, dQ) kernel, then the deterministic dQ kernel.
template <typename T, int D>
const char* mha_bwd_simt_launch(const JaMhaBwdArgs& a, ja_stream_t s) {
  using Tiles = BwdTiles<T, D>;
  using Dq = DqTiles<T, D>;
  if (const char* e = refuse_unhandled("mha_bwd", "SIMT", a, kBwdSimtFeatures)) return e;
  if constexpr (!Tiles::kFits || !Dq::kFits) {
    return ja_error(
        "mha_bwd: %s with head_dim %d needs %d bytes of shared memory per block, more than "
        "this GPU has (%d); use bfloat16 or float16",
        dtype_name(dtype_of<T>::value), D, Tiles::kSmemBytes > Dq::kSmemBytes ? Tiles::kSmemBytes : Dq::kSmemBytes,
        kSmemMax);
  } else {
    const JaMhaProblem& p = a.p;
    const int64_t kv_tiles = (p.seq_k + Tiles::BC - 1) / Tiles::BC;
    if (const char* e = check_grid("mha_bwd", kv_tiles, p.heads_kv, p.batch)) return e;
    if (kv_tiles > 0) {
      const dim3 grid(unsigned(kv_tiles), unsigned(p.heads_kv), unsigned(p.batch));
      if (const char* e = launch_with_smem(mha_bwd_dkdv<T, D, Tiles::BC, Tiles::BR>, grid, kThreads, Tiles::kSmemBytes,
                                           s, a, "mha_bwd (dK/dV/dQ)"))
        return e;
    }
    if (a.deterministic) {
      const int64_t q_tiles = (p.seq_q + Dq::BR - 1) / Dq::BR;
      if (const char* e = check_grid("mha_bwd", q_tiles, p.heads_q, p.batch)) return e;
      const dim3 grid(unsigned(q_tiles), unsigned(p.heads_q), unsigned(p.batch));
      return launch_with_smem(mha_bwd_dq<T, D, Dq::BR, Dq::BC>, grid, kThreads, Dq::kSmemBytes, s, a,
                              "mha_bwd (deterministic dQ)");
    }
    return nullptr;
  }
}

}  // namespace mha_gpu
}  // namespace ja
