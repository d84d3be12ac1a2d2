// Flash-attention backward on the CPU, float32 throughout.
//
// One task is one (batch, kv head): it owns dK and dV of that head and dQ of
// the query heads of its group, so GQA needs no atomics. The task first
// computes delta = rowsum(dO * O) for its query heads, then for each key tile
// (Bc rows) walks the query tiles (Br rows) of every head in the group,
// recomputing P = exp(scale * Q K^T - lse) from the forward's lse:
//   dV += P^T dO,  dP = dO V^T,  dS = P * (dP - delta),
//   dK += dS^T Q,  dQ += dS K * scale  (dQ in the float32 dq_accum workspace),
// then scales dK by the softmax scale and rounds dQ, dK, dV once.
#pragma once
#include <memory>

#include "ja/api.h"
#include "ja/kernels/mha.h"
#include "ja/kernels/mha_features.h"
#include "mha/mha_cpu_common.h"

namespace ja {

template <typename T, int D, bool CAUSAL>
struct MhaBwdCpu {
  static constexpr int Br = 32;  // query rows per tile
  static constexpr int Bc = 64;  // key rows per tile

  struct Scratch {
    float k[Bc * D], kt[D * Bc], vt[D * Bc];  // key tile, and key/value tiles transposed
    float q[Br * D], dout[Br * D];
    float p[Br * Bc], ds[Br * Bc];            // P, then dP -> dS
    float pt[Bc * Br], dst[Bc * Br];          // their transposes
    float dq[Br * D];                         // this tile's dQ contribution
    float dk[Bc * D], dv[Bc * D];             // accumulators of the key tile
    float lse2[Br], delta[Br];
  };

  template <typename V>
  JA_CPU_INLINE static void head(const JaMhaBwdArgs& a, int64_t b, int64_t hk, Scratch& w) {
    using namespace mha_cpu;
    constexpr int W = Lanes<V>::n;
    const int64_t sq = a.p.seq_q, sk = a.p.seq_k, hq = a.p.heads_q, hkv = a.p.heads_kv;
    const int64_t group = hq / hkv;
    const int64_t q_stride = hq * D, kv_stride = hkv * D;
    const auto row_q = [&](const void* base, int64_t i, int64_t h) {
      return static_cast<const T*>(base) + ((b * sq + i) * hq + h) * D;
    };

    for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
      float* delta = a.delta + (b * hq + h) * sq;
      for (int64_t i = 0; i < sq; ++i) {
        delta[i] = dot_f32(row_q(a.dout, i, h), row_q(a.o, i, h), D);
        float* acc = a.dq_accum + ((b * sq + i) * hq + h) * D;
        std::fill(acc, acc + D, 0.0f);
      }
    }

    const float s2 = a.p.scale * kLog2e;
    for (int64_t kv0 = 0; kv0 < sk; kv0 += Bc) {
      const int nk = int(std::min<int64_t>(Bc, sk - kv0));
      const T* k = static_cast<const T*>(a.k) + ((b * sk + kv0) * hkv + hk) * D;
      const T* v = static_cast<const T*>(a.v) + ((b * sk + kv0) * hkv + hk) * D;
      load_rows<Bc, D>(w.k, k, kv_stride, nk, 1.0f);
      load_rows_transposed<Bc, D>(w.kt, k, kv_stride, nk);
      load_rows_transposed<Bc, D>(w.vt, v, kv_stride, nk);
      std::fill(w.dk, w.dk + Bc * D, 0.0f);
      std::fill(w.dv, w.dv + Bc * D, 0.0f);
      // First query row that sees key kv0 (bottom-right causal), tile-aligned.
      const int64_t q_first = CAUSAL ? std::max<int64_t>(0, kv0 - (sk - sq)) : 0;
      for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        const float* lse = a.lse + (b * hq + h) * sq;
        const float* delta = a.delta + (b * hq + h) * sq;
        for (int64_t q0 = q_first / Br * Br; q0 < sq; q0 += Br) {
          const int rows = int(std::min<int64_t>(Br, sq - q0));
          load_rows<Br, D>(w.q, row_q(a.q, q0, h), q_stride, rows, 1.0f);
          load_rows<Br, D>(w.dout, row_q(a.dout, q0, h), q_stride, rows, 1.0f);
          for (int r = 0; r < Br; ++r) {
            w.lse2[r] = r < rows ? lse[q0 + r] * kLog2e : kInf;
            w.delta[r] = r < rows ? delta[q0 + r] : 0.0f;
          }
          gemm<Br, Bc, D, false, V>(w.p, Bc, w.q, D, w.kt, Bc);
          gemm<Br, Bc, D, false, V>(w.ds, Bc, w.dout, D, w.vt, Bc);
          for (int r = 0; r < Br; ++r) {
            const int vis = r < rows ? visible_keys<CAUSAL>(q0 + r, kv0, nk, sq, sk) : 0;
            float* p = w.p + r * Bc;
            float* ds = w.ds + r * Bc;
            const V s2_v = splat<V>(s2), l2_v = splat<V>(w.lse2[r]), delta_v = splat<V>(w.delta[r]);
            for (int j = 0; j < Bc; j += W) {
              const V pj = exp2_v<V>(vload<V>(p + j) * s2_v - l2_v);  // lse = +inf gives 0
              vstore(p + j, pj);
              vstore(ds + j, pj * (vload<V>(ds + j) - delta_v));
            }
            for (int j = vis; j < Bc; ++j) p[j] = ds[j] = 0.0f;  // masked keys and padding
          }
          transpose<Br, Bc>(w.pt, w.p);
          transpose<Br, Bc>(w.dst, w.ds);
          gemm<Bc, D, Br, true, V>(w.dv, D, w.pt, Br, w.dout, D);
          gemm<Bc, D, Br, true, V>(w.dk, D, w.dst, Br, w.q, D);
          gemm<Br, D, Bc, false, V>(w.dq, D, w.ds, Bc, w.k, D);
          for (int r = 0; r < rows; ++r) {
            float* acc = a.dq_accum + ((b * sq + q0 + r) * hq + h) * D;
            const float* src = w.dq + r * D;
            for (int c = 0; c < D; ++c) acc[c] += src[c] * a.p.scale;
          }
        }
      }
      T* dk = static_cast<T*>(a.dk) + ((b * sk + kv0) * hkv + hk) * D;
      T* dv = static_cast<T*>(a.dv) + ((b * sk + kv0) * hkv + hk) * D;
      for (int j = 0; j < nk; ++j) {
        store_row<D>(dk + j * kv_stride, w.dk + j * D, a.p.scale);
        store_row<D>(dv + j * kv_stride, w.dv + j * D, 1.0f);
      }
    }

    for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
      for (int64_t i = 0; i < sq; ++i) {
        const int64_t off = ((b * sq + i) * hq + h) * D;
        store_row<D>(static_cast<T*>(a.dq) + off, a.dq_accum + off, 1.0f);
      }
    }
  }

  template <typename V>
  JA_CPU_INLINE static void tasks(const JaMhaBwdArgs& a, int64_t t0, int64_t t1) {
    auto w = std::make_unique<Scratch>();
    for (int64_t t = t0; t < t1; ++t) head<V>(a, t / a.p.heads_kv, t % a.p.heads_kv, *w);
  }

  static const char* run(const JaMhaBwdArgs& a) {
    // Always deterministic: one task owns a kv head's dK, dV and its query heads' dQ.
    if (const char* f = mha_unhandled_feature(a, kMhaDeterministic)) return ja_error("mha_bwd: the CPU kernel does not handle %s yet", f);
    mha_cpu::run_tasks<MhaBwdCpu>(a, a.p.batch * a.p.heads_kv);
    return nullptr;
  }
};

}  // namespace ja
