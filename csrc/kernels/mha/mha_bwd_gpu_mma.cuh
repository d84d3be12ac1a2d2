// Flash-attention backward on the matrix units (FlashAttention-2 structure):
// the middle kernel of mha_bwd_gpu.cuh (dK, dV and the dQ accumulation) for
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
// Conventions are the SIMT kernel's: bottom-right causal alignment (query i
// sees key j iff j <= i + seq_k - seq_q), query tiles that see none of the
// block's keys skipped, rows with no visible key (lse = +inf) contribute 0.
#pragma once
#include "ja/mma.h"
#include "mha/mha_fwd_gpu_mma.cuh"  // cp_async_tile
#include "mha/mha_gpu_common.cuh"

#if JA_HAS_WARP_MMA
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
  static constexpr int BR = JA_MHA_BWD_MMA_BR > 0           ? JA_MHA_BWD_MMA_BR
                            : D <= 64 || (D / 16) % (kWarps / 2) != 0 ? 64
                                                                      : 32;
  static constexpr int LD = D + 8;    // 16-byte pad: ldmatrix rows of 8 consecutive tile rows hit distinct banks
  static constexpr int LDS = BR + 8;  // row stride of the dS^T tile [BC][BR], same reason
  // dQ: the BR x D tile is split into WM (16-row m-tiles) x WN (column blocks of DQN) warps.
  static constexpr int WM = BR / 16;
  static constexpr int WN = kWarps / WM;
  static constexpr int DQN = D / WN;
  // Shared memory: k_s, v_s [BC][LD]; q_s, do_s [2][BR][LD]; ds_s [BC][LDS] (T);
  // lse_s, delta_s [2][BR] (float).
  static constexpr int kTileElems = (2 * BC + 4 * BR) * LD + BC * LDS;
  static constexpr int kSmemBytes = kTileElems * int(sizeof(T)) + 4 * BR * int(sizeof(float));
  static_assert(kSmemBytes <= 227 * 1024, "MHA backward (MMA) tiles exceed shared memory");
  static_assert(D % 16 == 0 && BR % 16 == 0, "tiles must be multiples of the 16x16 MMA shape");
  static_assert(kWarps % WM == 0 && WN >= 1 && D % WN == 0 && DQN % 16 == 0,
                "the dQ tile must split evenly over the warps");
  static_assert((kTileElems * int(sizeof(T))) % 16 == 0, "float region must stay aligned");
};

template <typename T, int D, bool CAUSAL>
JA_GLOBAL void __launch_bounds__(BwdMmaTiles<T, D>::kThreads, JA_MHA_BWD_MMA_MIN_BLOCKS)
    mha_bwd_mma_kernel(JaMhaBwdArgs a) {
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
  T* ds_s = do_s + 2 * BR * LD;  // [BC][LDS]: dS^T (keys x queries)
  float* lse_s = reinterpret_cast<float*>(ds_s + BC * LDS);  // [2][BR]
  float* delta_s = lse_s + 2 * BR;                            // [2][BR]

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;
  const GridPlace at = grid_place(CAUSAL, false);  // causal: each kv head's first key blocks start first
  const int64_t kv0 = at.tile * BC, hk = at.head, b = at.batch;
  const int64_t sq = a.p.seq_q, sk = a.p.seq_k, hq = a.p.heads_q, hkv = a.p.heads_kv;
  const int64_t group = hq / hkv;
  const int nk = int(sk - kv0 < BC ? sk - kv0 : BC);
  const int64_t q_stride = hq * D, kv_stride = hkv * D;
  const float s2 = a.p.scale * ja_log2e;
  const int wrow = warp * 16;  // this warp's first key row in the tile

  // Query tiles per head: causal blocks start at the tile holding the first
  // query that sees key kv0. The loop runs over (head, tile) pairs.
  const int64_t q_begin = CAUSAL ? first_query_for_key(kv0, sq, sk) / BR * BR : 0;
  const int64_t q_tiles = sq > q_begin ? (sq - q_begin + BR - 1) / BR : 0;
  const int64_t n_iter = group * q_tiles;

  const T* q_g = static_cast<const T*>(a.q);
  const T* do_g = static_cast<const T*>(a.dout);
  // Copies Q, dO (rows past seq_q zero-filled), lse and delta of tile (h, q0) into buffer `buf`.
  auto load_q_tile = [&](int64_t h, int64_t q0, int buf) {
    const int rows = int(sq - q0 < BR ? sq - q0 : BR);
    const int64_t off = ((b * sq + q0) * hq + h) * D;
    cp_async_tile<T, BR, D, LD, NT>(q_s + buf * BR * LD, q_g + off, q_stride, rows);
    cp_async_tile<T, BR, D, LD, NT>(do_s + buf * BR * LD, do_g + off, q_stride, rows);
    const int64_t roff = (b * hq + h) * sq + q0;  // row q0 exists, so roff is always a mapped address
    for (int i = int(threadIdx.x); i < 2 * BR; i += NT) {
      const int r = i % BR;
      const bool ok = r < rows;
      const float* src = (i < BR ? a.lse : static_cast<const float*>(a.delta)) + roff;
      float* dst = (i < BR ? lse_s : delta_s) + buf * BR + r;
      mma::cp_async_4(dst, ok ? src + r : src, ok);
    }
  };

  cp_async_tile<T, BC, D, LD, NT>(k_s, static_cast<const T*>(a.k) + ((b * sk + kv0) * hkv + hk) * D, kv_stride, nk);
  cp_async_tile<T, BC, D, LD, NT>(v_s, static_cast<const T*>(a.v) + ((b * sk + kv0) * hkv + hk) * D, kv_stride, nk);
  if (n_iter > 0) load_q_tile(hk * group, q_begin, 0);
  mma::cp_async_commit();

  // dK, dV accumulators: C fragments, rows (keys) wrow + g + 8 (e >> 1), columns n * 8 + 2t + (e & 1).
  float dk[NO][4], dv[NO][4];
#pragma unroll
  for (int n = 0; n < NO; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[n][e] = dv[n][e] = 0.0f;

  int64_t h = hk * group, q0 = q_begin;  // iteration `it` works on query head h, rows [q0, q0 + BR)
  for (int64_t it = 0; it < n_iter; ++it) {
    const int buf = int(it & 1);
    int64_t h_next = h, q0_next = q0 + BR;  // the tile of iteration it + 1
    if (q0_next >= sq) q0_next = q_begin, ++h_next;
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

    // P^T and dS^T in place (st <- P^T, dpt <- dS^T). Fragment element e of
    // fragment n: key kv0 + wrow + g + 8 (e >> 1), query q0 + n * 8 + 2t + (e & 1).
    // Masked: keys past seq_k, queries past seq_q, (causal) keys after the query's diagonal.
    // In tile coordinates (kr = key - kv0, qr = query - q0): visible iff kr < nk,
    // qr < rows and (causal) kr - qr <= diag = q0 + sk - sq - kv0.
    const int rows = int(sq - q0 < BR ? sq - q0 : BR);
    const int64_t diag64 = q0 + sk - sq - kv0;
    constexpr int kClamp = BC + BR;  // kr - qr lies in (-BR, BC): clamping diag to +-(BC + BR) keeps every comparison
    const int diag = int(diag64 < -kClamp ? -kClamp : (diag64 > kClamp ? kClamp : diag64));
    const bool need_mask = nk < BC || rows < BR || (CAUSAL && BC - 1 > diag);
#pragma unroll
    for (int n = 0; n < NS; ++n) {
      const float2 l2 = *reinterpret_cast<const float2*>(lse_t + n * 8 + 2 * t);
      const float2 d2 = *reinterpret_cast<const float2*>(delta_t + n * 8 + 2 * t);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float lse2 = ((e & 1) ? l2.y : l2.x) * ja_log2e;  // +inf (no visible key) gives P = 0
        const float dlt = (e & 1) ? d2.y : d2.x;
#if JA_MHA_BWD_MMA_FAST_EXP2
        float p = ja_exp2_approx(st[n][e] * s2 - lse2);
#else
        float p = ja_exp2(st[n][e] * s2 - lse2);
#endif
        if (need_mask) {
          const int kr = wrow + g + (e >> 1) * 8;
          const int qr = n * 8 + 2 * t + (e & 1);
          if (kr >= nk || qr >= rows || (CAUSAL && kr - qr > diag)) p = 0.0f;
        }
        st[n][e] = p;
        dpt[n][e] = p * (dpt[n][e] - dlt);
      }
    }

    // dV += P^T dO and dK += dS^T Q. A: 16 keys x 16 queries from the C fragments
    // of query columns kr*16 + [0, 8) and [8, 16), rounded to T (the forward's P).
    // B (k = query, n = head-dim; stored [query][d]): the forward's V pattern
    // (ldmatrix_x4_trans, two B fragments for head-dim n2*16 + [0, 8) and [8, 16)).
    // The rounded dS^T also goes to ds_s for the dQ product.
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
      // a[0] = (key g, queries 2t..), a[1] = (g + 8, 2t..), a[2] = (g, 2t + 8..), a[3] = (g + 8, 2t + 8..)
      T* ds_row = ds_s + (wrow + g) * LDS + kr * 16 + 2 * t;
      *reinterpret_cast<uint32_t*>(ds_row) = sa[0];
      *reinterpret_cast<uint32_t*>(ds_row + 8 * LDS) = sa[1];
      *reinterpret_cast<uint32_t*>(ds_row + 8) = sa[2];
      *reinterpret_cast<uint32_t*>(ds_row + 8 * LDS + 8) = sa[3];
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
    __syncthreads();  // ds_s holds the whole BC x BR dS^T

    // dQ += dS K * scale: warp (mt, nb) takes query rows mt*16 + [0, 16) and
    // head-dim columns nb*DQN + [0, DQN).
    // A (16 queries x 16 keys) from dS^T stored [key][query]: ldmatrix_x4_trans,
    //   matrices (keys 0-7, queries 0-7), (keys 0-7, queries 8-15), (keys 8-15, q 0-7), (keys 8-15, q 8-15)
    //   = a[0..3]; lane l addresses key row kc*16 + (l & 7) + (l >> 4) * 8, query column ((l >> 3) & 1) * 8.
    // B (k = key, n = head-dim; stored [key][d]): the forward's V pattern.
    {
      const int mt = warp % WM, n0 = (warp / WM) * DQN;
      uint32_t dsa[KC][4];
#pragma unroll
      for (int kc = 0; kc < KC; ++kc)
        mma::ldmatrix_x4_trans(dsa[kc], ds_s + (kc * 16 + (lane & 7) + (lane >> 4) * 8) * LDS + mt * 16 +
                                            ((lane >> 3) & 1) * 8);
      const int64_t qrow = q0 + mt * 16 + g;  // this lane's rows: qrow, qrow + 8
      float* dq = a.dq_accum + ((b * sq + qrow) * hq + h) * D + n0 + 2 * t;
#pragma unroll
      for (int n2 = 0; n2 < DQN / 16; ++n2) {
        float acc[2][4];
#pragma unroll
        for (int j = 0; j < 2; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
#pragma unroll
        for (int kc = 0; kc < KC; ++kc) {
          uint32_t kb[4];
          mma::ldmatrix_x4_trans(kb, k_s + (kc * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + n0 + n2 * 16 +
                                         (lane >> 4) * 8);
          mma::mma_16816<T>(acc[0], dsa[kc], kb);
          mma::mma_16816<T>(acc[1], dsa[kc], kb + 2);
        }
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          if (qrow + 8 * i >= sq) continue;
#pragma unroll
          for (int j = 0; j < 2; ++j)
            ja_atomic_add2(dq + i * 8 * q_stride + n2 * 16 + j * 8, acc[j][2 * i] * a.p.scale,
                           acc[j][2 * i + 1] * a.p.scale);
        }
      }
    }
    h = h_next, q0 = q0_next;
  }
  mma::cp_async_wait<0>();  // no query tile (n_iter == 0): the K/V copies must land before the block exits

  // Epilogue: dK * scale and dV rounded to T, rows < seq_k.
  T* dk_out = static_cast<T*>(a.dk) + ((b * sk + kv0) * hkv + hk) * D;
  T* dv_out = static_cast<T*>(a.dv) + ((b * sk + kv0) * hkv + hk) * D;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = wrow + g + 8 * i;
    if (r >= nk) continue;
#pragma unroll
    for (int n = 0; n < NO; ++n) {
      const int64_t off = r * kv_stride + n * 8 + 2 * t;
      *reinterpret_cast<uint32_t*>(dk_out + off) = mma::pack2<T>(dk[n][2 * i] * a.p.scale, dk[n][2 * i + 1] * a.p.scale);
      *reinterpret_cast<uint32_t*>(dv_out + off) = mma::pack2<T>(dv[n][2 * i], dv[n][2 * i + 1]);
    }
  }
}

template <typename T, int D, bool CAUSAL>
const char* mha_bwd_mma_launch(const JaMhaBwdArgs& a, ja_stream_t stream) {
  using Tl = BwdMmaTiles<T, D>;
  const int64_t kv_tiles = (a.p.seq_k + Tl::BC - 1) / Tl::BC;
  if (kv_tiles == 0) return nullptr;
  if (const char* e = check_grid("mha_bwd", kv_tiles, a.p.heads_kv, a.p.batch)) return e;
  const dim3 grid(unsigned(kv_tiles), unsigned(a.p.heads_kv), unsigned(a.p.batch));
  return launch_with_smem(mha_bwd_mma_kernel<T, D, CAUSAL>, grid, Tl::kThreads, Tl::kSmemBytes, stream, a,
                          "mha_bwd (dK/dV/dQ, MMA)");
}

}  // namespace mha_gpu
}  // namespace ja
#endif  // JA_HAS_WARP_MMA
