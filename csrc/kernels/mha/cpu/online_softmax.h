// The online softmax of a tile of query rows over one key tile at a time: what the dense forward (cpu/fwd.h)
// and the paged kernel (cpu/paged.h) share. They differ in where the rows, keys and values come from (a dense
// batch, or a page table) and load the tiles themselves; this holds the rest.
//
// For each key tile: S = Q K^T (Q pre-scaled by ScoreTerms::qk_mul), the score's terms (softcap, ALiBi, bias) and
// the mask, the running row max m and row sum l, O rescaled by exp2(m_old - m_new), then (the caller's dropout)
// P * keep / (1 - p), and O += P V. Only Br x Bc scores exist at any time. Each key tile's P V is a fresh product
// added to O by a compensated sum (kahan_add), as is its row sum to l: O += P V accumulated straight into O would
// stop growing once O is 2^24 times a term (a uniform softmax over 33.5M keys gave 0.47 for 0.5).
//
// The products run over the tile's rows in blocks of 16 (the rows past the last block that holds a row are not
// multiplied): a tile of a few rows (a decode step's query heads) costs a few rows' work, and a full tile the same
// arithmetic in the same order as one product of Br rows. A key that a row does not see never reaches the row's
// output: its score is -inf, and where the key tile's V holds NaN or Inf and some row does not see every key of
// the tile, O += P V runs over each row's visible keys only (0 * NaN would otherwise spread it).
#pragma once
#include <algorithm>
#include <cmath>
#include <limits>

#include "mha/cpu/common.h"

namespace ja {
namespace mha_cpu {

template <int Br, int Bc, int D>
struct OnlineSoftmax {
  static constexpr int kBlock = 16;  // rows a product takes at a time
  static_assert(Br % kBlock == 0, "Br must be a multiple of the product's row block");

  float s[Br * Bc];   // scores, then probabilities
  float pv[Br * D];   // this key tile's P V
  float o[Br * D];    // unnormalised output, and its compensation
  float oc[Br * D];
  float m[Br];        // running max (log2 domain)
  float l[Br];        // running sum, and its compensation
  float lc[Br];
  TileRows<Br> rows;  // the tile's rows and the keys each sees (the caller fills it)

  // Before the first key tile.
  JA_CPU_INLINE void reset() {
    std::fill(o, o + Br * D, 0.0f);
    std::fill(oc, oc + Br * D, 0.0f);
    std::fill(m, m + Br, -kInf);
    std::fill(l, l + Br, 0.0f);
    std::fill(lc, lc + Br, 0.0f);
  }

  // Adds key tile [kv0, kv0 + nk): q [Br][D] the query rows (times ScoreTerms::qk_mul), kt [D][Bc] the keys
  // transposed, v [Bc][D] the values, each zero-padded. Row r is query index q0 + r of `terms` (its bias row).
  // keep(r, lo, hi, p) scales row r's probabilities p[lo, hi) by its dropout (a no-op without dropout).
  template <typename V, typename Keep>
  JA_CPU_INLINE void add(const float* __restrict q, const float* __restrict kt, const float* __restrict v, int64_t kv0,
                         int nk, int64_t q0, const ScoreTerms& terms, Keep&& keep) {
    constexpr int W = Lanes<V>::n;
    const int n = rows.n;
    const int mrows = (n + kBlock - 1) / kBlock * kBlock;
    for (int i = 0; i < mrows; i += kBlock) gemm<kBlock, Bc, D, false, V>(s + i * Bc, Bc, q + i * D, D, kt, Bc);
    for (int r = 0; r < mrows; ++r) {
      float* sr = s + r * Bc;
      int lo = 0, hi = 0;
      if (r < n) rows.span(r, kv0, nk, &lo, &hi);
      if (lo >= hi) {  // nothing visible in this tile: the row's state is unchanged
        std::fill(sr, sr + Bc, 0.0f);
        continue;
      }
      score_row<Bc, V>(sr, nullptr, terms, q0 + r, rows.diag[r], kv0, lo, hi);
      float m_new = std::max(m[r], row_max<Bc, V>(sr));  // (row_max passes over NaN)
      if (m_new == -kInf) {
        if (std::none_of(sr + lo, sr + hi, [](float x) { return std::isnan(x); })) {
          std::fill(sr, sr + Bc, 0.0f);  // every visible score is -inf (a -inf bias): as if nothing were visible
          continue;
        }
        m_new = std::numeric_limits<float>::quiet_NaN();  // NaN scores only (NaN in q or k): the row is NaN
      }
      const float alpha = exp2_scalar<V>(m[r] - m_new);  // 0 while m was -inf
      const V m_v = splat<V>(m_new);
      V sum = {};
      for (int j = 0; j < Bc; j += W) {
        const V e = exp2_v<V>(vload<V>(sr + j) - m_v);
        vstore(sr + j, e);
        sum += e;
      }
      l[r] *= alpha, lc[r] *= alpha;
      kahan_add(l[r], lc[r], hsum(sum));  // the softmax's sum: before dropout
      m[r] = m_new;
      keep(r, lo, hi, sr);
      const V alpha_v = splat<V>(alpha);
      float *orow = o + r * D, *ocrow = oc + r * D;
      for (int c = 0; c < D; c += W) {
        vstore(orow + c, vload<V>(orow + c) * alpha_v);
        vstore(ocrow + c, vload<V>(ocrow + c) * alpha_v);
      }
    }
    if (!rows.full(kv0, nk) && !all_finite<Bc * D, V>(v)) {
      // A non-finite value in V and a row that does not see all of the tile: each row sums its visible keys only.
      std::fill(pv, pv + mrows * D, 0.0f);
      for (int r = 0; r < n; ++r) {
        if (m[r] == -kInf) continue;  // no visible score above -inf yet: nothing to add
        int lo, hi;
        rows.span(r, kv0, nk, &lo, &hi);
        float* prow = pv + r * D;
        for (int j = lo; j < hi; ++j) {
          const float pj = s[r * Bc + j];
          const float* vj = v + j * D;
          for (int c = 0; c < D; ++c) prow[c] += pj * vj[c];
        }
      }
    } else {
      for (int i = 0; i < mrows; i += kBlock) gemm<kBlock, D, Bc, false, V>(pv + i * D, D, s + i * Bc, Bc, v, D);
    }
    for (int i = 0; i < mrows; i += kBlock) kahan_add<kBlock * D, V>(o + i * D, oc + i * D, pv + i * D);
  }

  // Row r saw no key: its output is 0 and its lse +inf (zero gradients later).
  JA_CPU_INLINE bool empty(int r) const { return l[r] == 0.0f; }
  // What row r's unnormalised output is multiplied by when stored (1 / l; 0 for an empty row).
  JA_CPU_INLINE float out_mul(int r) const { return empty(r) ? 0.0f : 1.0f / l[r]; }
  // Row r's natural-log log-sum-exp (+inf for an empty row).
  JA_CPU_INLINE float lse(int r) const { return empty(r) ? kInf : (m[r] + std::log2(l[r])) * kLn2; }
};

// The keep callback of a call without dropout.
struct NoDropout {
  JA_CPU_INLINE void operator()(int, int, int, float*) const {}
};

}  // namespace mha_cpu
}  // namespace ja
