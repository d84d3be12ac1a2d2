// Flash-attention forward on the CPU: tiled online softmax, float32 throughout, every feature of
// ja/kernels/mha.h at run time (the reference path).
//
// One task is one (batch, query head, tile of Br query rows); tasks run in parallel. A task streams
// the key/value tiles of Bc rows that some row of its tile sees ([lo of its first row, hi of its last
// row) for ROWS masks, so tiles outside a window or a document are never loaded) through the online
// softmax of cpu/online_softmax.h (which says how each key tile is added, and how NaN and Inf stay out of
// the rows that do not see them), with this kernel's dropout.
//
// D is the instance's padded head dim: head_dim and head_dim_v (each <= D) are read at run time and
// the tiles are zero-padded on load.
#pragma once
#include <memory>

#include "ja/api.h"
#include "ja/kernels/mha.h"
#include "ja/kernels/mha_features.h"
#include "mha/cpu/common.h"
#include "mha/cpu/online_softmax.h"

namespace ja {

template <typename T, int D>
struct MhaFwdCpu {
  static constexpr int Br = 64;  // query rows per tile
  static constexpr int Bc = 64;  // key rows per tile

  struct Scratch {
    float q[Br * D];   // query tile, times ScoreTerms::qk_mul
    float kt[D * Bc];  // key tile, transposed
    float v[Bc * D];   // value tile
    mha_cpu::OnlineSoftmax<Br, Bc, D> sm;
  };

  template <typename V>
  JA_CPU_INLINE static void tile(const JaMhaFwdArgs& a, int64_t b, int64_t h, int64_t q0, Scratch& w) {
    using namespace mha_cpu;
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
    auto& sm = w.sm;

    load_rows<Br, D>(w.q, q, q_stride, rows, dq, ScoreTerms::qk_mul(p));
    sm.reset();
    sm.rows.init(p, b, q0, rows);

    // Keys outside [kv_lo, kv_hi) are seen by no row of the tile: never loaded.
    for (int64_t kv0 = sm.rows.kv_lo; kv0 < sm.rows.kv_hi; kv0 += Bc) {
      const int nk = int(std::min<int64_t>(Bc, sm.rows.kv_hi - kv0));
      load_rows_transposed<Bc, D>(w.kt, k + kv0 * k_stride, k_stride, nk, dq);
      load_rows<Bc, D>(w.v, v + kv0 * v_stride, v_stride, nk, dv, 1.0f);
      sm.template add<V>(w.q, w.kt, w.v, kv0, nk, q0, terms, [&](int r, int lo, int hi, float* s) {
        if (!dropout) return;
        float keep[Bc];
        dropout_row(keep, p, threshold, keep_scale, b, h, q0 + r, kv0, lo, hi);
        for (int j = lo; j < hi; ++j) s[j] *= keep[j];
      });
    }

    T* o = static_cast<T*>(a.o) + ((b * sq + q0) * hq + h) * dv;
    float* lse = a.lse + (b * hq + h) * sq + q0;
    for (int r = 0; r < rows; ++r) {
      store_row(o + r * o_stride, sm.o + r * D, dv, sm.out_mul(r));
      lse[r] = sm.lse(r);
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
