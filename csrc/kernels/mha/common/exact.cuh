// The matrix-unit kernels' answer to non-finite results (the sm_90a forward and backward, the mma.sync
// backward): a row or key whose fast-path result came out NaN or infinite is computed again, exactly and by
// one warp, from the inputs in global memory, so that a NaN or Inf the mask hides never reaches it, while one
// it sees does.
//
// Why: in a tile that straddles a row's mask boundary the tensor cores multiply every key of the tile,
// hidden ones included, by that key's weight, and a hidden key's weight is 0: in O += P V a V row holding
// NaN or Inf gives 0 x NaN = NaN (IEEE) in the rows it is hidden from; in the backward the same holds for K
// in dQ = dS K, Q in dK = dS^T Q and dO in dV = P^T dO. A non-finite value visible to a row makes its
// result non-finite anyway, so checking the results (free: they are in registers) finds every row or key
// that may need it, and the recomputation, which visits only the keys (rows) the mask lets through, is
// right for both kinds. Finite inputs never take it: its cost is the check.
//
// The recomputation follows the float64 reference's definitions in float32 (expf, tanhf; no rounding of P
// to the input dtype): x = scale q.k, or softcap tanh(scale q.k / softcap), plus ALiBi's -slope |diag - j|;
// a NaN score makes its row NaN, as the reference's softmax does. Lanes hold columns lane + 32 t of a head
// dim up to 256.
#pragma once
#include <cstdint>
#include <type_traits>

#include "ja/kernels/mha.h"
#include "ja/kernels/mha_features.h"
#include "mha/common/gpu.cuh"

namespace ja {
namespace mha_gpu {

// Element to float and back: ja's storage types (to_f32, from_f32) and any type that converts (CUTLASS's).
JA_DEVICE float exact_f32(bf16_t x) { return to_f32(x); }
JA_DEVICE float exact_f32(f16_t x) { return to_f32(x); }
template <typename E>
JA_DEVICE float exact_f32(E x) {
  return float(x);
}
template <typename E>
JA_DEVICE E exact_to(float x) {
  if constexpr (std::is_same_v<E, bf16_t> || std::is_same_v<E, f16_t>) return from_f32<E>(x);
  else return E(x);
}

constexpr int kExactCols = 8;  // columns a lane holds: 256 / 32

JA_DEVICE float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// Columns lane + 32 t (< n) of a row, 0 past n.
template <typename Element>
JA_DEVICE void exact_load(const Element* row, int n, float (&x)[kExactCols]) {
  const int lane = int(threadIdx.x % 32);
#pragma unroll
  for (int t = 0; t < kExactCols; ++t) {
    const int c = lane + 32 * t;
    x[t] = c < n ? exact_f32(row[c]) : 0.0f;
  }
}

// x[t] * mul into columns lane + 32 t (< n) of a row, in its dtype.
template <typename Element>
JA_DEVICE void exact_store(Element* row, int n, const float (&x)[kExactCols], float mul = 1.0f) {
  const int lane = int(threadIdx.x % 32);
#pragma unroll
  for (int t = 0; t < kExactCols; ++t) {
    const int c = lane + 32 * t;
    if (c < n) row[c] = exact_to<Element>(x[t] * mul);
  }
}

template <typename Element>
JA_DEVICE float exact_dot(const float (&x)[kExactCols], const Element* row, int n) {
  const int lane = int(threadIdx.x % 32);
  float s = 0.0f;
#pragma unroll
  for (int t = 0; t < kExactCols; ++t) {
    const int c = lane + 32 * t;
    if (c < n) s = fmaf(x[t], exact_f32(row[c]), s);
  }
  return warp_sum(s);
}

// The score of q.k = qk for key j of a row with diagonal diag (ALiBi slope `slope`), in the natural-log domain;
// *dx: d score / d(scale q.k) (1 - tanh^2 with softcap, else 1).
JA_DEVICE float exact_score(JaMhaProblem const& pr, float qk, float slope, int64_t diag, int64_t j, float* dx) {
  float x = qk * pr.scale;
  *dx = 1.0f;
  if (pr.softcap > 0.0f) {
    const float t = tanhf(x / pr.softcap);
    x = pr.softcap * t;
    *dx = 1.0f - t * t;
  }
  if (pr.alibi) x = fmaf(-slope, fabsf(float(diag - j)), x);
  return x;
}

JA_DEVICE float exact_slope(JaMhaProblem const& pr, int b, int h) {
  return pr.alibi ? pr.alibi[int64_t(b) * pr.alibi_batch_stride + h] : 0.0f;
}

// Query row i of head h, batch b ([batch, seq, heads, dim] tensors): its output and lse (natural log) over the
// keys [row.lo, row.hi). A row that sees no key gets 0 and +inf, as the kernels give it.
template <typename Element>
__device__ __noinline__ void exact_fwd_row(JaMhaProblem const& pr, const Element* q, const Element* k, const Element* v,
                                           Element* o, float* lse, int b, int h, int i, MhaRow row) {
  const int d = int(pr.head_dim), dv = int(pr.head_dim_v), hq = int(pr.heads_q), hkv = int(pr.heads_kv);
  const int hk = h / (hq / hkv), lane = int(threadIdx.x % 32);
  const float slope = exact_slope(pr, b, h);
  float qr[kExactCols], acc[kExactCols] = {};
  exact_load(q + ((int64_t(b) * pr.seq_q + i) * hq + h) * d, d, qr);
  float m = -INFINITY, l = 0.0f;
  for (int64_t j = row.lo; j < row.hi; ++j) {
    const int64_t kv = (int64_t(b) * pr.seq_k + j) * hkv + hk;
    float dx;
    const float x = exact_score(pr, exact_dot(qr, k + kv * d, d), slope, row.diag, j, &dx);
    const float mn = (m != m || x != x) ? NAN : fmaxf(m, x);  // a NaN score stays: the row is NaN
    const float alpha = mn == m ? 1.0f : expf(m - mn);
    const float p = x == -INFINITY ? 0.0f : expf(x - mn);
    l = fmaf(l, alpha, p);
    const Element* vj = v + kv * dv;
#pragma unroll
    for (int t = 0; t < kExactCols; ++t) {
      const int c = lane + 32 * t;
      if (c < dv) acc[t] = fmaf(p, exact_f32(vj[c]), acc[t] * alpha);
    }
    m = mn;
  }
  const bool empty = l == 0.0f;
  Element* orow = o + ((int64_t(b) * pr.seq_q + i) * hq + h) * dv;
#pragma unroll
  for (int t = 0; t < kExactCols; ++t) {
    const int c = lane + 32 * t;
    if (c < dv) orow[c] = exact_to<Element>(empty ? 0.0f : acc[t] / l);
  }
  if (lane == 0) lse[(int64_t(b) * hq + h) * pr.seq_q + i] = empty ? INFINITY : m + logf(l);
}

// The backward's inputs besides the problem: q, k, v, dO and the forward's lse and delta = rowsum(dO O).
template <typename Element>
struct ExactBwd {
  const Element *q, *k, *v, *dout;
  const float *lse, *delta;
};

// A call's ExactBwd, its tensors as Element (ja's storage type or CUTLASS's).
template <typename Element>
JA_HOST_DEVICE ExactBwd<Element> exact_bwd(const JaMhaBwdArgs& a) {
  return {static_cast<const Element*>(a.q),
          static_cast<const Element*>(a.k),
          static_cast<const Element*>(a.v),
          static_cast<const Element*>(a.dout),
          a.lse,
          a.delta};
}

// The query rows that see key j of batch b (ja::mha_col), clamped to [0, seq_q] with q_hi >= q_lo: the rows
// exact_dkdv_key visits.
JA_HOST_DEVICE MhaCol exact_col(JaMhaProblem const& pr, const int32_t* cols, int64_t cols_batch_stride, int64_t b,
                                int64_t j) {
  MhaCol c = mha_col(pr, cols, cols_batch_stride, b, j);
  c.q_lo = mha_clamp(c.q_lo, 0, pr.seq_q);
  c.q_hi = mha_clamp(c.q_hi, c.q_lo, pr.seq_q);
  return c;
}

// dP and dS of query row i (head h) and key j given their loaded rows: p (the weight) and ds (d score).
template <typename Element>
JA_DEVICE void exact_p_ds(JaMhaProblem const& pr, ExactBwd<Element> const& in, float qk, float dp, float slope,
                          int64_t diag, int64_t j, int64_t stat, float* p, float* ds) {
  float dx;
  const float x = exact_score(pr, qk, slope, diag, j, &dx);
  *p = expf(x - in.lse[stat]);  // lse = +inf (a row that sees no key): 0
  *ds = *p * (dp - in.delta[stat]) * dx;
}

// dQ of query row i of head h, batch b, over the keys [row.lo, row.hi), times scale, into dq (the input dtype).
template <typename Element>
__device__ __noinline__ void exact_dq_row(JaMhaProblem const& pr, ExactBwd<Element> const& in, Element* dq, int b,
                                          int h, int i, MhaRow row) {
  const int d = int(pr.head_dim), dv = int(pr.head_dim_v), hq = int(pr.heads_q), hkv = int(pr.heads_kv);
  const int hk = h / (hq / hkv), lane = int(threadIdx.x % 32);
  const float slope = exact_slope(pr, b, h);
  const int64_t qrow = (int64_t(b) * pr.seq_q + i) * hq + h, stat = (int64_t(b) * hq + h) * pr.seq_q + i;
  float qr[kExactCols], gr[kExactCols], acc[kExactCols] = {};
  exact_load(in.q + qrow * d, d, qr);
  exact_load(in.dout + qrow * dv, dv, gr);
  for (int64_t j = row.lo; j < row.hi; ++j) {
    const int64_t kv = (int64_t(b) * pr.seq_k + j) * hkv + hk;
    const Element* kj = in.k + kv * d;
    float p, ds;
    exact_p_ds(pr, in, exact_dot(qr, kj, d), exact_dot(gr, in.v + kv * dv, dv), slope, row.diag, j, stat, &p, &ds);
#pragma unroll
    for (int t = 0; t < kExactCols; ++t) {
      const int c = lane + 32 * t;
      if (c < d) acc[t] = fmaf(ds, exact_f32(kj[c]), acc[t]);
    }
  }
  exact_store(dq + qrow * d, d, acc, pr.scale);
}

// dK (times scale) and dV of key j of kv head hk, batch b, over the query rows [col.q_lo, col.q_hi) of every
// query head of its group, into dk and dv (lane + 32 t columns); diag(i): row i's diagonal (ALiBi).
template <typename Element, typename Diag>
__device__ __noinline__ void exact_dkdv_key(JaMhaProblem const& pr, ExactBwd<Element> const& in, int b, int hk,
                                            int64_t j, MhaCol col, Diag diag, float (&dk)[kExactCols],
                                            float (&dvv)[kExactCols]) {
  const int d = int(pr.head_dim), dv = int(pr.head_dim_v), hq = int(pr.heads_q), hkv = int(pr.heads_kv);
  const int group = hq / hkv, lane = int(threadIdx.x % 32);
  const int64_t kv = (int64_t(b) * pr.seq_k + j) * hkv + hk;
  float kr[kExactCols], vr[kExactCols];
  exact_load(in.k + kv * d, d, kr);
  exact_load(in.v + kv * dv, dv, vr);
#pragma unroll
  for (int t = 0; t < kExactCols; ++t) dk[t] = dvv[t] = 0.0f;
  for (int h = hk * group; h < (hk + 1) * group; ++h) {
    const float slope = exact_slope(pr, b, h);
    for (int64_t i = col.q_lo; i < col.q_hi; ++i) {
      const int64_t qrow = (int64_t(b) * pr.seq_q + i) * hq + h, stat = (int64_t(b) * hq + h) * pr.seq_q + i;
      const Element* qi = in.q + qrow * d;
      const Element* gi = in.dout + qrow * dv;
      float p, ds;
      exact_p_ds(pr, in, exact_dot(kr, qi, d), exact_dot(vr, gi, dv), slope, pr.alibi ? diag(i) : 0, j, stat, &p, &ds);
#pragma unroll
      for (int t = 0; t < kExactCols; ++t) {
        const int c = lane + 32 * t;
        if (c < d) dk[t] = fmaf(ds, exact_f32(qi[c]), dk[t]);
        if (c < dv) dvv[t] = fmaf(p, exact_f32(gi[c]), dvv[t]);
      }
    }
  }
#pragma unroll
  for (int t = 0; t < kExactCols; ++t) dk[t] *= pr.scale;
}

}  // namespace mha_gpu
}  // namespace ja
