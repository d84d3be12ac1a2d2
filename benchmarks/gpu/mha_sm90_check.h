// What check_mha_fwd_sm90.cu and check_mha_bwd_sm90.cu share: attention problems with every feature the
// Hopper kernels take (masks as rows: causal, windows, varlen, segments; softcap; ALiBi; GQA; head dims
// of q/k and v that differ from the instance's), their float64 references, device buffers, the instance
// table and timing. The rows follow jax_aiter/ops/_attn_mask.py's definitions (windows from the
// bottom-right diagonal; varlen per sequence; segments as runs of equal ids; cols by searchsorted).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "ja/dtype.h"
#include "ja/kernels/mha.h"
#include "ja/kernels/mha_features.h"
#include "harness.cuh"

namespace chk {

// -DJA_CHK_ONLY_D=N builds a harness with the bfloat16 instance of head dim N alone: a kernel experiment then
// compiles 2 of its 12 (head dim, dtype, causal) instances. Checks and timings of the instances left out are
// skipped, said so (not failed).
#ifdef JA_CHK_ONLY_D
constexpr int kOnlyD = JA_CHK_ONLY_D;
#else
constexpr int kOnlyD = 0;
#endif
template <typename T, int D>
constexpr bool built() {
  return kOnlyD == 0 || (std::is_same_v<T, ja::bf16_t> && D == kOnlyD);
}
// Whether a check or timing (`what`: its line's prefix) is skipped: it has no instance (`have` false) because
// JA_CHK_ONLY_D left it out; said so. Without the knob a missing instance stays a failure of the caller's.
inline bool left_out(bool have, const std::string& name, const char* what) {
  if (have || kOnlyD == 0) return false;
  std::printf("%s%-26s skipped: its instance is not built (JA_CHK_ONLY_D=%d)\n", what, name.c_str(), kOnlyD);
  return true;
}

struct Problem {
  std::string name;
  int b = 1, sq = 0, sk = 0, hq = 1, hkv = 1, d = 128, dv = 128;
  int mask = 0;        // ja::MhaMask
  int rows_batch = 1;  // ROWS: 1 or b
  std::vector<int32_t> rows, cols;  // [rows_batch, 3, sq], [rows_batch, 2, sk]
  float scale = 0.0f;  // 0: 1 / sqrt(d)
  float softcap = 0.0f;
  int alibi_batch = 0;  // 0: no ALiBi; 1 or b: slopes [alibi_batch, hq]
  std::vector<float> alibi;
  bool bf = true;
  double flops_scale = 1.0;  // the timing's FLOP count is the visible fraction's (set by finish())

  float sc() const { return scale > 0.0f ? scale : 1.0f / std::sqrt(float(d)); }
  // lo, hi, diag of row i of batch bi (the kernels' definition, ja::mha_row).
  ja::MhaRow row(int bi, int i) const {
    if (mask == ja::kMaskRows) {
      const int32_t* r = rows.data() + (rows_batch == 1 ? 0 : size_t(bi) * 3 * sq);
      return {r[i], r[sq + i], r[2 * sq + i]};
    }
    const int64_t diag = i + sk - sq;
    return {0, mask == ja::kMaskCausal ? std::min<int64_t>(std::max<int64_t>(diag + 1, 0), sk) : sk, diag};
  }
  float slope(int bi, int h) const { return alibi_batch ? alibi[size_t(alibi_batch == 1 ? 0 : bi) * hq + h] : 0.0f; }
};

// lo, hi of a row with diagonal diag whose keys are limited to [lb, hb) (_attn_mask._clamp_rows).
inline void clamp_row(int64_t diag, int left, int right, int64_t lb, int64_t hb, int32_t* lo, int32_t* hi) {
  auto clip = [](int64_t x, int64_t a, int64_t b) { return std::min(std::max(x, a), b); };
  const int64_t l = left < 0 ? lb : clip(diag - left, lb, hb);
  const int64_t h = right < 0 ? hb : clip(diag + right + 1, lb, hb);
  *lo = int32_t(l);
  *hi = int32_t(std::max(h, l));
}

// cols from rows (_attn_mask.cols_from_rows): q_lo_j = #rows with hi <= j, q_hi_j = #rows with lo <= j.
inline void make_cols(Problem& p) {
  p.cols.assign(size_t(p.rows_batch) * 2 * p.sk, 0);
  for (int rb = 0; rb < p.rows_batch; ++rb) {
    const int32_t* lo = p.rows.data() + size_t(rb) * 3 * p.sq;
    const int32_t* hi = lo + p.sq;
    int32_t* c = p.cols.data() + size_t(rb) * 2 * p.sk;
    for (int j = 0; j < p.sk; ++j) {
      c[j] = int32_t(std::upper_bound(hi, hi + p.sq, j) - hi);
      c[p.sk + j] = int32_t(std::upper_bound(lo, lo + p.sq, j) - lo);
    }
  }
}

// The fraction of (row, key) pairs that are visible: the timing counts that share of the dense FLOPs.
inline void finish(Problem& p) {
  if (p.mask == ja::kMaskRows) make_cols(p);
  double vis = 0;
  for (int bi = 0; bi < p.b; ++bi)
    for (int i = 0; i < p.sq; ++i) {
      const ja::MhaRow r = p.row(bi, i);
      vis += double(std::max<int64_t>(r.hi - r.lo, 0));
    }
  p.flops_scale = vis / (double(p.b) * p.sq * p.sk);
}

inline Problem dense(std::string name, int b, int sq, int sk, int hq, int hkv, int d, int dv, bool causal,
                     bool bf = true) {
  Problem p;
  p.name = std::move(name), p.b = b, p.sq = sq, p.sk = sk, p.hq = hq, p.hkv = hkv, p.d = d, p.dv = dv;
  p.mask = causal ? ja::kMaskCausal : ja::kMaskNone;
  p.bf = bf;
  finish(p);
  return p;
}

// A dense batch with window (left, right) from the bottom-right diagonal, as ROWS (rows_batch 1).
inline Problem window(std::string name, int b, int sq, int sk, int hq, int hkv, int d, int left, int right,
                      bool bf = true) {
  Problem p = dense(std::move(name), b, sq, sk, hq, hkv, d, d, false, bf);
  p.mask = ja::kMaskRows;
  p.rows.assign(size_t(3) * sq, 0);
  for (int i = 0; i < sq; ++i) {
    const int64_t diag = i + sk - sq;
    clamp_row(diag, left, right, 0, sk, &p.rows[i], &p.rows[sq + i]);
    p.rows[2 * sq + i] = int32_t(diag);
  }
  finish(p);
  return p;
}

// A packed (varlen) batch: sequences [cu_q[s], cu_q[s+1]) of queries, [cu_k[s], cu_k[s+1]) of keys, in
// total_q / total_k tokens (tokens past the last boundary see no key: lo = hi = cu_k.back()).
inline Problem varlen(std::string name, std::vector<int> cu_q, std::vector<int> cu_k, int total_q, int total_k, int hq,
                      int hkv, int d, int left, int right, bool bf = true) {
  Problem p = dense(std::move(name), 1, total_q, total_k, hq, hkv, d, d, false, bf);
  p.mask = ja::kMaskRows;
  p.rows.assign(size_t(3) * total_q, 0);
  const int n = int(cu_q.size()) - 1;
  for (int t = 0; t < total_q; ++t) {
    int s = int(std::upper_bound(cu_q.begin(), cu_q.end(), t) - cu_q.begin()) - 1;
    s = std::min(std::max(s, 0), n - 1);
    const int q0 = cu_q[s], q1 = cu_q[s + 1], k0 = cu_k[s], k1 = cu_k[s + 1];
    const int64_t diag = (t - q0) + k0 + (k1 - k0) - (q1 - q0);
    clamp_row(diag, left, right, k0, k1, &p.rows[t], &p.rows[total_q + t]);
    if (t >= cu_q.back()) p.rows[t] = p.rows[total_q + t] = cu_k.back();
    p.rows[2 * total_q + t] = int32_t(diag);
  }
  finish(p);
  return p;
}

// Segment ids [b, s] (runs of equal ids are sequences; rows_batch = b), causal or not.
inline Problem segments(std::string name, int b, int s, int hq, int hkv, int d, bool causal, uint32_t seed,
                        bool bf = true) {
  Problem p = dense(std::move(name), b, s, s, hq, hkv, d, d, false, bf);
  p.mask = ja::kMaskRows;
  p.rows_batch = b;
  p.rows.assign(size_t(b) * 3 * s, 0);
  std::mt19937 rng(seed);
  for (int bi = 0; bi < b; ++bi) {
    int32_t* r = p.rows.data() + size_t(bi) * 3 * s;
    int start = 0;
    while (start < s) {
      const int len = std::min(s - start, 1 + int(rng() % 150));
      for (int i = start; i < start + len; ++i)
        clamp_row(i, -1, causal ? 0 : -1, start, start + len, &r[i], &r[s + i]), r[2 * s + i] = i;
      start += len;
    }
  }
  finish(p);
  return p;
}

inline void with_alibi(Problem& p, int alibi_batch) {
  p.alibi_batch = alibi_batch;
  p.alibi.resize(size_t(alibi_batch) * p.hq);
  for (size_t i = 0; i < p.alibi.size(); ++i) p.alibi[i] = std::ldexp(1.0f, -int(1 + i % 8)) * (1.0f + 0.1f * (i / 8));
}

// Host data of a problem (random normal q, k, v, dout) and the float64 reference.
struct Host {
  std::vector<double> q, k, v, g;  // g: dout
};

inline Host host_data(const Problem& p, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  auto fill = [&](std::vector<double>& x, size_t n) {
    x.resize(n);
    for (auto& e : x) {
      const float f = nd(rng);
      e = p.bf ? double(ja::to_f32(ja::from_f32<ja::bf16_t>(f))) : double(ja::to_f32(ja::from_f32<ja::f16_t>(f)));
    }
  };
  Host h;
  fill(h.q, size_t(p.b) * p.sq * p.hq * p.d);
  fill(h.k, size_t(p.b) * p.sk * p.hkv * p.d);
  fill(h.v, size_t(p.b) * p.sk * p.hkv * p.dv);
  fill(h.g, size_t(p.b) * p.sq * p.hq * p.dv);
  return h;
}

// The score of (bi, h, i, j) from q.k (ja/kernels/mha.h), float64; t: tanh's value with softcap.
inline double ref_score(const Problem& p, int bi, int h, int64_t diag, int j, double dot, double* t) {
  double s = p.sc() * dot;
  if (p.softcap > 0) {
    *t = std::tanh(s / p.softcap);
    s = p.softcap * *t;
  }
  if (p.alibi_batch) s += -double(p.slope(bi, h)) * double(std::llabs(diag - j));
  return s;
}

struct Ref {
  std::vector<double> o, lse, dq, dk, dv;
};

// float64 forward (o, lse) and, with grads, backward (dq, dk, dv) of problem p on data x.
inline Ref reference(const Problem& p, const Host& x, bool grads) {
  Ref r;
  r.o.assign(size_t(p.b) * p.sq * p.hq * p.dv, 0.0);
  r.lse.assign(size_t(p.b) * p.hq * p.sq, INFINITY);
  if (grads) {
    r.dq.assign(x.q.size(), 0.0);
    r.dk.assign(x.k.size(), 0.0);
    r.dv.assign(x.v.size(), 0.0);
  }
  const int grp = p.hq / p.hkv;
  std::vector<double> s(p.sk), t(p.sk), pr(p.sk), dp(p.sk);
  for (int bi = 0; bi < p.b; ++bi)
    for (int h = 0; h < p.hq; ++h) {
      const int hk = h / grp;
      auto Q = [&](int i) { return &x.q[((size_t(bi) * p.sq + i) * p.hq + h) * p.d]; };
      auto G = [&](int i) { return &x.g[((size_t(bi) * p.sq + i) * p.hq + h) * p.dv]; };
      auto K = [&](int j) { return &x.k[((size_t(bi) * p.sk + j) * p.hkv + hk) * p.d]; };
      auto V = [&](int j) { return &x.v[((size_t(bi) * p.sk + j) * p.hkv + hk) * p.dv]; };
      for (int i = 0; i < p.sq; ++i) {
        const ja::MhaRow row = p.row(bi, i);
        const int lo = int(row.lo), hi = int(row.hi);
        if (hi <= lo) continue;
        double mx = -INFINITY, sum = 0;
        for (int j = lo; j < hi; ++j) {
          double dot = 0;
          for (int c = 0; c < p.d; ++c) dot += Q(i)[c] * K(j)[c];
          s[j] = ref_score(p, bi, h, row.diag, j, dot, &t[j]);
          mx = std::max(mx, s[j]);
        }
        for (int j = lo; j < hi; ++j) sum += (pr[j] = std::exp(s[j] - mx));
        double* o = &r.o[((size_t(bi) * p.sq + i) * p.hq + h) * p.dv];
        for (int j = lo; j < hi; ++j) {
          pr[j] /= sum;
          for (int c = 0; c < p.dv; ++c) o[c] += pr[j] * V(j)[c];
        }
        r.lse[(size_t(bi) * p.hq + h) * p.sq + i] = mx + std::log(sum);
        if (!grads) continue;
        double delta = 0;
        for (int j = lo; j < hi; ++j) {
          double dot = 0;
          for (int c = 0; c < p.dv; ++c) dot += G(i)[c] * V(j)[c];
          dp[j] = dot;
          delta += pr[j] * dot;
        }
        double* dq = &r.dq[((size_t(bi) * p.sq + i) * p.hq + h) * p.d];
        for (int j = lo; j < hi; ++j) {
          double ds = pr[j] * (dp[j] - delta) * p.sc();
          if (p.softcap > 0) ds *= 1.0 - t[j] * t[j];
          double* dk = &r.dk[((size_t(bi) * p.sk + j) * p.hkv + hk) * p.d];
          double* dv = &r.dv[((size_t(bi) * p.sk + j) * p.hkv + hk) * p.dv];
          for (int c = 0; c < p.d; ++c) {
            dq[c] += ds * K(j)[c];
            dk[c] += ds * Q(i)[c];
          }
          for (int c = 0; c < p.dv; ++c) dv[c] += pr[j] * G(i)[c];
        }
      }
    }
  return r;
}

// ||x - ref|| / ||ref|| (NaN in x: fails).
inline double rel_err(const std::vector<double>& ref, const std::vector<double>& x) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (x[i] - ref[i]) * (x[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / (den > 0 ? den : 1));
}

// Device copies of a problem's tensors and features; fill(): from host data, or (large timing problems)
// a device-side hash.
struct Dev {
  void *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr, *g = nullptr, *dq = nullptr, *dk = nullptr,
       *dv = nullptr;
  float *lse = nullptr, *acc = nullptr, *delta = nullptr, *alibi = nullptr;
  int32_t *rows = nullptr, *cols = nullptr, *sync = nullptr;
  int64_t sync_words = 0;
  size_t nq, nk, nv, no, nl;

  Dev(const Problem& p, bool bwd) {
    nq = size_t(p.b) * p.sq * p.hq * p.d, nk = size_t(p.b) * p.sk * p.hkv * p.d;
    nv = size_t(p.b) * p.sk * p.hkv * p.dv, no = size_t(p.b) * p.sq * p.hq * p.dv, nl = size_t(p.b) * p.hq * p.sq;
    CK(cudaMalloc(&q, nq * 2));
    CK(cudaMalloc(&k, nk * 2));
    CK(cudaMalloc(&v, nv * 2));
    CK(cudaMalloc(&o, no * 2));
    CK(cudaMalloc(&lse, nl * 4));
    if (bwd) {
      CK(cudaMalloc(&g, no * 2));
      CK(cudaMalloc(&dq, nq * 2));
      CK(cudaMalloc(&dk, nk * 2));
      CK(cudaMalloc(&dv, nv * 2));
      CK(cudaMalloc(&acc, nq * 4));
      CK(cudaMalloc(&delta, nl * 4));
      sync_words = int64_t(p.b) * p.hq * ((p.sq + 63) / 64);
      CK(cudaMalloc(&sync, size_t(sync_words) * 4));
    }
    if (!p.rows.empty()) {
      CK(cudaMalloc(&rows, p.rows.size() * 4));
      CK(cudaMemcpy(rows, p.rows.data(), p.rows.size() * 4, cudaMemcpyHostToDevice));
      CK(cudaMalloc(&cols, p.cols.size() * 4));
      CK(cudaMemcpy(cols, p.cols.data(), p.cols.size() * 4, cudaMemcpyHostToDevice));
    }
    if (!p.alibi.empty()) {
      CK(cudaMalloc(&alibi, p.alibi.size() * 4));
      CK(cudaMemcpy(alibi, p.alibi.data(), p.alibi.size() * 4, cudaMemcpyHostToDevice));
    }
  }
  ~Dev() {
    for (void* x : {q, k, v, o, g, dq, dk, dv, (void*)lse, (void*)acc, (void*)delta, (void*)alibi, (void*)rows,
                    (void*)cols, (void*)sync})
      if (x) cudaFree(x);
  }
  template <typename T>
  static void up(void* dst, const std::vector<double>& x) {
    std::vector<T> h(x.size());
    for (size_t i = 0; i < x.size(); ++i) h[i] = ja::from_f32<T>(float(x[i]));
    CK(cudaMemcpy(dst, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  void upload(const Problem& p, const Host& x) {
    if (p.bf) up<ja::bf16_t>(q, x.q), up<ja::bf16_t>(k, x.k), up<ja::bf16_t>(v, x.v);
    else up<ja::f16_t>(q, x.q), up<ja::f16_t>(k, x.k), up<ja::f16_t>(v, x.v);
    if (g) p.bf ? up<ja::bf16_t>(g, x.g) : up<ja::f16_t>(g, x.g);
  }
  template <typename T>
  void hash_fill(uint32_t seed) {
    fill_random<T><<<1024, 256>>>(static_cast<T*>(q), int64_t(nq), seed);
    fill_random<T><<<1024, 256>>>(static_cast<T*>(k), int64_t(nk), seed + 1);
    fill_random<T><<<1024, 256>>>(static_cast<T*>(v), int64_t(nv), seed + 2);
    if (g) fill_random<T><<<1024, 256>>>(static_cast<T*>(g), int64_t(no), seed + 3);
    CK(cudaGetLastError());
  }
  template <typename T>
  static std::vector<double> down(const void* src, size_t n) {
    std::vector<T> h(n);
    CK(cudaMemcpy(h.data(), src, n * sizeof(T), cudaMemcpyDeviceToHost));
    std::vector<double> r(n);
    for (size_t i = 0; i < n; ++i) r[i] = ja::to_f32(h[i]);
    return r;
  }
  std::vector<double> get(const Problem& p, const void* src, size_t n) const {
    return p.bf ? down<ja::bf16_t>(src, n) : down<ja::f16_t>(src, n);
  }
};

inline JaMhaProblem problem(const Problem& p, const Dev& m) {
  JaMhaProblem pr{};
  pr.dtype = p.bf ? 1 : 2;
  pr.batch = p.b, pr.seq_q = p.sq, pr.seq_k = p.sk, pr.heads_q = p.hq, pr.heads_kv = p.hkv;
  pr.head_dim = p.d, pr.head_dim_v = p.dv;
  pr.mask = p.mask;
  pr.scale = p.sc();
  pr.softcap = p.softcap;
  pr.rows = m.rows, pr.rows_batch_stride = p.rows_batch == 1 ? 0 : 3 * int64_t(p.sq);
  pr.alibi = p.alibi_batch ? m.alibi : nullptr, pr.alibi_batch_stride = p.alibi_batch == 1 ? 0 : p.hq;
  return pr;
}

// Milliseconds of f() (which enqueues work on the default stream): the median of reps after a warm-up.
template <typename F>
float time_ms(int reps, F&& f) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  f();
  CK(cudaDeviceSynchronize());
  std::vector<float> t(reps);
  for (int i = 0; i < reps; ++i) t[i] = event_ms(nullptr, e0, e1, f);
  std::sort(t.begin(), t.end());
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  return t[reps / 2];
}

// The timing problems both harnesses run (bf16, H200 targets of issue 56): b1 x 16k tokens, 32 heads of 128;
// documents of 128 to 8k tokens packed into 16k; windows of 1k and 4k, causal and not; softcap; ALiBi.
inline std::vector<int> doc_bounds() {
  const int lens[] = {8192, 128, 2048, 512, 4096, 256, 1024, 128};  // 16384 tokens
  std::vector<int> cu{0};
  for (int l : lens) cu.push_back(cu.back() + l);
  return cu;
}

}  // namespace chk
