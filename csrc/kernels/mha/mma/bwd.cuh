// Flash-attention backward on the matrix units (FlashAttention-2 structure):
// the middle kernel of simt/bwd.cuh (dK, dV and the dQ accumulation) for
// 16-bit inputs; the preprocess (delta, zeroed dq_accum) and convert-dQ
// kernels are the SIMT ones.
//
// One block of kWarps warps per (tile of BC = 16 * kWarps keys, kv head,
// batch); warp w owns key rows [16w, 16w + 16) of the tile and keeps their dK
// and dV (16 x D each, float32) in accumulator fragments for the whole block.
// The K and V tiles are copied once (cp.async); the block then walks every
// query head of its GQA group and every query tile of BR rows that can see
// its keys, with the Q, dO, lse and delta of the next tile copied (cp.async,
// double-buffered) while the current one is computed. Per query tile and warp
// (16 keys x BR queries, everything transposed so keys are the M dimension):
//   S^T  = K Q^T                               A = K (smem),  B = Q  (ldmatrix)
//   dP^T = V dO^T                              A = V (smem),  B = dO (ldmatrix)
//   P^T  = exp2(S^T * scale * log2 e - lse * log2 e), masked to 0
//   dS^T = P^T * (dP^T - delta)
//   dV  += P^T dO                              A = P^T  (C fragments), B = dO (ldmatrix .trans)
//   dK  += dS^T Q                              A = dS^T (C fragments), B = Q  (ldmatrix .trans)
// dS^T goes to shared memory, and after a barrier the warps split the BR x D
// tile of dQ += dS K * scale (A = dS via ldmatrix .trans of dS^T, B = K via
// ldmatrix .trans), added to the float32 dq_accum with atomics.
// P and dS are rounded to the input dtype before their products, as
// FlashAttention does; every sum accumulates in float32.
//
// Conventions are the SIMT kernel's: the mask as per-row key ranges (the query
// tiles walked are [q_lo of the block's first key, q_hi of its last) from the
// mask's cols), softcap (dS times 1 - tanh^2) and ALiBi in the score (an instance
// with them and one without), head dims below D zero-padded, rows with no
// visible key (lse = +inf) contribute 0. A hidden (key, query) pair gets P = dX
// = 0 by a select, whatever K and V hold; in a tile some pairs of which are
// hidden, where the block's K holds a NaN or an infinity (checked once per
// block), the dQ product runs on the SIMT units skipping dX's zeros.
//
// Deterministic (JaMhaBwdArgs::deterministic): this kernel leaves dQ out, and
// mha_bwd_dq_mma_kernel (below) computes it per query tile in a fixed order
// with no atomics: S and dP are computed twice (once per kernel), so it costs
// two more products per (query tile, key tile) than the atomics, which it
// replaces. Bias and dropout take the SIMT kernels.
#pragma once
#include "ja/mma.h"
#include "mha/common/mma_tiles.cuh"  // cp_async_tile
#include "mha/common/gpu.cuh"

#if JA_HAS_WARP_MMA
#include "mha/common/exact.cuh"  // 32-lane warps: the matrix-unit kernels' header, not HIP's
namespace ja {
namespace mha_gpu {

// Build-time tuning knobs (defaults in parentheses).
//   WARPS       warps per block (8); keys per block BC = 16 * WARPS
//   BR          query rows per tile (0 = by head_dim: 64 for D <= 64, 32 above,
//               which bounds the score fragments next to the 2 x 16 x D dK/dV
//               accumulators; 64 where 32 would not split dQ evenly, e.g. D = 96)
//   FAST_EXP2   1: P with ja_exp2_approx (ex2.approx.ftz, see ja/gpu.h) (1)
//   MIN_BLOCKS  minimum resident blocks per multiprocessor asked of the register allocator (1)
//   KD_UNROLL   unroll factor of the head-dim loop of S^T / dP^T (2); full unrolling
//               (8) lets the scheduler hoist more ldmatrix and sits closer to the
//               255-register limit (nvcc 13, sm_90: no spills either way, 240-251 registers)
// The defaults were chosen on an H200 (bf16, b4 h32 d128, seq 1024/4096/8192, causal or
// not, against cuDNN's backward in the same run): WARPS=8 (128 keys per block halve the dQ
// atomics and the Q/dO reads) beat WARPS=4 and KD_UNROLL=8; BR=64 at d128 spills. The
// figures live in the benchmark runs' artifacts, not here.
#ifndef JA_MHA_BWD_MMA_WARPS
#define JA_MHA_BWD_MMA_WARPS 8
#endif
#ifndef JA_MHA_BWD_MMA_BR
#define JA_MHA_BWD_MMA_BR 0
#endif
#ifndef JA_MHA_BWD_MMA_FAST_EXP2
#define JA_MHA_BWD_MMA_FAST_EXP2 1
#endif
#ifndef JA_MHA_BWD_MMA_MIN_BLOCKS
#define JA_MHA_BWD_MMA_MIN_BLOCKS 1
#endif
#ifndef JA_MHA_BWD_MMA_KD_UNROLL
#define JA_MHA_BWD_MMA_KD_UNROLL 2
#endif

template <typename T, int D>
struct BwdMmaTiles {
  static constexpr int kWarps = JA_MHA_BWD_MMA_WARPS;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int BC = 16 * kWarps;
  // (head_dim 96 takes 64: with 32, WN = 4 column blocks would not split its 6 k-steps of 16)
  static constexpr int BR = JA_MHA_BWD_MMA_BR > 0                     ? JA_MHA_BWD_MMA_BR
                            : D <= 64 || (D / 16) % (kWarps / 2) != 0 ? 64
                                                                      : 32;
  static constexpr int LD = D + 8;    // 16-byte pad: ldmatrix rows of 8 consecutive tile rows hit distinct banks
  static constexpr int LDS = BR + 8;  // row stride of the dS^T tile [BC][BR], same reason
  // dQ: the BR x D tile is split into WM (16-row m-tiles) x WN (column blocks of DQN) warps.
  static constexpr int WM = BR / 16;
  static constexpr int WN = kWarps / WM;
  static constexpr int DQN = D / WN;
  // Shared memory: k_s, v_s [BC][LD]; q_s, do_s [2][BR][LD]; ds_s [BC][LDS] (T);
  // lse_s, delta_s [2][BR] (float); the rows' lo, hi, diag [2][BR] (int32).
  static constexpr int kTileElems = (2 * BC + 4 * BR) * LD + BC * LDS;
  static constexpr int kSmemBytes =
      kTileElems * int(sizeof(T)) + 4 * BR * int(sizeof(float)) + 6 * BR * int(sizeof(int32_t));
  static_assert(kSmemBytes <= 227 * 1024, "MHA backward (MMA) tiles exceed shared memory");
  static_assert(D % 16 == 0 && BR % 16 == 0, "tiles must be multiples of the 16x16 MMA shape");
  static_assert(kWarps % WM == 0 && WN >= 1 && D % WN == 0 && DQN % 16 == 0,
                "the dQ tile must split evenly over the warps");
  static_assert((kTileElems * int(sizeof(T))) % 16 == 0, "float region must stay aligned");
};

// The mask of query rows [q0, q0 + rows) into lo, hi, diag (int32, rows past `rows` see nothing): from the
// ROWS array by 4-byte cp.async (completing with the caller's cp.async group), else computed.
template <int NTHREADS>
JA_DEVICE void load_mask_rows(const JaMhaProblem& p, int64_t b, int64_t q0, int rows, int br, int32_t* lo, int32_t* hi,
                              int32_t* dg) {
  if (p.mask == kMaskRows) {
    const int32_t* r = p.rows + b * p.rows_batch_stride + q0;  // row q0 exists: a mapped address
    for (int i = int(threadIdx.x); i < 3 * br; i += NTHREADS) {
      const int k = i / br, j = i % br;
      int32_t* dst = (k == 0 ? lo : k == 1 ? hi : dg) + j;
      const bool ok = j < rows;
      mma::cp_async_4(dst, ok ? r + k * p.seq_q + j : r, ok);
    }
  } else {
    for (int j = int(threadIdx.x); j < br; j += NTHREADS) {
      const MhaRow r = j < rows ? mha_row(p, b, q0 + j) : MhaRow{0, 0, 0};
      lo[j] = int32_t(r.lo), hi[j] = int32_t(r.hi), dg[j] = int32_t(r.diag);
    }
  }
}

// Whether a [BC][LD] tile in shared memory holds a NaN or an infinity in columns [0, cols) (block-wide: a
// barrier).
template <typename T, int BC, int D, int LD, int NTHREADS>
JA_DEVICE bool tile_nonfinite(const T* tile, int cols) {
  constexpr int kVec = 16 / int(sizeof(T));
  bool found = false;
  for (int idx = int(threadIdx.x); idx < BC * (D / kVec); idx += NTHREADS) {
    const int r = idx / (D / kVec), c = (idx % (D / kVec)) * kVec;
    if (c >= cols) continue;
    const Pack<T, kVec> pk = *reinterpret_cast<const Pack<T, kVec>*>(tile + r * LD + c);
#pragma unroll
    for (int e = 0; e < kVec; ++e) found |= nonfinite(pk.v[e]);
  }
  return __syncthreads_or(found);
}

// TERMS: the score has softcap or ALiBi terms (ScoreTerms); DET: deterministic (this kernel leaves dQ to
// mha_bwd_dq_mma_kernel).
template <typename T, int D, bool CAUSAL, bool TERMS, bool DET>
JA_GLOBAL void __launch_bounds__(BwdMmaTiles<T, D>::kThreads, JA_MHA_BWD_MMA_MIN_BLOCKS)
    mha_bwd_mma_kernel(__grid_constant__ const JaMhaBwdArgs a) {
  using Tl = BwdMmaTiles<T, D>;
  constexpr int BR = Tl::BR, BC = Tl::BC, LD = Tl::LD, LDS = Tl::LDS, NT = Tl::kThreads;
  constexpr int WM = Tl::WM, DQN = Tl::DQN;
  constexpr int KD = D / 16;   // k-steps over head_dim (S^T, dP^T)
  constexpr int NS = BR / 8;   // 16x8 fragments of S^T / dP^T per warp (query columns)
  constexpr int KR = BR / 16;  // k-steps over queries (dV, dK)
  constexpr int NO = D / 8;    // 16x8 fragments of dK / dV per warp (head-dim columns)
  constexpr int KC = BC / 16;  // k-steps over keys (dQ)
  constexpr int kKdUnroll = JA_MHA_BWD_MMA_KD_UNROLL;  // #pragma unroll takes a constant, not a macro
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* k_s = reinterpret_cast<T*>(smem_raw);
  T* v_s = k_s + BC * LD;
  T* q_s = v_s + BC * LD;       // [2][BR][LD]
  T* do_s = q_s + 2 * BR * LD;  // [2][BR][LD]
  T* ds_s = do_s + 2 * BR * LD;  // [BC][LDS]: dX^T (keys x queries)
  float* lse_s = reinterpret_cast<float*>(ds_s + BC * LDS);  // [2][BR]
  float* delta_s = lse_s + 2 * BR;                            // [2][BR]
  int32_t* lo_s = reinterpret_cast<int32_t*>(delta_s + 2 * BR);  // [2][BR]: the query rows' mask
  int32_t* hi_s = lo_s + 2 * BR;
  int32_t* dg_s = hi_s + 2 * BR;

  const JaMhaProblem& p = a.p;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;
  const GridPlace at = grid_place(CAUSAL, false);  // causal: each kv head's first key blocks start first
  const int64_t b = at.batch, hk = at.head;
  const int kv0 = int(at.tile) * BC;  // (positions fit int32: check_problem keeps the sequences below 2^30)
  const int64_t sq = p.seq_q, sk = p.seq_k, hq = p.heads_q, hkv = p.heads_kv;
  const int64_t group = hq / hkv;
  const int nk = int(sk - kv0 < BC ? sk - kv0 : BC);
  const int hd = int(p.head_dim), hdv = int(p.head_dim_v);
  const int64_t q_stride = hq * hd, o_stride = hq * hdv, k_stride = hkv * hd, v_stride = hkv * hdv;
  const bool vec = vec_dims<T>(p);
  const float s2 = p.scale * ja_log2e;
  const int wrow = warp * 16;  // this warp's first key row in the tile

  // The query rows that see the block's keys, [q_lo of its first key, q_hi of its last key) (cols); the
  // loop runs over (head, tile) pairs of BR rows from q_begin.
  const int q_begin = int(mha_col(p, a.cols, a.cols_batch_stride, b, kv0).q_lo);
  const int q_end = int(mha_col(p, a.cols, a.cols_batch_stride, b, kv0 + nk - 1).q_hi);
  const int q_tiles = q_end > q_begin ? (q_end - q_begin + BR - 1) / BR : 0;
  const int64_t n_iter = group * q_tiles;

  const T* q_g = static_cast<const T*>(a.q);
  const T* do_g = static_cast<const T*>(a.dout);
  // Copies Q, dO (rows past q_end zero-filled), lse, delta and the rows' mask of tile (h, q0) into buffer `buf`.
  auto load_q_tile = [&](int64_t h, int q0, int buf) {
    const int rows = q_end - q0 < BR ? q_end - q0 : BR;
    cp_async_tile<T, BR, D, LD, NT>(q_s + buf * BR * LD, q_g + ((b * sq + q0) * hq + h) * hd, q_stride, rows, hd, vec);
    cp_async_tile<T, BR, D, LD, NT>(do_s + buf * BR * LD, do_g + ((b * sq + q0) * hq + h) * hdv, o_stride, rows, hdv,
                                    vec);
    const int64_t roff = (b * hq + h) * sq + q0;  // row q0 exists, so roff is always a mapped address
    for (int i = int(threadIdx.x); i < 2 * BR; i += NT) {
      const int r = i % BR;
      const bool ok = r < rows;
      const float* src = (i < BR ? a.lse : static_cast<const float*>(a.delta)) + roff;
      float* dst = (i < BR ? lse_s : delta_s) + buf * BR + r;
      mma::cp_async_4(dst, ok ? src + r : src, ok);
    }
    load_mask_rows<NT>(p, b, q0, rows, BR, lo_s + buf * BR, hi_s + buf * BR, dg_s + buf * BR);
  };

  cp_async_tile<T, BC, D, LD, NT>(k_s, static_cast<const T*>(a.k) + ((b * sk + kv0) * hkv + hk) * hd, k_stride, nk, hd,
                                  vec);
  cp_async_tile<T, BC, D, LD, NT>(v_s, static_cast<const T*>(a.v) + ((b * sk + kv0) * hkv + hk) * hdv, v_stride, nk,
                                  hdv, vec);
  if (n_iter > 0) load_q_tile(hk * group, q_begin, 0);
  mma::cp_async_commit();
  // A NaN/inf in K: the dQ product of the tiles some rows see only in part takes the SIMT path below, which
  // skips dX's zeros (0 * inf would be NaN on the matrix units). Decided once: K stays for the whole block.
  bool kbad = false;
  if constexpr (!DET) {
    mma::cp_async_wait<0>();
    __syncthreads();
    kbad = tile_nonfinite<T, BC, D, LD, NT>(k_s, hd);
  }

  // dK, dV accumulators: C fragments, rows (keys) wrow + g + 8 (e >> 1), columns n * 8 + 2t + (e & 1).
  float dk[NO][4], dv[NO][4];
#pragma unroll
  for (int n = 0; n < NO; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[n][e] = dv[n][e] = 0.0f;

  int64_t h = hk * group;
  int q0 = q_begin;  // iteration `it` works on query head h, rows [q0, q0 + BR)
  for (int64_t it = 0; it < n_iter; ++it) {
    const int buf = int(it & 1);
    int64_t h_next = h;
    int q0_next = q0 + BR;  // the tile of iteration it + 1
    if (q0_next >= q_end) q0_next = q_begin, ++h_next;
    mma::cp_async_wait<0>();
    __syncthreads();  // tile `it` (and K, V) landed; every warp is done with iteration it - 1 (buf ^ 1, ds_s)
    if (it + 1 < n_iter) {
      load_q_tile(h_next, q0_next, buf ^ 1);
      mma::cp_async_commit();
    }
    const T* qt = q_s + buf * BR * LD;
    const T* dot = do_s + buf * BR * LD;
    const float* lse_t = lse_s + buf * BR;
    const float* delta_t = delta_s + buf * BR;
    const int32_t* lo_t = lo_s + buf * BR;
    const int32_t* hi_t = hi_s + buf * BR;
    const int rows = q_end - q0 < BR ? q_end - q0 : BR;

    // S^T = K Q^T and dP^T = V dO^T for this warp's 16 keys x BR queries.
    // A (16 keys x 16 head-dim, row-major [key][d] in smem): the forward's Q pattern.
    // B (k = head-dim, n = query; stored [query][d]): the forward's K pattern,
    // one ldmatrix_x4 = two B fragments (queries n2*16 + [0, 8) and [8, 16)).
    float st[NS][4], dpt[NS][4];
#pragma unroll
    for (int n = 0; n < NS; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) st[n][e] = dpt[n][e] = 0.0f;
#pragma unroll kKdUnroll
    for (int kd = 0; kd < KD; ++kd) {
      uint32_t ka[4], va[4];
      const int a_off = (wrow + (lane & 15)) * LD + kd * 16 + (lane >> 4) * 8;
      mma::ldmatrix_x4(ka, k_s + a_off);
      mma::ldmatrix_x4(va, v_s + a_off);
#pragma unroll
      for (int n2 = 0; n2 < NS / 2; ++n2) {
        const int b_off = (n2 * 16 + (lane & 7) + ((lane >> 4) << 3)) * LD + kd * 16 + ((lane >> 3) & 1) * 8;
        uint32_t qb[4], gb[4];
        mma::ldmatrix_x4(qb, qt + b_off);
        mma::ldmatrix_x4(gb, dot + b_off);
        mma::mma_16816<T>(st[2 * n2], ka, qb);
        mma::mma_16816<T>(st[2 * n2 + 1], ka, qb + 2);
        mma::mma_16816<T>(dpt[2 * n2], va, gb);
        mma::mma_16816<T>(dpt[2 * n2 + 1], va, gb + 2);
      }
    }

    // P^T and dX^T in place (st <- P^T, dpt <- dX^T). Fragment element e of fragment n: key kv0 + wrow + g +
    // 8 (e >> 1), query q0 + n * 8 + 2t + (e & 1). A (key, query) pair the query's mask hides gets P = dX = 0
    // by a select, whatever K and V hold. Every pair is visible where the tile's keys lie in
    // [lo of its last row, hi of its first row) (lo, hi non-decreasing) and the tile is whole.
    const bool need_mask = nk < BC || rows < BR || !(kv0 >= lo_t[rows - 1] && kv0 + BC <= hi_t[0]);
#pragma unroll
    for (int n = 0; n < NS; ++n) {
      const float2 l2 = *reinterpret_cast<const float2*>(lse_t + n * 8 + 2 * t);
      const float2 d2 = *reinterpret_cast<const float2*>(delta_t + n * 8 + 2 * t);
      const int2 lo2 = *reinterpret_cast<const int2*>(lo_t + n * 8 + 2 * t);
      const int2 hi2 = *reinterpret_cast<const int2*>(hi_t + n * 8 + 2 * t);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float lse2 = ((e & 1) ? l2.y : l2.x) * ja_log2e;  // +inf (no visible key) gives P = 0
        const float dlt = (e & 1) ? d2.y : d2.x;
        const int key = kv0 + wrow + g + (e >> 1) * 8;
        float x = st[n][e], tc = 0.0f;
        if constexpr (TERMS) {
          const int qr = n * 8 + 2 * t + (e & 1);
          x = score_terms(p, b, h)(x, q0 + qr, dg_s[buf * BR + qr], key, &tc) * ja_log2e;
        } else {
          x *= s2;
        }
#if JA_MHA_BWD_MMA_FAST_EXP2
        const float pr = ja_exp2_approx(x - lse2);
#else
        const float pr = ja_exp2(x - lse2);
#endif
        float dx = pr * (dpt[n][e] - dlt);
        if constexpr (TERMS) dx *= 1.0f - tc * tc;  // softcap's derivative (tc = 0 without softcap)
        const bool ok = !need_mask || (((e & 1) ? lo2.y : lo2.x) <= key && key < ((e & 1) ? hi2.y : hi2.x));
        st[n][e] = ok ? pr : 0.0f;
        dpt[n][e] = ok ? dx : 0.0f;
      }
    }

    // dV += P^T dO and dK += dX^T Q. A: 16 keys x 16 queries from the C fragments
    // of query columns kr*16 + [0, 8) and [8, 16), rounded to T (the forward's P).
    // B (k = query, n = head-dim; stored [query][d]): the forward's V pattern
    // (ldmatrix_x4_trans, two B fragments for head-dim n2*16 + [0, 8) and [8, 16)).
    // The rounded dX^T also goes to ds_s for the dQ product.
#pragma unroll
    for (int kr = 0; kr < KR; ++kr) {
      uint32_t pa[4], sa[4];
      pa[0] = mma::pack2<T>(st[2 * kr][0], st[2 * kr][1]);
      pa[1] = mma::pack2<T>(st[2 * kr][2], st[2 * kr][3]);
      pa[2] = mma::pack2<T>(st[2 * kr + 1][0], st[2 * kr + 1][1]);
      pa[3] = mma::pack2<T>(st[2 * kr + 1][2], st[2 * kr + 1][3]);
      sa[0] = mma::pack2<T>(dpt[2 * kr][0], dpt[2 * kr][1]);
      sa[1] = mma::pack2<T>(dpt[2 * kr][2], dpt[2 * kr][3]);
      sa[2] = mma::pack2<T>(dpt[2 * kr + 1][0], dpt[2 * kr + 1][1]);
      sa[3] = mma::pack2<T>(dpt[2 * kr + 1][2], dpt[2 * kr + 1][3]);
      if constexpr (!DET) {
        // a[0] = (key g, queries 2t..), a[1] = (g + 8, 2t..), a[2] = (g, 2t + 8..), a[3] = (g + 8, 2t + 8..)
        T* ds_row = ds_s + (wrow + g) * LDS + kr * 16 + 2 * t;
        *reinterpret_cast<uint32_t*>(ds_row) = sa[0];
        *reinterpret_cast<uint32_t*>(ds_row + 8 * LDS) = sa[1];
        *reinterpret_cast<uint32_t*>(ds_row + 8) = sa[2];
        *reinterpret_cast<uint32_t*>(ds_row + 8 * LDS + 8) = sa[3];
      }
#pragma unroll
      for (int n2 = 0; n2 < NO / 2; ++n2) {
        const int b_off = (kr * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + n2 * 16 + (lane >> 4) * 8;
        uint32_t gb[4], qb[4];
        mma::ldmatrix_x4_trans(gb, dot + b_off);
        mma::ldmatrix_x4_trans(qb, qt + b_off);
        mma::mma_16816<T>(dv[2 * n2], pa, gb);
        mma::mma_16816<T>(dv[2 * n2 + 1], pa, gb + 2);
        mma::mma_16816<T>(dk[2 * n2], sa, qb);
        mma::mma_16816<T>(dk[2 * n2 + 1], sa, qb + 2);
      }
    }

    if constexpr (!DET) {
      __syncthreads();  // ds_s holds the whole BC x BR dX^T

      // dQ += dX K * scale: warp (mt, nb) takes query rows mt*16 + [0, 16) and
      // head-dim columns nb*DQN + [0, DQN).
      const int mt = warp % WM, n0 = (warp / WM) * DQN;
      const int64_t qrow = q0 + mt * 16 + g;  // this lane's rows: qrow, qrow + 8
      float* dq = a.dq_accum + ((b * sq + qrow) * hq + h) * hd + n0 + 2 * t;
      if (!(kbad && need_mask)) {
        // A (16 queries x 16 keys) from dX^T stored [key][query]: ldmatrix_x4_trans,
        //   matrices (keys 0-7, queries 0-7), (keys 0-7, queries 8-15), (keys 8-15, q 0-7), (keys 8-15, q 8-15)
        //   = a[0..3]; lane l addresses key row kc*16 + (l & 7) + (l >> 4) * 8, query column ((l >> 3) & 1) * 8.
        // B (k = key, n = head-dim; stored [key][d]): the forward's V pattern.
        uint32_t dsa[KC][4];
#pragma unroll
        for (int kc = 0; kc < KC; ++kc)
          mma::ldmatrix_x4_trans(
              dsa[kc], ds_s + (kc * 16 + (lane & 7) + (lane >> 4) * 8) * LDS + mt * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
        for (int n2 = 0; n2 < DQN / 16; ++n2) {
          float acc[2][4];
#pragma unroll
          for (int j = 0; j < 2; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
#pragma unroll
          for (int kc = 0; kc < KC; ++kc) {
            uint32_t kb[4];
            mma::ldmatrix_x4_trans(
                kb, k_s + (kc * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + n0 + n2 * 16 + (lane >> 4) * 8);
            mma::mma_16816<T>(acc[0], dsa[kc], kb);
            mma::mma_16816<T>(acc[1], dsa[kc], kb + 2);
          }
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            if (qrow + 8 * i >= q_end) continue;
#pragma unroll
            for (int j = 0; j < 2; ++j) {
              const int col = n0 + n2 * 16 + j * 8 + 2 * t;
              float* dst = dq + i * 8 * q_stride + n2 * 16 + j * 8;
              if (hd % 2 == 0) {
                if (col < hd) ja_atomic_add2(dst, acc[j][2 * i] * p.scale, acc[j][2 * i + 1] * p.scale);
              } else {
                if (col < hd) ja_atomic_add(dst, acc[j][2 * i] * p.scale);
                if (col + 1 < hd) ja_atomic_add(dst + 1, acc[j][2 * i + 1] * p.scale);
              }
            }
          }
        }
      } else {
        // K holds a NaN/inf and some pairs of this tile are hidden: the same sums on the SIMT units, without
        // the products of dX's zeros (a hidden key's K never reaches the row).
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int qr = mt * 16 + g + 8 * i;
          if (qrow + 8 * i >= q_end) continue;
          for (int col = n0 + 2 * t; col < n0 + DQN && col < hd; col += 8) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              if (col + e >= hd) continue;
              float acc = 0.0f;
              for (int j = 0; j < nk; ++j) {
                const float x = to_f32(ds_s[j * LDS + qr]);
                if (x != 0.0f) acc += x * to_f32(k_s[j * LD + col + e]);
              }
              ja_atomic_add(dq + i * 8 * q_stride + (col - n0 - 2 * t) + e, acc * p.scale);
            }
          }
        }
      }
    }
    h = h_next, q0 = q0_next;
  }
  mma::cp_async_wait<0>();  // no query tile (n_iter == 0): the K/V copies must land before the block exits

  // Epilogue: dK * scale and dV rounded to T, rows < seq_k, columns < head_dim / head_dim_v.
  T* dk_out = static_cast<T*>(a.dk) + ((b * sk + kv0) * hkv + hk) * hd;
  T* dv_out = static_cast<T*>(a.dv) + ((b * sk + kv0) * hkv + hk) * hdv;
  uint32_t bad = 0;  // this warp's keys whose dK or dV came out NaN or infinite (bit r - wrow)
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = wrow + g + 8 * i;
    if (r >= nk) continue;
#pragma unroll
    for (int n = 0; n < NO; ++n) {
      const int col = n * 8 + 2 * t;
      store_pair<T>(dk_out + r * k_stride, col, hd, dk[n][2 * i] * p.scale, dk[n][2 * i + 1] * p.scale);
      store_pair<T>(dv_out + r * v_stride, col, hdv, dv[n][2 * i], dv[n][2 * i + 1]);
      if (!isfinite(dk[n][2 * i]) || !isfinite(dk[n][2 * i + 1]) || !isfinite(dv[n][2 * i]) ||
          !isfinite(dv[n][2 * i + 1]))
        bad |= 1u << (g + 8 * i);
    }
  }
  // A key with a non-finite dK or dV (a hidden row's NaN/Inf in Q or dO meets P = 0 or dX = 0 on the matrix
  // units, or a row that sees the key holds it) is computed again, exactly, by this warp, which holds its whole
  // row (common/exact.cuh): a hidden row's value never reaches it. Finite results pass this check only.
  bad = __reduce_or_sync(0xffffffffu, bad);
  if (bad) {
    __syncwarp();  // this warp's stores above come first
    const mha_gpu::ExactBwd<T> in = mha_gpu::exact_bwd<T>(a);
    for (; bad; bad &= bad - 1) {
      const int r = wrow + __ffs(int(bad)) - 1;
      const int64_t j = kv0 + r;
      float kx[mha_gpu::kExactCols], vx[mha_gpu::kExactCols];
      mha_gpu::exact_dkdv_key(
          p, in, int(b), int(hk), j, mha_gpu::exact_col(p, a.cols, a.cols_batch_stride, b, j),
          [pp = &a.p, b](int64_t i) { return mha_row(*pp, b, i).diag; }, kx, vx);
      mha_gpu::exact_store(dk_out + r * k_stride, hd, kx);
      mha_gpu::exact_store(dv_out + r * v_stride, hdv, vx);
    }
  }
}

// Deterministic dQ on the matrix units: one block of kWarps warps per (tile of 16 * kWarps query rows, query
// head, batch), warp w on rows [16w, 16w + 16). Q and dO stay in shared memory; K and V tiles of BC keys
// stream through a double buffer (cp.async: tile j + 1 copies while tile j is computed), only those the
// rows see. Per tile and warp: S = Q K^T, dP = dO V^T (A = Q, dO via ldmatrix; B = K, V: the forward's K
// pattern), P = exp2(s - lse), dX = P (dP - delta) softcap', masked to 0 by a select, then
// dQ += dX K (A = dX from the C fragments rounded to T, B = K via ldmatrix .trans: the forward's V pattern),
// summed in the same order every run, written once. A key tile some rows see only in part whose K holds a
// NaN/inf is sanitized (those values set to 0) after S, before the dQ product: a hidden key's K never reaches
// a row, and a row that sees it has dX NaN already.
template <typename T, int D>
struct DqMmaTiles {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int BR = 16 * kWarps;
  static constexpr int BC = 64;
  static constexpr int LD = D + 8;
  // Q, dO [BR][LD]; K, V [2][BC][LD] (T); lse, delta [BR] (float); lo, hi, diag [BR] (int32).
  static constexpr int kTileElems = (2 * BR + 4 * BC) * LD;
  static constexpr int kSmemBytes = kTileElems * int(sizeof(T)) + 5 * BR * 4;
  static_assert(kSmemBytes <= 227 * 1024, "MHA dQ (MMA) tiles exceed shared memory");
};

template <typename T, int D, bool TERMS>
JA_GLOBAL void __launch_bounds__(DqMmaTiles<T, D>::kThreads, 1) mha_bwd_dq_mma_kernel(JaMhaBwdArgs a) {
  using Tl = DqMmaTiles<T, D>;
  constexpr int BR = Tl::BR, BC = Tl::BC, LD = Tl::LD, NT = Tl::kThreads;
  constexpr int KD = D / 16;  // k-steps over head_dim (S, dP)
  constexpr int NS = BC / 8;  // 16x8 fragments of S / dP per warp (key columns)
  constexpr int KC = BC / 16;  // k-steps over keys (dQ)
  constexpr int NO = D / 8;  // 16x8 fragments of dQ per warp
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* q_s = reinterpret_cast<T*>(smem_raw);
  T* do_s = q_s + BR * LD;
  T* kv_s = do_s + BR * LD;  // [2][K, V][BC][LD]
  float* lse_s = reinterpret_cast<float*>(q_s + Tl::kTileElems);
  float* delta_s = lse_s + BR;
  int32_t* lo_s = reinterpret_cast<int32_t*>(delta_s + BR);
  int32_t* hi_s = lo_s + BR;
  int32_t* dg_s = hi_s + BR;

  const JaMhaProblem& p = a.p;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;
  const int q0 = int(blockIdx.x) * BR;
  const int64_t h = blockIdx.y, b = blockIdx.z;
  const int64_t sq = p.seq_q, sk = p.seq_k, hq = p.heads_q, hkv = p.heads_kv, hk = h / (hq / hkv);
  const int rows = int(sq - q0 < BR ? sq - q0 : BR);
  const int hd = int(p.head_dim), hdv = int(p.head_dim_v);
  const int64_t q_stride = hq * hd, o_stride = hq * hdv, k_stride = hkv * hd, v_stride = hkv * hdv;
  const bool vec = vec_dims<T>(p);
  const float s2 = p.scale * ja_log2e;
  const T* k = static_cast<const T*>(a.k) + (b * sk * hkv + hk) * hd;
  const T* v = static_cast<const T*>(a.v) + (b * sk * hkv + hk) * hdv;
  const int wrow = warp * 16;

  cp_async_tile<T, BR, D, LD, NT>(q_s, static_cast<const T*>(a.q) + ((b * sq + q0) * hq + h) * hd, q_stride, rows, hd,
                                  vec);
  cp_async_tile<T, BR, D, LD, NT>(do_s, static_cast<const T*>(a.dout) + ((b * sq + q0) * hq + h) * hdv, o_stride, rows,
                                  hdv, vec);
  for (int i = threadIdx.x; i < BR; i += NT) {
    const bool ok = i < rows;
    lse_s[i] = ok ? a.lse[(b * hq + h) * sq + q0 + i] * ja_log2e : INFINITY;
    delta_s[i] = ok ? a.delta[(b * hq + h) * sq + q0 + i] : 0.0f;
    const MhaRow r = ok ? mha_row(p, b, q0 + i) : MhaRow{0, 0, 0};
    lo_s[i] = int32_t(r.lo), hi_s[i] = int32_t(r.hi), dg_s[i] = int32_t(r.diag);
  }
  const MhaRow first = mha_row(p, b, q0), last = mha_row(p, b, q0 + rows - 1);
  const int kv_begin = int(first.lo), kv_end = int(last.hi), all_lo = int(last.lo), all_hi = int(first.hi);
  auto load_kv = [&](int kv0, int buf) {
    const int nk = kv_end - kv0 < BC ? kv_end - kv0 : BC;
    cp_async_tile<T, BC, D, LD, NT>(kv_s + (2 * buf) * BC * LD, k + int64_t(kv0) * k_stride, k_stride, nk, hd, vec);
    cp_async_tile<T, BC, D, LD, NT>(kv_s + (2 * buf + 1) * BC * LD, v + int64_t(kv0) * v_stride, v_stride, nk, hdv,
                                    vec);
  };
  if (kv_begin < kv_end) load_kv(kv_begin, 0);
  mma::cp_async_commit();

  // This lane's rows of the warp's m-tile: g (e = 0, 1) and g + 8 (e = 2, 3).
  float dq[NO][4];
#pragma unroll
  for (int n = 0; n < NO; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;

  int buf = 0;
  for (int kv0 = kv_begin; kv0 < kv_end; kv0 += BC, buf ^= 1) {
    mma::cp_async_wait<0>();
    __syncthreads();  // tile kv0 (and Q, dO, the rows) landed; every warp is done with the other buffer
    if (kv0 + BC < kv_end) {
      load_kv(kv0 + BC, buf ^ 1);
      mma::cp_async_commit();
    }
    T* k_t = kv_s + (2 * buf) * BC * LD;
    const T* v_t = k_t + BC * LD;
    const int nk = kv_end - kv0 < BC ? kv_end - kv0 : BC;
    const bool need_mask = !(kv0 >= all_lo && kv0 + BC <= all_hi);

    float s[NS][4], dp[NS][4];
#pragma unroll
    for (int n = 0; n < NS; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = dp[n][e] = 0.0f;
#pragma unroll 2
    for (int kd = 0; kd < KD; ++kd) {
      uint32_t qa[4], ga[4];
      const int a_off = (wrow + (lane & 15)) * LD + kd * 16 + (lane >> 4) * 8;
      mma::ldmatrix_x4(qa, q_s + a_off);
      mma::ldmatrix_x4(ga, do_s + a_off);
#pragma unroll
      for (int n2 = 0; n2 < NS / 2; ++n2) {
        const int b_off = (n2 * 16 + (lane & 7) + ((lane >> 4) << 3)) * LD + kd * 16 + ((lane >> 3) & 1) * 8;
        uint32_t kb[4], vb[4];
        mma::ldmatrix_x4(kb, k_t + b_off);
        mma::ldmatrix_x4(vb, v_t + b_off);
        mma::mma_16816<T>(s[2 * n2], qa, kb);
        mma::mma_16816<T>(s[2 * n2 + 1], qa, kb + 2);
        mma::mma_16816<T>(dp[2 * n2], ga, vb);
        mma::mma_16816<T>(dp[2 * n2 + 1], ga, vb + 2);
      }
    }

    // dX in place of S: element e of fragment n is row wrow + g + 8 (e >> 1), key kv0 + n * 8 + 2t + (e & 1).
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int rr = wrow + g + 8 * i;
      const float lse2 = lse_s[rr], dlt = delta_s[rr];
      const int lo = min(max(lo_s[rr] - kv0, 0), BC), hi = min(max(hi_s[rr] - kv0, 0), nk);
#pragma unroll
      for (int n = 0; n < NS; ++n)
#pragma unroll
        for (int e = 2 * i; e < 2 * i + 2; ++e) {
          const int kr = n * 8 + 2 * t + (e & 1);
          float x = s[n][e], tc = 0.0f;
          if constexpr (TERMS) {
            x = score_terms(p, b, h)(x, q0 + rr, dg_s[rr], kv0 + kr, &tc) * ja_log2e;
          } else {
            x *= s2;
          }
          float dx = ja_exp2(x - lse2) * (dp[n][e] - dlt);
          if constexpr (TERMS) dx *= 1.0f - tc * tc;
          s[n][e] = !need_mask || (lo <= kr && kr < hi) ? dx : 0.0f;
        }
    }

    // A tile some rows see only in part whose K holds a NaN/inf: zero those values before the dQ product
    // (every warp is done with S: the barrier in tile_nonfinite).
    if (need_mask && tile_nonfinite<T, BC, D, LD, NT>(k_t, hd)) {
      constexpr int kVec = 16 / int(sizeof(T));
      for (int idx = threadIdx.x; idx < BC * D; idx += NT) {
        T* x = k_t + (idx / D) * LD + idx % D;
        if (nonfinite(*x)) *x = from_f32<T>(0.0f);
      }
      (void)kVec;
      __syncthreads();
    }

    // dQ += dX K: A = dX (16 rows x 16 keys, C fragments rounded to T), B = K (k = key, n = head-dim; stored
    // [key][d]: ldmatrix .trans).
#pragma unroll
    for (int kc = 0; kc < KC; ++kc) {
      uint32_t xa[4];
      xa[0] = mma::pack2<T>(s[2 * kc][0], s[2 * kc][1]);
      xa[1] = mma::pack2<T>(s[2 * kc][2], s[2 * kc][3]);
      xa[2] = mma::pack2<T>(s[2 * kc + 1][0], s[2 * kc + 1][1]);
      xa[3] = mma::pack2<T>(s[2 * kc + 1][2], s[2 * kc + 1][3]);
#pragma unroll
      for (int n2 = 0; n2 < NO / 2; ++n2) {
        uint32_t kb[4];
        mma::ldmatrix_x4_trans(kb,
                               k_t + (kc * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + n2 * 16 + (lane >> 4) * 8);
        mma::mma_16816<T>(dq[2 * n2], xa, kb);
        mma::mma_16816<T>(dq[2 * n2 + 1], xa, kb + 2);
      }
    }
  }
  mma::cp_async_wait<0>();  // no key tile: the Q/dO copies must land before the block exits

  T* out = static_cast<T*>(a.dq) + ((b * sq + q0) * hq + h) * hd;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = wrow + g + 8 * i;
    if (r >= rows) continue;
#pragma unroll
    for (int n = 0; n < NO; ++n)
      store_pair<T>(out + r * q_stride, n * 8 + 2 * t, hd, dq[n][2 * i] * p.scale, dq[n][2 * i + 1] * p.scale);
  }
}

template <typename T, int D, bool CAUSAL>
const char* mha_bwd_mma_launch(const JaMhaBwdArgs& a, ja_stream_t stream) {
  using Tl = BwdMmaTiles<T, D>;
  using Dq = DqMmaTiles<T, D>;
  if (const char* e = refuse_unhandled("mha_bwd", "mma.sync", a, kBwdMmaFeatures)) return e;
  const JaMhaProblem& p = a.p;
  const bool terms = p.softcap > 0.0f || p.alibi != nullptr, det = a.deterministic != 0;
  const int64_t kv_tiles = (p.seq_k + Tl::BC - 1) / Tl::BC;
  if (kv_tiles > 0) {
    if (const char* e = check_grid("mha_bwd", kv_tiles, p.heads_kv, p.batch)) return e;
    const dim3 grid(unsigned(kv_tiles), unsigned(p.heads_kv), unsigned(p.batch));
    auto kernel =
        terms ? (det ? mha_bwd_mma_kernel<T, D, CAUSAL, true, true> : mha_bwd_mma_kernel<T, D, CAUSAL, true, false>)
              : (det ? mha_bwd_mma_kernel<T, D, CAUSAL, false, true> : mha_bwd_mma_kernel<T, D, CAUSAL, false, false>);
    if (const char* e =
            launch_with_smem(kernel, grid, Tl::kThreads, Tl::kSmemBytes, stream, a, "mha_bwd (dK/dV/dQ, MMA)"))
      return e;
  }
  if (det && p.seq_q > 0) {
    const int64_t q_tiles = (p.seq_q + Dq::BR - 1) / Dq::BR;
    if (const char* e = check_grid("mha_bwd", q_tiles, p.heads_q, p.batch)) return e;
    const dim3 grid(unsigned(q_tiles), unsigned(p.heads_q), unsigned(p.batch));
    return launch_with_smem(terms ? mha_bwd_dq_mma_kernel<T, D, true> : mha_bwd_dq_mma_kernel<T, D, false>, grid,
                            Dq::kThreads, Dq::kSmemBytes, stream, a, "mha_bwd (deterministic dQ, MMA)");
  }
  return nullptr;
}

}  // namespace mha_gpu
}  // namespace ja
#endif  // JA_HAS_WARP_MMA
