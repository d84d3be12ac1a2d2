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
// Conventions are the SIMT kernel's (mha_fwd_gpu.cuh): bottom-right causal
// alignment, key tiles above the diagonal skipped, rows with no visible key
// give output 0 and lse = +inf.
#pragma once
#include "ja/mma.h"
#include "mha/mha_gpu_common.cuh"

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
  static constexpr int kSmemBytes = kSmemElems * int(sizeof(T));
  static_assert(kSmemBytes <= 227 * 1024, "MHA forward (MMA) tiles exceed shared memory");
  static_assert(D % 16 == 0 && BC % 16 == 0, "tiles must be multiples of the 16x16 MMA shape");
};

// Copies rows [0, rows_valid) of a [ROWS][D] global tile to shared memory (row
// stride LD) with 16-byte cp.async (L2 prefetch size PF, see mma::cp_async_16);
// rows past rows_valid are zero-filled and not read.
template <typename T, int ROWS, int D, int LD, int NTHREADS, int PF = 0>
JA_DEVICE void cp_async_tile(T* smem, const T* g, int64_t stride, int rows_valid) {
  constexpr int kVec = 16 / int(sizeof(T));
  constexpr int kPerRow = D / kVec;
  static_assert(D % kVec == 0 && (ROWS * kPerRow) % NTHREADS == 0, "tile copy must split evenly over the threads");
#pragma unroll
  for (int it = 0; it < ROWS * kPerRow / NTHREADS; ++it) {
    const int idx = int(threadIdx.x) + it * NTHREADS;
    const int r = idx / kPerRow, c = (idx % kPerRow) * kVec;
    const bool ok = r < rows_valid;
    mma::cp_async_16<PF>(smem + r * LD + c, ok ? g + r * stride + c : g, ok);
  }
}

template <typename T, int D, bool CAUSAL>
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

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;
  // Causal: the longest rows (each head's last query tile) start first (grid_place).
  const auto [q0, h, b, sq, sk, hq, hkv, hk, q_stride, kv_stride, rows, s2] =
      fwd_block<D>(a, grid_place(CAUSAL, true), BR);
  const T* k = static_cast<const T*>(a.k) + (b * sk * hkv + hk) * D;
  const T* v = static_cast<const T*>(a.v) + (b * sk * hkv + hk) * D;
  const int wrow = warp * 16 * MI;  // this warp's first row in the tile

  // Q tile -> shared (-> A fragments in registers when QREG).
  uint32_t qa[QREG ? KD : 1][4];
  cp_async_tile<T, BR, D, LD, NT>(q_s, static_cast<const T*>(a.q) + ((b * sq + q0) * hq + h) * D, q_stride, rows);
  mma::cp_async_commit();
  if constexpr (QREG) {
    mma::cp_async_wait<0>();
    __syncthreads();
#pragma unroll
    for (int kd = 0; kd < KD; ++kd)
      mma::ldmatrix_x4(qa[kd], q_s + (wrow + (lane & 15)) * LD + kd * 16 + (lane >> 4) * 8);
    __syncthreads();  // every warp holds its Q fragments before K overwrites the staging area
  }

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

  int64_t kv_end = sk;
  if (CAUSAL) {
    kv_end = q0 + rows + sk - sq;
    kv_end = kv_end < 0 ? 0 : (kv_end > sk ? sk : kv_end);
  }
  if (kv_end > 0) {
    cp_async_tile<T, BC, D, LD, NT>(k_s, k, kv_stride, int(sk < BC ? sk : BC));
    mma::cp_async_commit();
  }
  for (int64_t kv0 = 0; kv0 < kv_end; kv0 += BC) {
    const int nk = int(sk - kv0 < BC ? sk - kv0 : BC);
    mma::cp_async_wait<0>();
    __syncthreads();  // K tile (and Q) in shared memory; every warp is done reading v_s (previous P V)
    cp_async_tile<T, BC, D, LD, NT>(v_s, v + kv0 * kv_stride, kv_stride, nk);
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
        mma::ldmatrix_x4(kb, k_s + (n2 * 16 + (lane & 7) + ((lane >> 4) << 3)) * LD + kd * 16 +
                                 ((lane >> 3) & 1) * 8);
#pragma unroll
        for (int mi = 0; mi < MI; ++mi) {
          mma::mma_16816<T>(s[mi][2 * n2], qf[mi], kb);
          mma::mma_16816<T>(s[mi][2 * n2 + 1], qf[mi], kb + 2);
        }
      }
    }

    // Scale into the log2 domain; mask keys past seq_k and (causal) above the diagonal.
    const bool need_mask = kv0 + BC > sk || (CAUSAL && kv0 + BC - 1 > q0 + sk - sq);
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
      for (int n = 0; n < NS; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float x = s[mi][n][e] * s2;
          if (need_mask) {
            const int64_t key = kv0 + n * 8 + 2 * t + (e & 1);
            const int64_t row = row0 + mi * 16 + (e >> 1) * 8;
            if (key >= sk || (CAUSAL && key > row + sk - sq)) x = -INFINITY;
          }
          s[mi][n][e] = x;
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
    if (kv0 + BC < kv_end) {
      const int64_t nxt = kv0 + BC;
      cp_async_tile<T, BC, D, LD, NT>(k_s, k + nxt * kv_stride, kv_stride, int(sk - nxt < BC ? sk - nxt : BC));
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
        mma::ldmatrix_x4_trans(vb, v_s + (kc * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + n2 * 16 +
                                       (lane >> 4) * 8);
#pragma unroll
        for (int mi = 0; mi < MI; ++mi) {
          mma::mma_16816<T>(o[mi][2 * n2], pa[mi], vb);
          mma::mma_16816<T>(o[mi][2 * n2 + 1], pa[mi], vb + 2);
        }
      }
    }
  }
  if (kv_end <= 0) mma::cp_async_wait<0>();  // the Q copy (unused) must land before the block exits

  // Epilogue: full row sums over the quad, normalise, store rows < seq_q.
  T* out = static_cast<T*>(a.o) + (b * sq * hq + h) * D;
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
      T* orow = out + row * q_stride;
#pragma unroll
      for (int n = 0; n < NO; ++n) {
        const uint32_t pk = mma::pack2<T>(o[mi][n][2 * i] * inv, o[mi][n][2 * i + 1] * inv);
        *reinterpret_cast<uint32_t*>(orow + n * 8 + 2 * t) = pk;
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
  return launch_with_smem(mha_fwd_mma_kernel<T, D, CAUSAL>, grid, Tl::kThreads, Tl::kSmemBytes, stream, a,
                          "mha_fwd");
}

}  // namespace mha_gpu
}  // namespace ja
#endif  // JA_HAS_WARP_MMA
