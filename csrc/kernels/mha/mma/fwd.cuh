// Flash-attention forward on the matrix units (FlashAttention-2 structure).
//
// One block of kWarps warps per (tile of 16 * kWarps query rows, query head,
// batch); warp w owns query rows [16w, 16w + 16) of the tile. The Q tile is
// staged once through shared memory into A fragments that stay in registers;
// K and V tiles of BC rows stream through shared memory with cp.async (V of
// this tile is copied while S = Q K^T is computed, K of the next tile while
// O += P V is). The online softmax runs on the S accumulator fragments in
// registers; each quad of lanes shares a row, so row reductions are two
// shuffles. P is rounded to the input dtype before the P V product, as
// FlashAttention does; every sum accumulates in float32.
//
// Conventions are the SIMT kernel's (simt/fwd.cuh): the mask as per-row key
// ranges (causal, windows, varlen, segments), key tiles outside the tile's rows'
// keys skipped, rows with no visible key give output 0 and lse = +inf; softcap
// and ALiBi in the score (an instance per: with them or without, so the plain
// kernel keeps no registers for them); head dims below D zero-padded. Bias and
// dropout take the SIMT kernel.
//
// NaN/Inf: a hidden key's score is selected to -inf, whatever K holds. Its P is
// then 0, and 0 * inf is NaN on the matrix units, so in a key tile that some rows
// see only in part (need_mask) the V tile is scanned: its NaNs and infinities
// are zeroed in shared memory before P V (sanitize_tile), and the outputs of the
// rows that see those keys are marked to take them (mark_nonfinite: +inf, -inf
// or NaN per output, applied in the epilogue). The scan costs a pass over the V
// tile in shared memory on those boundary tiles only; the marking runs only where
// V holds such a value.
#pragma once
#include "ja/mma.h"
#include "mha/common/gpu.cuh"
#include "mha/common/mma_tiles.cuh"

#if JA_HAS_WARP_MMA
namespace ja {
namespace mha_gpu {

// Build-time tuning knobs. The defaults were chosen on the H200 (bf16, b4 h32 d128,
// seq 1024/4096/8192, causal or not, against cuDNN's forward in the same run):
// MI=2 BC=64 with FAST_EXP2, despite register spills at d128 (longer sequences gain from
// fewer K/V tile barriers); MI=1, BC=32, WARPS=8 and MIN_BLOCKS=3 lost. The figures live in
// the benchmark runs' artifacts (benchmarks/, docs/benchmarks.md), not here.
//   WARPS       warps per block
//   MI          16-row MMA tiles per warp (query rows per block = 16 * MI * WARPS);
//               MI = 1 keeps the Q fragments in registers, MI > 1 reads them from
//               shared memory (each K/V fragment then feeds MI products)
//   BC          keys per K/V tile
//   FAST_EXP2   1: softmax numerators with ja_exp2_approx (see ja/gpu.h)
//   MIN_BLOCKS  minimum resident blocks per multiprocessor asked of the register allocator
#ifndef JA_MHA_FWD_MMA_WARPS
#define JA_MHA_FWD_MMA_WARPS 4
#endif
#ifndef JA_MHA_FWD_MMA_MI
#define JA_MHA_FWD_MMA_MI 2
#endif
#ifndef JA_MHA_FWD_MMA_BC
#define JA_MHA_FWD_MMA_BC 64
#endif
#ifndef JA_MHA_FWD_MMA_FAST_EXP2
#define JA_MHA_FWD_MMA_FAST_EXP2 1
#endif
#ifndef JA_MHA_FWD_MMA_MIN_BLOCKS
#define JA_MHA_FWD_MMA_MIN_BLOCKS 1
#endif

template <typename T, int D>
struct FwdMmaTiles {
  static constexpr int kWarps = JA_MHA_FWD_MMA_WARPS;
  static constexpr int kThreads = 32 * kWarps;
  // head_dim > 128: one m-tile per warp and Q read from shared memory, so the 16 x D
  // output accumulators (128 floats a lane at D = 256) leave room for the scores.
  static constexpr int MI = D > 128 ? 1 : JA_MHA_FWD_MMA_MI;
  static constexpr bool kQInRegs = MI == 1 && D <= 128;
  static constexpr int BR = 16 * MI * kWarps;
  static constexpr int BC = JA_MHA_FWD_MMA_BC;
  static constexpr int LD = D + 8;  // 16-byte pad: ldmatrix rows of 8 consecutive tile rows hit distinct banks
  // Q in registers: the Q tile is staged through the K/V buffers before the
  // first K tile arrives. Otherwise Q has its own region after K and V.
  static constexpr int kSmemElems = kQInRegs ? (2 * BC > BR ? 2 * BC : BR) * LD : (2 * BC + BR) * LD;
  // After the tiles: each row's lo, hi, diag (int32 [3][BR]), the V tile's keys holding a NaN or an
  // infinity (one bit a key, [BC / 32] words), the outputs they reach (2 bits each: [BR][D / 16] words) and
  // whether any was marked.
  static constexpr int kBadWords = (BC + 31) / 32;
  static constexpr int kMarkWords = D / 16;
  static constexpr int kSmemBytes =
      kSmemElems * int(sizeof(T)) + (3 * BR + kBadWords + BR * kMarkWords + 1) * int(sizeof(int32_t));
  static_assert(kSmemBytes <= 227 * 1024, "MHA forward (MMA) tiles exceed shared memory");
  static_assert(D % 16 == 0 && BC % 16 == 0, "tiles must be multiples of the 16x16 MMA shape");
  static_assert((kSmemElems * int(sizeof(T))) % 4 == 0, "the int32 region must stay aligned");
};

// NaN/Inf guard of a P V product on the matrix units, where P = 0 times an infinite V would be NaN: finds
// the keys of a [BC][LD] V tile in shared memory holding a NaN or an infinity in columns [0, cols), sets
// their bits in bad[] (zeroed before; one bit a key) and replaces those values by 0 in the tile. Returns
// (block-wide, a barrier) whether there were any; the caller then marks the outputs those values reach
// (mark_nonfinite), so a row gets the infinities and NaNs of exactly the keys it sees.
template <typename T, int BC, int D, int LD, int NTHREADS>
JA_DEVICE bool sanitize_tile(T* tile, int cols, uint32_t* bad) {
  constexpr int kVec = 16 / int(sizeof(T));
  bool found = false;
  for (int idx = int(threadIdx.x); idx < BC * (D / kVec); idx += NTHREADS) {
    const int r = idx / (D / kVec), c = (idx % (D / kVec)) * kVec;
    if (c >= cols) continue;
    Pack<T, kVec> pk = *reinterpret_cast<const Pack<T, kVec>*>(tile + r * LD + c);
    bool any = false;
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      if (nonfinite(pk.v[e])) {
        any = true;
        pk.v[e] = from_f32<T>(0.0f);
      }
    }
    if (any) {
      *reinterpret_cast<Pack<T, kVec>*>(tile + r * LD + c) = pk;
      atomicOr(bad + r / 32, 1u << (r % 32));
      found = true;
    }
  }
  return __syncthreads_or(found);
}

// Where sanitize_tile removed values: for every key kk of the tile flagged in bad[] (key kv0 + kk), every
// row r of the tile that sees it (lo[r] <= key < hi[r]) and every column where the key's V (read from global
// memory: row kk at vg + kk * stride) is +inf, -inf or NaN, bit 0, bit 1 or both of output (r, col) are set
// in mark[r] (2 bits per output, 16 columns a word; the epilogue turns them into +inf, -inf, NaN, what
// p * v adds to a finite sum). It reads only the mask and V, so it runs after the P V product, where the
// S fragments are dead: the rare path costs the main loop no registers. The whole block takes part.
template <typename T, int BR, int BC, int MW, int NTHREADS>
JA_DEVICE void mark_nonfinite(const uint32_t* bad, int cols, const T* vg, int64_t stride, int kv0, const int32_t* lo,
                              const int32_t* hi, uint32_t* mark) {
  for (int w = 0; w < (BC + 31) / 32; ++w) {
    uint32_t bits = bad[w];
    while (bits) {
      const int kk = w * 32 + __ffs(int(bits)) - 1;
      bits &= bits - 1;
      const int key = kv0 + kk;
      const T* v = vg + kk * stride;
      for (int idx = int(threadIdx.x); idx < BR * cols; idx += NTHREADS) {
        const int r = idx / cols, col = idx % cols;
        if (!(lo[r] <= key && key < hi[r])) continue;
        const uint32_t x = __float_as_uint(to_f32(v[col]));
        if ((x & 0x7f800000u) != 0x7f800000u) continue;
        const uint32_t kind = (x & 0x007fffffu) ? 3u : (x >> 31) ? 2u : 1u;  // NaN, -inf, +inf
        atomicOr(mark + r * MW + col / 16, kind << (2 * (col % 16)));
      }
    }
  }
}

// The output value of a marked (row, col) (mark_nonfinite): +inf, -inf, or NaN for both.
JA_DEVICE float marked_value(uint32_t kind, float x) {
  return kind == 0 ? x : kind == 1 ? INFINITY : kind == 2 ? -INFINITY : __int_as_float(0x7fffffff);
}

// TERMS: the score has softcap or ALiBi terms (ScoreTerms); without them it is scale * q.k, and that
// instance keeps none of their registers.
template <typename T, int D, bool CAUSAL, bool TERMS>
JA_GLOBAL void __launch_bounds__(FwdMmaTiles<T, D>::kThreads, JA_MHA_FWD_MMA_MIN_BLOCKS)
    mha_fwd_mma_kernel(JaMhaFwdArgs a) {
  using Tl = FwdMmaTiles<T, D>;
  constexpr int BR = Tl::BR, BC = Tl::BC, LD = Tl::LD, NT = Tl::kThreads, MI = Tl::MI;
  constexpr bool QREG = Tl::kQInRegs;
  constexpr int KD = D / 16;   // k-steps over head_dim (S = Q K^T)
  constexpr int NS = BC / 8;   // 16x8 score fragments per m-tile and key tile
  constexpr int KC = BC / 16;  // k-steps over keys (O += P V)
  constexpr int NO = D / 8;    // 16x8 output fragments per m-tile
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* smem = reinterpret_cast<T*>(smem_raw);
  T* k_s = smem;
  T* v_s = smem + BC * LD;
  T* q_s = QREG ? smem : smem + 2 * BC * LD;
  int32_t* lo_s = reinterpret_cast<int32_t*>(smem + Tl::kSmemElems);  // per tile row: keys [lo, hi) and diag
  int32_t* hi_s = lo_s + BR;
  int32_t* dg_s = hi_s + BR;
  uint32_t* bad_s = reinterpret_cast<uint32_t*>(dg_s + BR);  // the V tile's keys with a NaN/inf (sanitize_tile)
  uint32_t* mark_s = bad_s + Tl::kBadWords;                   // the outputs they reach (mark_nonfinite)
  uint32_t* marked_s = mark_s + BR * Tl::kMarkWords;          // whether any output was marked

  const JaMhaProblem& p = a.p;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;
  // Causal: the longest rows (each head's last query tile) start first (grid_place).
  const auto [q0, h, b, sq, sk, hq, hkv, hk, q_stride, k_stride, v_stride, o_stride, rows, s2] =
      fwd_block(a, grid_place(CAUSAL, true), BR);
  const int hd = int(p.head_dim), hdv = int(p.head_dim_v);
  const bool vec = vec_dims<T>(p);
  const T* k = static_cast<const T*>(a.k) + (b * sk * hkv + hk) * hd;
  const T* v = static_cast<const T*>(a.v) + (b * sk * hkv + hk) * hdv;
  const int wrow = warp * 16 * MI;  // this warp's first row in the tile
  // Q tile -> shared (-> A fragments in registers when QREG); the rows' mask.
  uint32_t qa[QREG ? KD : 1][4];
  cp_async_tile<T, BR, D, LD, NT>(q_s, static_cast<const T*>(a.q) + ((b * sq + q0) * hq + h) * hd, q_stride, rows, hd,
                                  vec);
  mma::cp_async_commit();
  for (int i = threadIdx.x; i < BR; i += NT) {
    const MhaRow r = i < rows ? mha_row(p, b, q0 + i) : MhaRow{0, 0, 0};  // padding rows see nothing
    lo_s[i] = int32_t(r.lo), hi_s[i] = int32_t(r.hi), dg_s[i] = int32_t(r.diag);
  }
  if (threadIdx.x == 0) *marked_s = 0u;
  if constexpr (QREG) {
    mma::cp_async_wait<0>();
    __syncthreads();
#pragma unroll
    for (int kd = 0; kd < KD; ++kd)
      mma::ldmatrix_x4(qa[kd], q_s + (wrow + (lane & 15)) * LD + kd * 16 + (lane >> 4) * 8);
    __syncthreads();  // every warp holds its Q fragments before K overwrites the staging area
  }

  // The keys the tile's rows see: [lo of the first row, hi of the last row); every row sees
  // [lo of the last row, hi of the first row) (lo and hi are non-decreasing), so a key tile inside that
  // range and the block's rows needs no mask.
  const MhaRow first = mha_row(p, b, q0), last = mha_row(p, b, q0 + rows - 1);
  // (Positions fit int32: check_problem keeps the sequences below 2^30.)
  const int kv_begin = int(first.lo), kv_end = int(last.hi), all_lo = int(last.lo), all_hi = int(first.hi);

  // This lane's rows in the tile: wrow + 16 mi + g + 8 i, i in {0, 1}.
  const int64_t row0 = q0 + wrow + g;
  float o[MI][NO][4];
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int n = 0; n < NO; ++n) o[mi][n][0] = o[mi][n][1] = o[mi][n][2] = o[mi][n][3] = 0.0f;
  float m[MI][2], l[MI][2];  // l: this lane's partial row sums; the quad is summed at the end
#pragma unroll
  for (int mi = 0; mi < MI; ++mi) m[mi][0] = m[mi][1] = -INFINITY, l[mi][0] = l[mi][1] = 0.0f;

  if (kv_begin < kv_end) {
    cp_async_tile<T, BC, D, LD, NT>(k_s, k + int64_t(kv_begin) * k_stride, k_stride,
                                    kv_end - kv_begin < BC ? kv_end - kv_begin : BC, hd, vec);
    mma::cp_async_commit();
  }
  for (int kv0 = kv_begin; kv0 < kv_end; kv0 += BC) {
    const int nk = kv_end - kv0 < BC ? kv_end - kv0 : BC;  // keys past kv_end are zeros: no row sees them
    mma::cp_async_wait<0>();
    __syncthreads();  // K tile (and Q, the rows' mask) in shared memory; every warp is done with v_s and bad_s
    if (threadIdx.x < Tl::kBadWords) bad_s[threadIdx.x] = 0u;
    cp_async_tile<T, BC, D, LD, NT>(v_s, v + int64_t(kv0) * v_stride, v_stride, nk, hdv, vec);
    mma::cp_async_commit();

    // S = Q K^T for this warp's 16 MI rows x BC keys.
    float s[MI][NS][4];
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
      for (int n = 0; n < NS; ++n) s[mi][n][0] = s[mi][n][1] = s[mi][n][2] = s[mi][n][3] = 0.0f;
#pragma unroll
    for (int kd = 0; kd < KD; ++kd) {
      uint32_t qf[MI][4];
#pragma unroll
      for (int mi = 0; mi < MI; ++mi) {
        if constexpr (QREG) {
#pragma unroll
          for (int e = 0; e < 4; ++e) qf[mi][e] = qa[kd][e];
        } else {
          mma::ldmatrix_x4(qf[mi], q_s + (wrow + mi * 16 + (lane & 15)) * LD + kd * 16 + (lane >> 4) * 8);
        }
      }
#pragma unroll
      for (int n2 = 0; n2 < NS / 2; ++n2) {  // 16 keys per ldmatrix_x4: two B fragments
        uint32_t kb[4];
        mma::ldmatrix_x4(kb, k_s + (n2 * 16 + (lane & 7) + ((lane >> 4) << 3)) * LD + kd * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
        for (int mi = 0; mi < MI; ++mi) {
          mma::mma_16816<T>(s[mi][2 * n2], qf[mi], kb);
          mma::mma_16816<T>(s[mi][2 * n2 + 1], qf[mi], kb + 2);
        }
      }
    }

    // The score into the log2 domain (with softcap and ALiBi, ScoreTerms); keys a row does not see -> -inf
    // (a select: whatever K holds there never reaches the row).
    const bool need_mask = !(kv0 >= all_lo && kv0 + BC <= all_hi);
    if (!TERMS && !need_mask) {
#pragma unroll
      for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int n = 0; n < NS; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mi][n][e] *= s2;
    } else {
#pragma unroll
      for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int rr = wrow + mi * 16 + g + 8 * i;  // tile row
          // The row's keys relative to the tile, clamped to [0, BC]: key kv0 + kr is visible iff lo <= kr < hi.
          const int lo = min(max(lo_s[rr] - kv0, 0), BC), hi = min(max(hi_s[rr] - kv0, 0), BC);
#pragma unroll
          for (int n = 0; n < NS; ++n)
#pragma unroll
            for (int e = 2 * i; e < 2 * i + 2; ++e) {
              const int kr = n * 8 + 2 * t + (e & 1);
              float x = s[mi][n][e];
              if constexpr (TERMS) {
                float tc;
                x = score_terms(p, b, h)(x, q0 + rr, dg_s[rr], kv0 + kr, &tc) * ja_log2e;
              } else {
                x *= s2;
              }
              s[mi][n][e] = !need_mask || (lo <= kr && kr < hi) ? x : -INFINITY;
            }
        }
    }

    // Online softmax: per m-tile, rows g (e = 0, 1) and g + 8 (e = 2, 3).
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        float mx = -INFINITY;
#pragma unroll
        for (int n = 0; n < NS; ++n) mx = fmaxf(mx, fmaxf(s[mi][n][2 * i], s[mi][n][2 * i + 1]));
        mx = fmaxf(mx, ja_shfl_xor(mx, 1));
        mx = fmaxf(mx, ja_shfl_xor(mx, 2));
        const float m_new = fmaxf(m[mi][i], mx);
        const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // no key seen yet: keep everything at 0
        const float alpha = ja_exp2(m[mi][i] - m_use);
        float rs = 0.0f;
#pragma unroll
        for (int n = 0; n < NS; ++n) {
#pragma unroll
          for (int e = 2 * i; e < 2 * i + 2; ++e) {
#if JA_MHA_FWD_MMA_FAST_EXP2
            s[mi][n][e] = ja_exp2_approx(s[mi][n][e] - m_use);
#else
            s[mi][n][e] = ja_exp2(s[mi][n][e] - m_use);
#endif
            rs += s[mi][n][e];
          }
        }
        l[mi][i] = l[mi][i] * alpha + rs;
        m[mi][i] = m_new;
#pragma unroll
        for (int n = 0; n < NO; ++n) {
          o[mi][n][2 * i] *= alpha;
          o[mi][n][2 * i + 1] *= alpha;
        }
      }

    mma::cp_async_wait<0>();
    __syncthreads();  // V tile is in v_s; every warp is done reading k_s
    // A tile some rows see only in part: a NaN/inf in V must not reach the rows whose P there is 0.
    const bool guard = need_mask && sanitize_tile<T, BC, D, LD, NT>(v_s, hdv, bad_s);
    if (kv0 + BC < kv_end) {
      const int nxt = kv0 + BC;
      cp_async_tile<T, BC, D, LD, NT>(k_s, k + int64_t(nxt) * k_stride, k_stride, kv_end - nxt < BC ? kv_end - nxt : BC,
                                      hd, vec);
      mma::cp_async_commit();
    }

    // O += P V: P (rounded to T) is the A operand straight from the S fragments.
#pragma unroll
    for (int kc = 0; kc < KC; ++kc) {
      uint32_t pa[MI][4];
#pragma unroll
      for (int mi = 0; mi < MI; ++mi) {
        pa[mi][0] = mma::pack2<T>(s[mi][2 * kc][0], s[mi][2 * kc][1]);
        pa[mi][1] = mma::pack2<T>(s[mi][2 * kc][2], s[mi][2 * kc][3]);
        pa[mi][2] = mma::pack2<T>(s[mi][2 * kc + 1][0], s[mi][2 * kc + 1][1]);
        pa[mi][3] = mma::pack2<T>(s[mi][2 * kc + 1][2], s[mi][2 * kc + 1][3]);
      }
#pragma unroll
      for (int n2 = 0; n2 < NO / 2; ++n2) {  // 16 head-dim columns per ldmatrix_x4_trans
        uint32_t vb[4];
        mma::ldmatrix_x4_trans(vb,
                               v_s + (kc * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + n2 * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int mi = 0; mi < MI; ++mi) {
          mma::mma_16816<T>(o[mi][2 * n2], pa[mi], vb);
          mma::mma_16816<T>(o[mi][2 * n2 + 1], pa[mi], vb + 2);
        }
      }
    }
    if (guard) {  // (block-uniform)
      if (!*marked_s) {  // the first time: clear the marks
        __syncthreads();  // every thread has read marked_s
        for (int i = threadIdx.x; i < BR * Tl::kMarkWords; i += NT) mark_s[i] = 0u;
        __syncthreads();
        if (threadIdx.x == 0) *marked_s = 1u;
      }
      mark_nonfinite<T, BR, BC, Tl::kMarkWords, NT>(bad_s, hdv, v + int64_t(kv0) * v_stride, v_stride, kv0, lo_s, hi_s,
                                                    mark_s);
    }
  }
  if (kv_begin >= kv_end) mma::cp_async_wait<0>();  // the Q copy (unused) must land before the block exits

  // Epilogue: full row sums over the quad, normalise, store rows < seq_q and columns < head_dim_v (the
  // values marked by mark_nonfinite, where there were any, become their infinities and NaNs).
  __syncthreads();  // every warp's marks are written
  const bool marked = *marked_s != 0u;
  T* out = static_cast<T*>(a.o) + (b * sq * hq + h) * hdv;
  float* lse = a.lse + (b * hq + h) * sq;
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float li = l[mi][i];
      li += ja_shfl_xor(li, 1);
      li += ja_shfl_xor(li, 2);
      const int64_t row = row0 + mi * 16 + i * 8;
      if (row >= sq) continue;
      const bool empty = li == 0.0f;  // no visible key: output 0, lse = +inf
      const float inv = empty ? 0.0f : 1.0f / li;
      T* orow = out + row * o_stride;
#pragma unroll
      for (int n = 0; n < NO; ++n) {
        const int col = n * 8 + 2 * t;
        float x = o[mi][n][2 * i] * inv, y = o[mi][n][2 * i + 1] * inv;
        if (marked) {
          const uint32_t w = mark_s[(row - q0) * Tl::kMarkWords + col / 16] >> (2 * (col % 16));
          x = marked_value(w & 3u, x), y = marked_value((w >> 2) & 3u, y);
        }
        store_pair<T>(orow, col, hdv, x, y);
      }
      if (t == 0) lse[row] = empty ? INFINITY : (m[mi][i] + ja_log2(li)) * kLn2;
    }
}

template <typename T, int D, bool CAUSAL>
const char* mha_fwd_mma_launch(const JaMhaFwdArgs& a, ja_stream_t stream) {
  using Tl = FwdMmaTiles<T, D>;
  if (const char* e = refuse_unhandled("mha_fwd", "mma.sync", a.p, kFwdMmaFeatures)) return e;
  const int64_t q_tiles = (a.p.seq_q + Tl::BR - 1) / Tl::BR;
  if (const char* e = check_grid("mha_fwd", q_tiles, a.p.heads_q, a.p.batch)) return e;
  const dim3 grid(unsigned(q_tiles), unsigned(a.p.heads_q), unsigned(a.p.batch));
  const bool terms = a.p.softcap > 0.0f || a.p.alibi != nullptr;
  return launch_with_smem(terms ? mha_fwd_mma_kernel<T, D, CAUSAL, true> : mha_fwd_mma_kernel<T, D, CAUSAL, false>,
                          grid, Tl::kThreads, Tl::kSmemBytes, stream, a, "mha_fwd");
}

}  // namespace mha_gpu
}  // namespace ja
#endif  // JA_HAS_WARP_MMA
