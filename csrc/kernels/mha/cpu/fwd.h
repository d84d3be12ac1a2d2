// Flash-attention forward on the CPU: tiled online softmax, float32 throughout, every feature of
// ja/kernels/mha.h at run time (the reference path).
//
// One task is one (batch, query head, tile of Br query rows); tasks run in parallel. A task streams
// the key/value tiles of Bc rows that some row of its tile sees ([lo of its first row, hi of its last
// row) for ROWS masks, so tiles outside a window or a document are never loaded): S = Q K^T (pre-scaled
// by scale * log2 e), the score's terms (softcap, ALiBi, bias) and the mask, running row max m and
// row sum l, O rescaled by exp2(m_old - m_new), then with dropout P * keep / (1 - p), O += P V. Only
// Br x Bc scores exist at any time. Each key tile's P V is a fresh product added to O by a compensated sum
// (kahan_add), as is its row sum to l: O += P V accumulated straight into O would stop growing once O is 2^24
// times a term (a uniform softmax over 33.5M keys gave 0.47 for 0.5).
//
// D is the instance's padded head dim: head_dim and head_dim_v (each <= D) are read at run time and
// the tiles are zero-padded on load. A key that a row does not see never reaches the row's output:
// its score is -inf, and where a tile's V holds NaN or Inf and some row does not see every key of the
// tile, O += P V runs over each row's visible keys only (0 * NaN would otherwise spread it).
#pragma once
#include <limits>
#include <memory>

#include "ja/api.h"
#include "ja/kernels/mha.h"
#include "ja/kernels/mha_features.h"
#include "mha/cpu/common.h"

namespace ja {

template <typename T, int D>
struct MhaFwdCpu {
  static constexpr int Br = 64;  // query rows per tile
  static constexpr int Bc = 64;  // key rows per tile

  struct Scratch {
    float q[Br * D];   // query tile, times ScoreTerms::qk_mul
    float kt[D * Bc];  // key tile, transposed
    float v[Bc * D];   // value tile
    float s[Br * Bc];  // scores, then probabilities
    float pv[Br * D];  // this key tile's P V
    float o[Br * D];   // unnormalised output, and its compensation
    float oc[Br * D];
    float m[Br];       // running max (log2 domain)
    float l[Br];       // running sum, and its compensation
    float lc[Br];
    mha_cpu::TileRows<Br> rows;
  };

  template <typename V>
  JA_CPU_INLINE static void tile(const JaMhaFwdArgs& a, int64_t b, int64_t h, int64_t q0, Scratch& w) {
    using namespace mha_cpu;
    constexpr int W = Lanes<V>::n;
    const JaMhaProblem& p = a.p;
    const int64_t sq = p.seq_q, sk = p.seq_k, hq = p.heads_q, hkv = p.heads_kv;
    const int dq = int(p.head_dim), dv = int(p.head_dim_v);
    const int64_t hk = h / (hq / hkv);
    const int rows = int(std::min<int64_t>(Br, sq - q0));
    const int64_t q_stride = hq * dq, o_stride = hq * dv, k_stride = hkv * dq, v_stride = hkv * dv;
    const T* q = static_cast<const T*>(a.q) + ((b * sq + q0) * hq + h) * dq;
    const T* k = static_cast<const T*>(a.k) + (b * sk * hkv + hk) * dq;
    const T* v = static_cast<const T*>(a.v) + (b * sk * hkv + hk) * dv;
    const ScoreTerms terms = ScoreTerms::of(p, b, h);
    const bool dropout = p.dropout_p > 0.0f;
    const uint32_t threshold = dropout ? mha_dropout_threshold(p.dropout_p) : 0;
    const float keep_scale = dropout ? 1.0f / (1.0f - p.dropout_p) : 1.0f;

    load_rows<Br, D>(w.q, q, q_stride, rows, dq, ScoreTerms::qk_mul(p));
    std::fill(w.o, w.o + Br * D, 0.0f);
    std::fill(w.oc, w.oc + Br * D, 0.0f);
    std::fill(w.m, w.m + Br, -kInf);
    std::fill(w.l, w.l + Br, 0.0f);
    std::fill(w.lc, w.lc + Br, 0.0f);
    w.rows.init(p, b, q0, rows);

    // Keys outside [kv_lo, kv_hi) are seen by no row of the tile: never loaded.
    for (int64_t kv0 = w.rows.kv_lo; kv0 < w.rows.kv_hi; kv0 += Bc) {
      const int nk = int(std::min<int64_t>(Bc, w.rows.kv_hi - kv0));
      load_rows_transposed<Bc, D>(w.kt, k + kv0 * k_stride, k_stride, nk, dq);
      load_rows<Bc, D>(w.v, v + kv0 * v_stride, v_stride, nk, dv, 1.0f);
      gemm<Br, Bc, D, false, V>(w.s, Bc, w.q, D, w.kt, Bc);
      for (int r = 0; r < Br; ++r) {
        float* s = w.s + r * Bc;
        int lo = 0, hi = 0;
        if (r < rows) w.rows.span(r, kv0, nk, &lo, &hi);
        if (lo >= hi) {  // nothing visible in this tile: the row's state is unchanged
          std::fill(s, s + Bc, 0.0f);
          continue;
        }
        score_row<Bc, V>(s, nullptr, terms, q0 + r, w.rows.diag[r], kv0, lo, hi);
        float m_new = std::max(w.m[r], row_max<Bc, V>(s));  // (row_max passes over NaN)
        if (m_new == -kInf) {
          if (std::none_of(s + lo, s + hi, [](float x) { return std::isnan(x); })) {
            std::fill(s, s + Bc, 0.0f);  // every visible score is -inf (a -inf bias): as if nothing were visible
            continue;
          }
          m_new = std::numeric_limits<float>::quiet_NaN();  // NaN scores only (NaN in q or k): the row is NaN
        }
        const float alpha = exp2_scalar<V>(w.m[r] - m_new);  // 0 while m was -inf
        const V m_v = splat<V>(m_new);
        V sum = {};
        for (int j = 0; j < Bc; j += W) {
          const V e = exp2_v<V>(vload<V>(s + j) - m_v);
          vstore(s + j, e);
          sum += e;
        }
        w.l[r] *= alpha, w.lc[r] *= alpha;
        kahan_add(w.l[r], w.lc[r], hsum(sum));  // the softmax's sum: before dropout
        w.m[r] = m_new;
        if (dropout) {
          float keep[Bc];
          dropout_row(keep, p, threshold, keep_scale, b, h, q0 + r, kv0, lo, hi);
          for (int j = lo; j < hi; ++j) s[j] *= keep[j];
        }
        const V alpha_v = splat<V>(alpha);
        float *o = w.o + r * D, *oc = w.oc + r * D;
        for (int c = 0; c < D; c += W) {
          vstore(o + c, vload<V>(o + c) * alpha_v);
          vstore(oc + c, vload<V>(oc + c) * alpha_v);
        }
      }
      if (!w.rows.full(kv0, nk) && !all_finite<Bc * D, V>(w.v)) {
        // A non-finite value in V and a row that does not see all of the tile: each row sums its
        // visible keys only.
        std::fill(w.pv, w.pv + Br * D, 0.0f);
        for (int r = 0; r < rows; ++r) {
          if (w.m[r] == -kInf) continue;  // no visible score above -inf yet: nothing to add
          int lo, hi;
          w.rows.span(r, kv0, nk, &lo, &hi);
          float* o = w.pv + r * D;
          for (int j = lo; j < hi; ++j) {
            const float pj = w.s[r * Bc + j];
            const float* vj = w.v + j * D;
            for (int c = 0; c < D; ++c) o[c] += pj * vj[c];
          }
        }
      } else {
        gemm<Br, D, Bc, false, V>(w.pv, D, w.s, Bc, w.v, D);
      }
      kahan_add<Br * D, V>(w.o, w.oc, w.pv);
    }

    T* o = static_cast<T*>(a.o) + ((b * sq + q0) * hq + h) * dv;
    float* lse = a.lse + (b * hq + h) * sq + q0;
    for (int r = 0; r < rows; ++r) {
      // A row that saw no key: output 0 and lse = +inf (zero gradients later).
      const bool empty = w.l[r] == 0.0f;
      store_row(o + r * o_stride, w.o + r * D, dv, empty ? 0.0f : 1.0f / w.l[r]);
      lse[r] = empty ? kInf : (w.m[r] + std::log2(w.l[r])) * kLn2;
    }
  }

  template <typename V>
  JA_CPU_INLINE static void tasks(const JaMhaFwdArgs& a, int64_t t0, int64_t t1) {
    const int64_t q_tiles = (a.p.seq_q + Br - 1) / Br;
    auto w = std::make_unique<Scratch>();
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t qt = t % q_tiles, bh = t / q_tiles;
      tile<V>(a, bh / a.p.heads_q, bh % a.p.heads_q, qt * Br, *w);
    }
  }

  static const char* run(const JaMhaFwdArgs& a) {
    mha_cpu::run_tasks<MhaFwdCpu>(a, a.p.batch * a.p.heads_q * ((a.p.seq_q + Br - 1) / Br));
    return nullptr;
  }
};

}  // namespace ja
