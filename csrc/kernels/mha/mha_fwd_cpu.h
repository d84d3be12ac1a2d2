// Flash-attention forward on the CPU: tiled online softmax, float32 throughout.
//
// One task is one (batch, query head, tile of Br query rows); tasks run in
// parallel. A task streams key/value tiles of Bc rows: S = Q K^T (scores
// pre-scaled by scale * log2 e), running row max m and row sum l, O rescaled by
// exp2(m_old - m_new), O += P V. Only Br x Bc scores exist at any time.
#pragma once
#include <memory>

#include "ja/api.h"
#include "ja/kernels/mha.h"
#include "ja/kernels/mha_features.h"
#include "mha/mha_cpu_common.h"

namespace ja {

template <typename T, int D, bool CAUSAL>
struct MhaFwdCpu {
  static constexpr int Br = 64;  // query rows per tile
  static constexpr int Bc = 64;  // key rows per tile

  struct Scratch {
    float q[Br * D];   // query tile, times scale * log2(e)
    float kt[D * Bc];  // key tile, transposed
    float v[Bc * D];   // value tile
    float s[Br * Bc];  // scores, then probabilities
    float o[Br * D];   // unnormalised output
    float m[Br];       // running max (log2 domain)
    float l[Br];       // running sum
  };

  template <typename V>
  JA_CPU_INLINE static void tile(const JaMhaFwdArgs& a, int64_t b, int64_t h, int64_t q0, Scratch& w) {
    using namespace mha_cpu;
    constexpr int W = Lanes<V>::n;
    const int64_t sq = a.p.seq_q, sk = a.p.seq_k, hq = a.p.heads_q, hkv = a.p.heads_kv;
    const int64_t hk = h / (hq / hkv);
    const int rows = int(std::min<int64_t>(Br, sq - q0));
    const int64_t q_stride = hq * D, kv_stride = hkv * D;
    const T* q = static_cast<const T*>(a.q) + ((b * sq + q0) * hq + h) * D;
    const T* k = static_cast<const T*>(a.k) + (b * sk * hkv + hk) * D;
    const T* v = static_cast<const T*>(a.v) + (b * sk * hkv + hk) * D;

    load_rows<Br, D>(w.q, q, q_stride, rows, a.p.scale * kLog2e);
    std::fill(w.o, w.o + Br * D, 0.0f);
    std::fill(w.m, w.m + Br, -kInf);
    std::fill(w.l, w.l + Br, 0.0f);

    // Keys past the last visible one of the tile's last row are never loaded.
    const int64_t kv_end = CAUSAL ? std::min<int64_t>(sk, std::max<int64_t>(0, q0 + rows + sk - sq)) : sk;
    for (int64_t kv0 = 0; kv0 < kv_end; kv0 += Bc) {
      const int nk = int(std::min<int64_t>(Bc, sk - kv0));
      load_rows_transposed<Bc, D>(w.kt, k + kv0 * kv_stride, kv_stride, nk);
      load_rows<Bc, D>(w.v, v + kv0 * kv_stride, kv_stride, nk, 1.0f);
      gemm<Br, Bc, D, false, V>(w.s, Bc, w.q, D, w.kt, Bc);
      for (int r = 0; r < Br; ++r) {
        float* p = w.s + r * Bc;
        const int vis = r < rows ? visible_keys<CAUSAL>(q0 + r, kv0, nk, sq, sk) : 0;
        if (vis == 0) {  // nothing visible in this tile: the row's state is unchanged
          std::fill(p, p + Bc, 0.0f);
          continue;
        }
        for (int j = vis; j < Bc; ++j) p[j] = -kInf;  // masked keys and padding: exp2 gives 0
        const float m_new = std::max(w.m[r], row_max<Bc, V>(p));
        const float alpha = exp2_scalar<V>(w.m[r] - m_new);  // 0 while m was -inf
        const V m_v = splat<V>(m_new);
        V sum = {};
        for (int j = 0; j < Bc; j += W) {
          const V e = exp2_v<V>(vload<V>(p + j) - m_v);
          vstore(p + j, e);
          sum += e;
        }
        w.l[r] = w.l[r] * alpha + hsum(sum);
        w.m[r] = m_new;
        const V alpha_v = splat<V>(alpha);
        float* o = w.o + r * D;
        for (int c = 0; c < D; c += W) vstore(o + c, vload<V>(o + c) * alpha_v);
      }
      gemm<Br, D, Bc, true, V>(w.o, D, w.s, Bc, w.v, D);
    }

    T* o = static_cast<T*>(a.o) + ((b * sq + q0) * hq + h) * D;
    float* lse = a.lse + (b * hq + h) * sq + q0;
    for (int r = 0; r < rows; ++r) {
      // A row that saw no key: output 0 and lse = +inf (zero gradients later).
      const bool empty = w.l[r] == 0.0f;
      store_row<D>(o + r * q_stride, w.o + r * D, empty ? 0.0f : 1.0f / w.l[r]);
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
    if (const char* f = mha_unhandled_feature(a.p, 0)) return ja_error("mha_fwd: the CPU kernel does not handle %s yet", f);
    mha_cpu::run_tasks<MhaFwdCpu>(a, a.p.batch * a.p.heads_q * ((a.p.seq_q + Br - 1) / Br));
    return nullptr;
  }
};

}  // namespace ja
