// Flash-attention backward on the CPU, float32 throughout, every feature of ja/kernels/mha.h at run
// time (the reference path), deterministic.
//
// One task is one (batch, kv head): it owns dK and dV of that head and dQ of the query heads of its
// group, so GQA needs no atomics and the summation order is fixed (the same bits run after run). The
// task first computes delta = rowsum(dP * P) for its query heads, then for each key tile (Bc rows)
// walks the query tiles (Br rows) of every head in the group that see a key of it (cols for ROWS
// masks), recomputing P = exp(s - lse) from the forward's lse with the score's terms:
//   dV += Pd^T dO,  dPd = dO V^T,  dP = dPd * keep / (1 - p),  dS = P * (dP - delta),
//   dbias = dS,  dS' = dS * (1 - tanh^2) with a softcap,
//   dK += dS'^T Q,  dQ += dS' K * scale  (dQ in the float32 dq_accum workspace),
// where Pd = P * keep / (1 - p) is the forward's dropped-out P (keep: mha_dropout_keep, the forward's
// draw), then scales dK by the softmax scale and rounds dQ, dK, dV once. Each (key tile, query tile) pair's
// dK and dV are fresh products added to the key tile's accumulators by compensated sums (kahan_add), so a long
// query sequence loses nothing to their magnitude; dQ gets one such product per key tile.
//
// delta: rowsum(dP * P) equals rowsum(dO * O) (with dropout too: O = Pd V). From a float32 output the
// kernel takes dO . O; a bfloat16/float16 output is rounded, and delta's rounding error then dominates
// dS = P * (dP - delta) where the softmax is peaked (dP_ij ~ delta for the one key that matters), so
// for 16-bit dtypes delta is summed from the recomputed float32 P and dP instead (one more pass of the
// products Q K^T and dO V^T).
//
// A key that a row does not see never reaches the row's gradients, nor a row's values the gradients of
// a key it does not see: P and dS are 0 there by assignment, and where a tile holds NaN or Inf in Q,
// dO or K and some row does not see every key of the tile, the three products sum visible pairs only.
#pragma once
#include <memory>
#include <type_traits>

#include "ja/api.h"
#include "ja/kernels/mha.h"
#include "ja/kernels/mha_features.h"
#include "mha/cpu/common.h"

namespace ja {

template <typename T, int D>
struct MhaBwdCpu {
  static constexpr int Br = 32;  // query rows per tile
  static constexpr int Bc = 64;  // key rows per tile
  // delta from the recomputed float32 P and dP (16-bit outputs), else rowsum(dO * O).
  static constexpr bool kDeltaFromP = !std::is_same<T, float>::value;

  struct Scratch {
    float k[Bc * D], kt[D * Bc], vt[D * Bc];  // key tile, and key/value tiles transposed
    float q[Br * D], dout[Br * D];
    float p[Br * Bc], ds[Br * Bc];            // scores -> P -> Pd; dO V^T -> dS
    float dtanh[Br * Bc];                     // softcap: 1 - tanh^2 of each score
    float keep[Bc];                           // dropout: keep-scale of one row's keys
    float pt[Bc * Br], dst[Bc * Br];          // their transposes
    float dq[Br * D];                         // this pair's dQ contribution
    float dkp[Bc * D], dvp[Bc * D];           // this pair's dK and dV contributions
    float dk[Bc * D], dv[Bc * D];             // accumulators of the key tile, and their compensations
    float dkc[Bc * D], dvc[Bc * D];
    float lse2[Br], delta[Br];
    mha_cpu::TileRows<Br> rows;
  };

  // What one (batch, kv head) task reads.
  struct Head {
    const JaMhaBwdArgs& a;
    int64_t b, hk, group;
    int dq, dv;  // head_dim, head_dim_v
    int64_t q_stride, o_stride, k_stride, v_stride;
    bool dropout;
    uint32_t threshold;
    float keep_scale, qk_mul;

    const T* row(const void* base, int64_t i, int64_t h, int dim) const {
      return static_cast<const T*>(base) + ((b * a.p.seq_q + i) * a.p.heads_q + h) * dim;
    }
    const T* key(const void* base, int64_t j, int dim) const {
      return static_cast<const T*>(base) + ((b * a.p.seq_k + j) * a.p.heads_kv + hk) * dim;
    }
  };

  // Row r of the tile: P (undropped) into p from its scores q . k (in p on entry), the columns [lo, hi)
  // it sees; the softcap's derivative into dtanh. Masked columns hold 0.
  template <typename V>
  JA_CPU_INLINE static void probs_row(const Head& c, const mha_cpu::ScoreTerms& terms, Scratch& w, int r, int64_t i,
                                      int64_t kv0, int lo, int hi) {
    using namespace mha_cpu;
    constexpr int W = Lanes<V>::n;
    float* p = w.p + r * Bc;
    const V mul = splat<V>(c.qk_mul);
    for (int j = 0; j < Bc; j += W) vstore(p + j, vload<V>(p + j) * mul);
    score_row<Bc, V>(p, terms.cap2 != 0.0f ? w.dtanh + r * Bc : nullptr, terms, i, w.rows.diag[r], kv0, lo, hi);
    const V l2 = splat<V>(w.lse2[r]);
    for (int j = 0; j < Bc; j += W) vstore(p + j, exp2_v<V>(vload<V>(p + j) - l2));  // lse = +inf gives 0
    for (int j = 0; j < lo; ++j) p[j] = 0.0f;  // exp2(-inf - lse) is NaN where lse is (a row that saw a NaN)
    for (int j = hi; j < Bc; ++j) p[j] = 0.0f;
  }

  // Loads the query tile [q0, q0 + rows) of head h: q, dout, lse (log2 domain) and the mask rows.
  JA_CPU_INLINE static void load_queries(const Head& c, Scratch& w, int64_t h, int64_t q0, int rows) {
    using namespace mha_cpu;
    const JaMhaProblem& p = c.a.p;
    load_rows<Br, D>(w.q, c.row(c.a.q, q0, h, c.dq), c.q_stride, rows, c.dq, 1.0f);
    load_rows<Br, D>(w.dout, c.row(c.a.dout, q0, h, c.dv), c.o_stride, rows, c.dv, 1.0f);
    const float* lse = c.a.lse + (c.b * p.heads_q + h) * p.seq_q + q0;
    for (int r = 0; r < Br; ++r) w.lse2[r] = r < rows ? lse[r] * kLog2e : kInf;
  }

  // delta = rowsum(dP * P) of head h's query tile at q0, summed in float32 over the keys each row sees.
  template <typename V>
  JA_CPU_INLINE static void delta_tile(const Head& c, Scratch& w, int64_t h, int64_t q0) {
    using namespace mha_cpu;
    const JaMhaProblem& p = c.a.p;
    const int rows = int(std::min<int64_t>(Br, p.seq_q - q0));
    load_queries(c, w, h, q0, rows);
    w.rows.init(p, c.b, q0, rows);
    const ScoreTerms terms = ScoreTerms::of(p, c.b, h);
    float acc[Br] = {}, comp[Br] = {};
    for (int64_t kv0 = w.rows.kv_lo; kv0 < w.rows.kv_hi; kv0 += Bc) {
      const int nk = int(std::min<int64_t>(Bc, w.rows.kv_hi - kv0));
      load_rows_transposed<Bc, D>(w.kt, c.key(c.a.k, kv0, c.dq), c.k_stride, nk, c.dq);
      load_rows_transposed<Bc, D>(w.vt, c.key(c.a.v, kv0, c.dv), c.v_stride, nk, c.dv);
      gemm<Br, Bc, D, false, V>(w.p, Bc, w.q, D, w.kt, Bc);
      gemm<Br, Bc, D, false, V>(w.ds, Bc, w.dout, D, w.vt, Bc);
      for (int r = 0; r < rows; ++r) {
        int lo, hi;
        w.rows.span(r, kv0, nk, &lo, &hi);
        if (lo >= hi) continue;
        probs_row<V>(c, terms, w, r, q0 + r, kv0, lo, hi);
        const float* pr = w.p + r * Bc;
        const float* dp = w.ds + r * Bc;
        if (c.dropout) dropout_row(w.keep, p, c.threshold, c.keep_scale, c.b, h, q0 + r, kv0, lo, hi);
        float sum = 0.0f;
        for (int j = lo; j < hi; ++j) sum += pr[j] * dp[j] * (c.dropout ? w.keep[j] : 1.0f);
        kahan_add(acc[r], comp[r], sum);
      }
    }
    float* delta = c.a.delta + (c.b * p.heads_q + h) * p.seq_q + q0;
    for (int r = 0; r < rows; ++r) delta[r] = acc[r];
  }

  // One (key tile, query tile of head h) pair: adds to dK and dV of the key tile and to dQ of the rows.
  template <typename V>
  JA_CPU_INLINE static void pair(const Head& c, Scratch& w, int64_t h, int64_t kv0, int nk, int64_t q0, int rows,
                                 bool k_finite) {
    using namespace mha_cpu;
    const JaMhaProblem& p = c.a.p;
    w.rows.init(p, c.b, q0, rows);
    if (!w.rows.any(kv0, nk)) return;
    load_queries(c, w, h, q0, rows);
    const float* delta = c.a.delta + (c.b * p.heads_q + h) * p.seq_q + q0;
    for (int r = 0; r < Br; ++r) w.delta[r] = r < rows ? delta[r] : 0.0f;
    const ScoreTerms terms = ScoreTerms::of(p, c.b, h);
    gemm<Br, Bc, D, false, V>(w.p, Bc, w.q, D, w.kt, Bc);
    gemm<Br, Bc, D, false, V>(w.ds, Bc, w.dout, D, w.vt, Bc);
    float* dbias = c.a.dbias ? c.a.dbias + ((c.b * p.heads_q + h) * p.seq_q + q0) * p.seq_k + kv0 : nullptr;
    for (int r = 0; r < Br; ++r) {
      float* pr = w.p + r * Bc;
      float* ds = w.ds + r * Bc;
      int lo = 0, hi = 0;
      if (r < rows) w.rows.span(r, kv0, nk, &lo, &hi);
      if (lo >= hi) {
        std::fill(pr, pr + Bc, 0.0f);
        std::fill(ds, ds + Bc, 0.0f);
      } else {
        probs_row<V>(c, terms, w, r, q0 + r, kv0, lo, hi);
        if (c.dropout) dropout_row(w.keep, p, c.threshold, c.keep_scale, c.b, h, q0 + r, kv0, lo, hi);
        const float dr = w.delta[r];
        for (int j = 0; j < lo; ++j) ds[j] = 0.0f;
        for (int j = lo; j < hi; ++j) {
          const float m = c.dropout ? w.keep[j] : 1.0f;
          ds[j] = pr[j] * (ds[j] * m - dr);  // dS, the gradient of the score s
          pr[j] *= m;                        // Pd, what the forward multiplied V by
        }
        for (int j = hi; j < Bc; ++j) ds[j] = 0.0f;
      }
      if (dbias && r < rows) std::copy(ds, ds + nk, dbias + r * p.seq_k);
      if (terms.cap2 != 0.0f)
        for (int j = lo; j < hi; ++j) ds[j] *= w.dtanh[r * Bc + j];
    }
    if (w.rows.full(kv0, nk) || (k_finite && all_finite<Br * D, V>(w.q) && all_finite<Br * D, V>(w.dout))) {
      transpose<Br, Bc>(w.pt, w.p);
      transpose<Br, Bc>(w.dst, w.ds);
      gemm<Bc, D, Br, false, V>(w.dvp, D, w.pt, Br, w.dout, D);
      gemm<Bc, D, Br, false, V>(w.dkp, D, w.dst, Br, w.q, D);
      gemm<Br, D, Bc, false, V>(w.dq, D, w.ds, Bc, w.k, D);
    } else {
      // NaN or Inf in Q, dO or K where some row does not see the whole tile: sum visible pairs only.
      std::fill(w.dq, w.dq + Br * D, 0.0f);
      std::fill(w.dkp, w.dkp + Bc * D, 0.0f);
      std::fill(w.dvp, w.dvp + Bc * D, 0.0f);
      for (int r = 0; r < rows; ++r) {
        int lo, hi;
        w.rows.span(r, kv0, nk, &lo, &hi);
        const float *qr = w.q + r * D, *dor = w.dout + r * D;
        float* dqr = w.dq + r * D;
        for (int j = lo; j < hi; ++j) {
          const float pj = w.p[r * Bc + j], dsj = w.ds[r * Bc + j];
          float *dkj = w.dkp + j * D, *dvj = w.dvp + j * D;
          const float* kj = w.k + j * D;
          for (int x = 0; x < D; ++x) dvj[x] += pj * dor[x], dkj[x] += dsj * qr[x], dqr[x] += dsj * kj[x];
        }
      }
    }
    kahan_add<Bc * D, V>(w.dk, w.dkc, w.dkp);
    kahan_add<Bc * D, V>(w.dv, w.dvc, w.dvp);
    for (int r = 0; r < rows; ++r) {
      float* acc = c.a.dq_accum + ((c.b * p.seq_q + q0 + r) * p.heads_q + h) * c.dq;
      const float* src = w.dq + r * D;
      for (int x = 0; x < c.dq; ++x) acc[x] += src[x] * p.scale;
    }
  }

  template <typename V>
  JA_CPU_INLINE static void head(const JaMhaBwdArgs& a, int64_t b, int64_t hk, Scratch& w) {
    using namespace mha_cpu;
    const JaMhaProblem& p = a.p;
    const int64_t sq = p.seq_q, sk = p.seq_k, hq = p.heads_q, hkv = p.heads_kv;
    const int dq = int(p.head_dim), dv = int(p.head_dim_v);
    const bool dropout = p.dropout_p > 0.0f;
    const Head c{a,
                 b,
                 hk,
                 hq / hkv,
                 dq,
                 dv,
                 hq * dq,
                 hq * dv,
                 hkv * dq,
                 hkv * dv,
                 dropout,
                 dropout ? mha_dropout_threshold(p.dropout_p) : 0u,
                 dropout ? 1.0f / (1.0f - p.dropout_p) : 1.0f,
                 ScoreTerms::qk_mul(p)};
    const int64_t h0 = hk * c.group, h1 = h0 + c.group;

    for (int64_t h = h0; h < h1; ++h) {
      for (int64_t i = 0; i < sq; ++i) {
        float* acc = a.dq_accum + ((b * sq + i) * hq + h) * dq;
        std::fill(acc, acc + dq, 0.0f);
      }
      if (a.dbias) std::fill(a.dbias + (b * hq + h) * sq * sk, a.dbias + (b * hq + h + 1) * sq * sk, 0.0f);
      if constexpr (kDeltaFromP) {
        for (int64_t q0 = 0; q0 < sq; q0 += Br) delta_tile<V>(c, w, h, q0);
      } else {
        float* delta = a.delta + (b * hq + h) * sq;
        for (int64_t i = 0; i < sq; ++i) delta[i] = dot_f32(c.row(a.dout, i, h, dv), c.row(a.o, i, h, dv), dv);
      }
    }

    for (int64_t kv0 = 0; kv0 < sk; kv0 += Bc) {
      const int nk = int(std::min<int64_t>(Bc, sk - kv0));
      load_rows<Bc, D>(w.k, c.key(a.k, kv0, dq), c.k_stride, nk, dq, 1.0f);
      load_rows_transposed<Bc, D>(w.kt, c.key(a.k, kv0, dq), c.k_stride, nk, dq);
      load_rows_transposed<Bc, D>(w.vt, c.key(a.v, kv0, dv), c.v_stride, nk, dv);
      const bool k_finite = all_finite<Bc * D, V>(w.k);
      for (float* x : {w.dk, w.dv, w.dkc, w.dvc}) std::fill(x, x + Bc * D, 0.0f);
      // The query rows that see a key of the tile: [q_lo of its first key, q_hi of its last) (cols).
      int64_t qa = sq, qb = 0;
      for (int j = 0; j < nk; ++j) {
        const MhaCol col = mha_col(p, a.cols, a.cols_batch_stride, b, kv0 + j);
        const int64_t lo = mha_clamp(col.q_lo, 0, sq), hi = mha_clamp(col.q_hi, lo, sq);
        if (lo < hi) qa = std::min(qa, lo), qb = std::max(qb, hi);
      }
      for (int64_t h = h0; h < h1; ++h)
        for (int64_t q0 = qa; q0 < qb; q0 += Br)
          pair<V>(c, w, h, kv0, nk, q0, int(std::min<int64_t>(Br, qb - q0)), k_finite);
      T* dk = static_cast<T*>(a.dk) + ((b * sk + kv0) * hkv + hk) * dq;
      T* dvp = static_cast<T*>(a.dv) + ((b * sk + kv0) * hkv + hk) * dv;
      for (int j = 0; j < nk; ++j) {
        store_row(dk + j * c.k_stride, w.dk + j * D, dq, p.scale);
        store_row(dvp + j * c.v_stride, w.dv + j * D, dv, 1.0f);
      }
    }

    for (int64_t h = h0; h < h1; ++h) {
      for (int64_t i = 0; i < sq; ++i) {
        const int64_t off = ((b * sq + i) * hq + h) * dq;
        store_row(static_cast<T*>(a.dq) + off, a.dq_accum + off, dq, 1.0f);
      }
    }
  }

  template <typename V>
  JA_CPU_INLINE static void tasks(const JaMhaBwdArgs& a, int64_t t0, int64_t t1) {
    auto w = std::make_unique<Scratch>();
    for (int64_t t = t0; t < t1; ++t) head<V>(a, t / a.p.heads_kv, t % a.p.heads_kv, *w);
  }

  static const char* run(const JaMhaBwdArgs& a) {
    mha_cpu::run_tasks<MhaBwdCpu>(a, a.p.batch * a.p.heads_kv);
    return nullptr;
  }
};

}  // namespace ja
