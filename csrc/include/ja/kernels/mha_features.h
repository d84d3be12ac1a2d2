// The per-element definitions of attention's features (ja/kernels/mha.h), written once for
// every backend: the CPU kernels (g++) and the GPU kernels (nvcc, hipcc) call these, so they
// agree on the mask, the score's terms and the dropout draw. jax_aiter/ops/_attn_dropout.py
// implements the same draw in jax.numpy (a test compares them bit for bit).
#pragma once
#include <cstdint>

#include "ja/kernels/mha.h"

#if defined(__CUDACC__) || defined(__HIPCC__)
#define JA_MHA_HD __host__ __device__ __forceinline__
#else
#define JA_MHA_HD inline __attribute__((always_inline))
#endif

namespace ja {

enum MhaMask : int32_t { kMaskNone = 0, kMaskCausal = 1, kMaskRows = 2 };

// The keys query row i of batch b sees, [lo, hi), and diag (the key aligned with i, ALiBi's origin).
struct MhaRow {
  int64_t lo, hi, diag;
};

JA_MHA_HD int64_t mha_clamp(int64_t x, int64_t lo, int64_t hi) { return x < lo ? lo : (x > hi ? hi : x); }

JA_MHA_HD MhaRow mha_row(const JaMhaProblem& p, int64_t b, int64_t i) {
  if (p.mask == kMaskRows) {
    const int32_t* r = p.rows + b * p.rows_batch_stride;
    return MhaRow{r[i], r[p.seq_q + i], r[2 * p.seq_q + i]};
  }
  const int64_t diag = i + p.seq_k - p.seq_q;
  const int64_t hi = p.mask == kMaskCausal ? mha_clamp(diag + 1, 0, p.seq_k) : p.seq_k;
  return MhaRow{0, hi, diag};
}

// The features beyond dense or bottom-right causal attention with head_dim_v == head_dim, as bits. A kernel
// states the ones it handles; mha_unhandled_feature names the first one a problem uses that the kernel does not
// handle (nullptr: none), so a kernel declines or refuses such a call and never ignores a feature silently.
enum MhaFeature : uint32_t {
  kMhaHeadDimV = 1u << 0,         // head_dim_v != head_dim
  kMhaRows = 1u << 1,             // mask == ROWS
  kMhaSoftcap = 1u << 2,          // softcap > 0
  kMhaAlibi = 1u << 3,            // alibi != null
  kMhaBias = 1u << 4,             // bias != null (and, in the backward, dbias)
  kMhaDropout = 1u << 5,          // dropout_p > 0
  kMhaDeterministic = 1u << 6,    // the backward's deterministic == 1
};

JA_MHA_HD const char* mha_unhandled_feature(const JaMhaProblem& p, uint32_t handled) {
  if (p.head_dim_v != p.head_dim && !(handled & kMhaHeadDimV)) return "head_dim_v != head_dim";
  if (p.mask == kMaskRows && !(handled & kMhaRows)) return "the ROWS mask (window, varlen, segments)";
  if (p.softcap != 0.0f && !(handled & kMhaSoftcap)) return "softcap";
  if (p.alibi != nullptr && !(handled & kMhaAlibi)) return "ALiBi";
  if (p.bias != nullptr && !(handled & kMhaBias)) return "bias";
  if (p.dropout_p != 0.0f && !(handled & kMhaDropout)) return "dropout";
  return nullptr;
}

JA_MHA_HD const char* mha_unhandled_feature(const JaMhaBwdArgs& a, uint32_t handled) {
  if (a.deterministic && !(handled & kMhaDeterministic)) return "deterministic";
  if (a.dbias != nullptr && !(handled & kMhaBias)) return "bias";
  return mha_unhandled_feature(a.p, handled);
}

// The query rows that see key j of batch b, [q_lo, q_hi) (the backward's tile skipping).
struct MhaCol {
  int64_t q_lo, q_hi;
};

JA_MHA_HD MhaCol mha_col(const JaMhaProblem& p, const int32_t* cols, int64_t cols_batch_stride, int64_t b, int64_t j) {
  if (p.mask == kMaskRows) {
    const int32_t* c = cols + b * cols_batch_stride;
    return MhaCol{c[j], c[p.seq_k + j]};
  }
  if (p.mask == kMaskCausal) return MhaCol{mha_clamp(j - (p.seq_k - p.seq_q), 0, p.seq_q), p.seq_q};
  return MhaCol{0, p.seq_q};
}

// ALiBi's term for query row i (diag) and key j: -slope * |diag - j|.
JA_MHA_HD float mha_alibi(float slope, int64_t diag, int64_t j) {
  const int64_t d = diag > j ? diag - j : j - diag;
  return -slope * float(d);
}

// --- dropout: Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11) ---
//
// The keep decision for (batch b, query head h, row i, key j), all global indices: the philox block
// of counter (j / 4, i, h, b) and key (seed[0], seed[1]) gives four words; word j % 4 is u, and the
// element is kept iff u >= threshold = floor(p * 2^32). A pure function of (seed, b, h, i, j), so the
// backward recomputes the forward's mask and every backend draws the same one.
struct MhaPhilox {
  uint32_t x[4];
};

JA_MHA_HD void mha_mulhilo(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  const uint64_t prod = uint64_t(a) * uint64_t(b);
  *hi = uint32_t(prod >> 32);
  *lo = uint32_t(prod);
}

JA_MHA_HD MhaPhilox mha_philox(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
    uint32_t hi0, lo0, hi1, lo1;
    mha_mulhilo(0xD2511F53u, c0, &hi0, &lo0);
    mha_mulhilo(0xCD9E8D57u, c2, &hi1, &lo1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0, c1 = n1, c2 = n2, c3 = n3;
  }
  return MhaPhilox{{c0, c1, c2, c3}};
}

// floor(p * 2^32) for p in [0, 1).
JA_MHA_HD uint32_t mha_dropout_threshold(float p) { return uint32_t(double(p) * 4294967296.0); }

// The philox block of (b, h, i) that holds the words of keys 4 * (j / 4) .. 4 * (j / 4) + 3 of this call;
// seed is JaMhaProblem::seed (its batch and head offsets turn the call's indices into global ones).
JA_MHA_HD MhaPhilox mha_dropout_block(const uint32_t* seed, int64_t b, int64_t h, int64_t i, int64_t j) {
  return mha_philox(uint32_t(j >> 2), uint32_t(i), uint32_t(h + seed[3]), uint32_t(b + seed[2]), seed[0], seed[1]);
}

// Whether (b, h, i, j) of this call is kept.
JA_MHA_HD bool mha_dropout_keep(const uint32_t* seed, uint32_t threshold, int64_t b, int64_t h, int64_t i, int64_t j) {
  return mha_dropout_block(seed, b, h, i, j).x[j & 3] >= threshold;
}

}  // namespace ja
