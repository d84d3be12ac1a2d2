// Standalone check of the portable GPU attention kernels (csrc/kernels/mha/{simt,mma,decode}/*.cuh: SIMT,
// mma.sync and split-KV decode) with every feature of ja/kernels/mha.h against a float64 reference on the
// host; no JAX. Each case sends one call to one kernel (the instances' implementation argument, JaMhaImpl) and
// checks, from the kernels' call counters, that it ran there.
//
//   bash benchmarks/gpu/check_mha_gpu_paths.sh [arch] [filter]   (builds the instances it needs, then runs)
//   bash benchmarks/gpu/check_mha_gpu_paths.sh [arch] time       (times each kernel and feature instead)
//
// Per case: outputs are poisoned with NaN first (an unwritten element fails); o, lse, dq, dk, dv and dbias are
// compared with the reference by ||got - ref|| / max(||ref||, 0.1 sqrt(n)) over the elements where the
// reference is finite, with the bounds of tests/ops/reference.py (float32 1e-4, bfloat16 1e-2, float16
// 2e-3); where the reference is infinite or NaN (a NaN/Inf the row sees) the kernel's value must be too,
// and where it is finite the kernel's must be (a hidden NaN/Inf never reaches a row: issue 58). A row that
// sees no key must give output 0 and lse +inf. Deterministic backward cases run twice and must agree bit
// for bit. Exit status 0: every case passed; 1: a mismatch; 2: a CUDA error.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <cuda_fp16.h>

#include "ja/dtype.h"
#include "harness.cuh"
#include "ja/kernels/mha.h"
#include "ja/kernels/mha_features.h"
#include "mha/common/gpu_calls.h"

// The instances (generated from csrc/kernels/mha/{fwd,bwd}_gpu.inst.in by check_mha_gpu_paths.sh).
// clang-format off: an X-macro list
#define INSTANCES(X) \
  X(f32, 64, 0) X(f32, 64, 1) X(f32, 128, 0) X(bf16, 64, 0) X(bf16, 64, 1) X(bf16, 128, 0) X(bf16, 128, 1) \
  X(bf16, 256, 0) X(f16, 64, 0) X(f16, 128, 1)
// clang-format on
#define DECLARE(dt, d, c)                                                                         \
  extern "C" const char* ja_mha_fwd_gpu__##dt##_d##d##_c##c(const JaMhaFwdArgs*, void*, int32_t); \
  extern "C" const char* ja_mha_bwd_gpu__##dt##_d##d##_c##c(const JaMhaBwdArgs*, void*, int32_t);
INSTANCES(DECLARE)
#undef DECLARE

namespace {

using FwdFn = const char* (*)(const JaMhaFwdArgs*, void*, int32_t);
using BwdFn = const char* (*)(const JaMhaBwdArgs*, void*, int32_t);

struct Inst {
  int dt, d, c;
  FwdFn fwd;
  BwdFn bwd;
};
enum { F32 = 0, BF16 = 1, F16 = 2 };
constexpr int f32 = F32, bf16 = BF16, f16 = F16;
const Inst kInstances[] = {
#define ENTRY(dt, d, c) {dt, d, c, ja_mha_fwd_gpu__##dt##_d##d##_c##c, ja_mha_bwd_gpu__##dt##_d##d##_c##c},
    INSTANCES(ENTRY)
#undef ENTRY
};

const char* kDtName[] = {"f32", "bf16", "f16"};
const double kRtol[] = {1e-4, 1e-2, 2e-3};

// --- host values in the three dtypes ------------------------------------------------------------------
float round_to(int dt, float x) {
  if (dt == F32) return x;
  if (dt == BF16) return ja::to_f32(ja::bf16_t{ja::bf16_bits_rne(x)});
  return __half2float(__float2half(x));
}
void store(int dt, void* p, size_t i, float x) {
  if (dt == F32) static_cast<float*>(p)[i] = x;
  else if (dt == BF16) static_cast<uint16_t*>(p)[i] = ja::bf16_bits_rne(x);
  else {
    const __half h = __float2half(x);
    std::memcpy(static_cast<uint16_t*>(p) + i, &h, 2);
  }
}
float load(int dt, const void* p, size_t i) {
  if (dt == F32) return static_cast<const float*>(p)[i];
  const uint16_t u = static_cast<const uint16_t*>(p)[i];
  if (dt == BF16) return ja::to_f32(ja::bf16_t{u});
  __half h;
  std::memcpy(&h, &u, 2);
  return __half2float(h);
}
int dt_size(int dt) { return dt == F32 ? 4 : 2; }

struct Case {
  std::string name;
  int dt, D;
  int b, sq, sk, hq, hkv, hd, hdv;
  int mask = 0;                 // ja::MhaMask; ROWS from the window / layout below
  int left = -1, right = -1;    // window (ROWS), relative to each sequence's bottom-right diagonal
  int layout = 0;               // 0 dense, 1 varlen (batch 1, lens), 2 segments (per batch row, lens)
  std::vector<int> lens_q, lens_k;
  int rows_batch = 1;           // dense ROWS: 1 (shared) or b
  float softcap = 0.0f;
  int alibi = 0;                // 0 none, 1 [hq], 2 [b, hq]
  int bias = 0;                 // 0 none, 1 [1,1], 2 [b,1], 3 [1,hq], 4 [b,hq] (x [sq, sk])
  float dropout = 0.0f;
  int det = 0;
  int nan = 0;                  // NaN/Inf planted in K and V at keys hidden from some rows (2: the last three keys)
  bool tma_off = false;         // decode: JA_MHA_FWD_DECODE_TMA=0 (cp.async loads on sm_90)
  int fwd_path, bwd_path;       // expected kernels (ja::MhaGpuPath); bwd -1: no backward
  bool force = true;  // send the call to that kernel (the implementation argument); false: the dispatch picks
};

// lo, hi, diag of every row ([rb][3][sq]) and cols ([rb][2][sk]), as jax_aiter/ops/_attn_mask.py builds them.
struct Rows {
  int rb = 1;
  std::vector<int32_t> rows, cols;
};

void clamp_rows(int64_t diag, int left, int right, int64_t lo_b, int64_t hi_b, int32_t* lo, int32_t* hi) {
  auto clip = [](int64_t x, int64_t a, int64_t c) { return x < a ? a : (x > c ? c : x); };
  const int64_t l = left < 0 ? lo_b : clip(diag - left, lo_b, hi_b);
  int64_t h = right < 0 ? hi_b : clip(diag + right + 1, lo_b, hi_b);
  h = std::max(h, l);
  *lo = int32_t(l), *hi = int32_t(h);
}

Rows make_rows(const Case& c) {
  Rows R;
  const int sq = c.sq, sk = c.sk;
  const int left = c.left, right = c.mask == ja::kMaskCausal ? 0 : c.right;
  if (c.layout == 0) {
    R.rb = c.rows_batch;
    R.rows.resize(size_t(R.rb) * 3 * sq);
    for (int b = 0; b < R.rb; ++b)
      for (int i = 0; i < sq; ++i) {
        int32_t* r = R.rows.data() + size_t(b) * 3 * sq;
        const int64_t diag = i + sk - sq;
        clamp_rows(diag, left, right, 0, sk, &r[i], &r[sq + i]);
        r[2 * sq + i] = int32_t(diag);
      }
  } else {
    R.rb = c.layout == 1 ? 1 : c.b;
    R.rows.resize(size_t(R.rb) * 3 * sq);
    for (int b = 0; b < R.rb; ++b) {
      int32_t* r = R.rows.data() + size_t(b) * 3 * sq;
      std::vector<int> cq{0}, ck{0};
      for (size_t s = 0; s < c.lens_q.size(); ++s) {
        // segments: each batch row rotates the documents, so rows differ
        const size_t si = c.layout == 2 ? (s + b) % c.lens_q.size() : s;
        cq.push_back(cq.back() + c.lens_q[si]);
        ck.push_back(ck.back() + (c.layout == 2 ? c.lens_q[si] : c.lens_k[si]));
      }
      for (int t = 0; t < sq; ++t) {
        size_t s = 0;
        while (s + 1 < cq.size() - 1 && t >= cq[s + 1]) ++s;
        if (t >= cq.back()) {  // past the last sequence: sees nothing
          r[t] = r[sq + t] = ck.back();
          r[2 * sq + t] = t;
          continue;
        }
        const int lq = cq[s + 1] - cq[s], lk = ck[s + 1] - ck[s];
        const int64_t diag = (t - cq[s]) + ck[s] + lk - lq;
        clamp_rows(diag, left, right, ck[s], ck[s + 1], &r[t], &r[sq + t]);
        r[2 * sq + t] = int32_t(diag);
      }
    }
  }
  R.cols.resize(size_t(R.rb) * 2 * sk);
  for (int b = 0; b < R.rb; ++b) {
    const int32_t* r = R.rows.data() + size_t(b) * 3 * sq;
    int32_t* cc = R.cols.data() + size_t(b) * 2 * sk;
    for (int j = 0; j < sk; ++j) {
      int qlo = 0, qhi = 0;
      while (qlo < sq && r[sq + qlo] <= j) ++qlo;  // first i with hi_i > j
      while (qhi < sq && r[qhi] <= j) ++qhi;  // first i with lo_i > j
      cc[j] = qlo, cc[sk + j] = qhi;
    }
  }
  return R;
}

// Whether lo and hi are non-decreasing (what the kernels' tile skipping relies on).
bool monotone(const Rows& R, int sq) {
  for (int b = 0; b < R.rb; ++b) {
    const int32_t* r = R.rows.data() + size_t(b) * 3 * sq;
    for (int i = 1; i < sq; ++i)
      if (r[i] < r[i - 1] || r[sq + i] < r[sq + i - 1] || r[sq + i] < r[i]) return false;
  }
  return true;
}

struct Host {
  std::vector<float> q, k, v, dout, alibi, bias;
  uint32_t seed[4] = {0x12345678u, 0x9abcdef0u, 0u, 0u};
};

struct Ref {
  std::vector<double> o, lse, dq, dk, dv, dbias;
};

// float64 attention with every feature and its gradients (the definitions of ja/kernels/mha.h).
Ref reference(const Case& c, const Host& H, const Rows& R, bool with_rows) {
  const int b_ = c.b, sq = c.sq, sk = c.sk, hq = c.hq, hkv = c.hkv, hd = c.hd, hdv = c.hdv, g = hq / hkv;
  const double scale = 1.0 / std::sqrt(double(hd));
  Ref F;
  F.o.assign(size_t(b_) * sq * hq * hdv, 0.0);
  F.lse.assign(size_t(b_) * hq * sq, 0.0);
  F.dq.assign(size_t(b_) * sq * hq * hd, 0.0);
  F.dk.assign(size_t(b_) * sk * hkv * hd, 0.0);
  F.dv.assign(size_t(b_) * sk * hkv * hdv, 0.0);
  if (c.bias) F.dbias.assign(size_t(b_) * hq * sq * sk, 0.0);
  JaMhaProblem p{};
  p.seq_q = sq, p.seq_k = sk, p.mask = c.mask;
  p.rows = with_rows ? R.rows.data() : nullptr;
  p.rows_batch_stride = R.rb == 1 ? 0 : 3 * sq;
  const uint32_t thr = ja::mha_dropout_threshold(c.dropout);
  const int bb = (c.bias == 2 || c.bias == 4) ? b_ : 1, bh = (c.bias >= 3) ? hq : 1;
  std::vector<double> s(sk), z(sk), pr(sk), keep(sk), dp(sk);
  for (int b = 0; b < b_; ++b)
    for (int h = 0; h < hq; ++h)
      for (int i = 0; i < sq; ++i) {
        const int hk = h / g;
        const ja::MhaRow row = ja::mha_row(p, b, i);
        const float* qi = &H.q[((size_t(b) * sq + i) * hq + h) * hd];
        double m = -INFINITY;
        for (int64_t j = row.lo; j < row.hi; ++j) {
          const float* kj = &H.k[((size_t(b) * sk + j) * hkv + hk) * hd];
          double acc = 0;
          for (int x = 0; x < hd; ++x) acc += double(qi[x]) * kj[x];
          z[j] = acc * scale;
          double sc = c.softcap > 0 ? c.softcap * std::tanh(z[j] / c.softcap) : z[j];
          if (c.alibi) sc -= double(H.alibi[(c.alibi == 2 ? b : 0) * hq + h]) * std::fabs(double(row.diag - j));
          if (c.bias) sc += H.bias[((size_t(bb == 1 ? 0 : b) * bh + (bh == 1 ? 0 : h)) * sq + i) * sk + j];
          s[j] = sc;
          if (std::isnan(sc) || sc > m || std::isnan(m)) m = std::isnan(m) ? m : sc;
        }
        double den = 0;
        for (int64_t j = row.lo; j < row.hi; ++j) den += (pr[j] = std::exp(s[j] - m));
        const size_t li = (size_t(b) * hq + h) * sq + i;
        if (row.hi <= row.lo) {
          F.lse[li] = INFINITY;
          continue;  // output 0, zero gradients
        }
        F.lse[li] = m + std::log(den);
        for (int64_t j = row.lo; j < row.hi; ++j) {
          pr[j] /= den;
          keep[j] =
              c.dropout > 0 ? (ja::mha_dropout_keep(H.seed, thr, b, h, i, j) ? 1.0 / (1.0 - c.dropout) : 0.0) : 1.0;
        }
        double* oi = &F.o[((size_t(b) * sq + i) * hq + h) * hdv];
        for (int64_t j = row.lo; j < row.hi; ++j) {
          const float* vj = &H.v[((size_t(b) * sk + j) * hkv + hk) * hdv];
          const double w = pr[j] * keep[j];
          if (w == 0.0) continue;  // a dropped key's V does not reach the row
          for (int x = 0; x < hdv; ++x) oi[x] += w * vj[x];
        }
        // backward
        const float* doi = &H.dout[((size_t(b) * sq + i) * hq + h) * hdv];
        double delta = 0;
        for (int64_t j = row.lo; j < row.hi; ++j) {
          const float* vj = &H.v[((size_t(b) * sk + j) * hkv + hk) * hdv];
          double acc = 0;
          if (keep[j] != 0.0)
            for (int x = 0; x < hdv; ++x) acc += double(doi[x]) * vj[x];
          dp[j] = acc * keep[j];
          delta += pr[j] * dp[j];
        }
        double* dqi = &F.dq[((size_t(b) * sq + i) * hq + h) * hd];
        for (int64_t j = row.lo; j < row.hi; ++j) {
          const double ds = pr[j] * (dp[j] - delta);
          if (c.bias) F.dbias[(li)*sk + j] = ds;
          double dz = ds;
          if (c.softcap > 0) {
            const double t = std::tanh(z[j] / c.softcap);
            dz = ds * (1.0 - t * t);
          }
          const float* kj = &H.k[((size_t(b) * sk + j) * hkv + hk) * hd];
          double* dkj = &F.dk[((size_t(b) * sk + j) * hkv + hk) * hd];
          double* dvj = &F.dv[((size_t(b) * sk + j) * hkv + hk) * hdv];
          if (dz != 0.0 || std::isnan(dz))
            for (int x = 0; x < hd; ++x) {
              dqi[x] += scale * dz * kj[x];
              dkj[x] += scale * dz * qi[x];
            }
          const double w = pr[j] * keep[j];
          if (w != 0.0 || std::isnan(w))
            for (int x = 0; x < hdv; ++x) dvj[x] += w * doi[x];
        }
      }
  return F;
}

// Normwise error over the elements where ref is finite; counts elements whose finiteness differs.
struct Cmp {
  double err = 0;
  size_t mismatched = 0, nonfinite_ref = 0;
};
Cmp compare(const std::vector<float>& got, const std::vector<double>& ref) {
  Cmp r;
  double num = 0, den = 0;
  size_t n = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const bool rf = std::isfinite(ref[i]), gf = std::isfinite(got[i]);
    if (!rf) ++r.nonfinite_ref;
    if (rf != gf) {
      ++r.mismatched;
      continue;
    }
    if (!rf) continue;
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
    ++n;
  }
  r.err = std::sqrt(num) / std::max({std::sqrt(den), 0.1 * std::sqrt(double(std::max<size_t>(n, 1))), 1e-30});
  return r;
}

// The implementation (JaMhaImpl) that sends a call to kernel `path` (ja::MhaGpuPath); AUTO unless forced.
int32_t impl_of(int path, bool force) {
  if (!force) return JA_MHA_IMPL_AUTO;
  return path == ja::kPathDecode ? JA_MHA_IMPL_DECODE : path == ja::kPathMma ? JA_MHA_IMPL_MMA : JA_MHA_IMPL_SIMT;
}

void set_env(const char* name, bool off) {
  if (off) setenv(name, "0", 1);
  else unsetenv(name);
}

struct Dev {
  void* p = nullptr;
  size_t bytes = 0;
  explicit Dev(size_t n) : bytes(n) {
    if (n) CK(cudaMalloc(&p, n));
  }
  ~Dev() {
    if (p) cudaFree(p);
  }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
};

template <typename V>
void upload(Dev& d, const std::vector<V>& h) {
  if (!h.empty()) CK(cudaMemcpy(d.p, h.data(), h.size() * sizeof(V), cudaMemcpyHostToDevice));
}
std::vector<float> download(int dt, const Dev& d, size_t n) {
  std::vector<uint8_t> raw(n * dt_size(dt));
  if (n) CK(cudaMemcpy(raw.data(), d.p, raw.size(), cudaMemcpyDeviceToHost));
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = load(dt, raw.data(), i);
  return out;
}

bool run_case(const Case& c) {
  const Inst* inst = nullptr;
  const int ci = c.mask == ja::kMaskCausal ? 1 : 0;
  for (const Inst& e : kInstances)
    if (e.dt == c.dt && e.d == c.D && e.c == ci) inst = &e;
  if (!inst) {
    std::printf("%-44s SKIP: no instance %s d%d c%d in this harness\n", c.name.c_str(), kDtName[c.dt], c.D, ci);
    return false;
  }
  const int b_ = c.b, sq = c.sq, sk = c.sk, hq = c.hq, hkv = c.hkv, hd = c.hd, hdv = c.hdv;
  std::mt19937 rng(std::hash<std::string>{}(c.name));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Host H;
  auto fill = [&](std::vector<float>& x, size_t n, float sd) {
    x.resize(n);
    for (float& e : x) e = round_to(c.dt, nd(rng) * sd);
  };
  fill(H.q, size_t(b_) * sq * hq * hd, 1.0f);
  fill(H.k, size_t(b_) * sk * hkv * hd, 1.0f);
  fill(H.v, size_t(b_) * sk * hkv * hdv, 1.0f);
  fill(H.dout, size_t(b_) * sq * hq * hdv, 1.0f);
  if (c.alibi) {
    H.alibi.resize(size_t(c.alibi == 2 ? b_ : 1) * hq);
    for (size_t i = 0; i < H.alibi.size(); ++i) H.alibi[i] = 0.05f * float(1 + i % 7);
  }
  const int bb = (c.bias == 2 || c.bias == 4) ? b_ : 1, bh = (c.bias >= 3) ? hq : 1;
  if (c.bias) {
    H.bias.resize(size_t(bb) * bh * sq * sk);
    for (float& e : H.bias) e = nd(rng);
  }
  Rows R = make_rows(c);
  if (c.mask == ja::kMaskRows && !monotone(R, sq)) {
    std::printf("%-44s FAIL: the case's rows are not monotone (harness bug)\n", c.name.c_str());
    return false;
  }
  if (c.nan) {  // NaN/Inf in K and V at keys some rows do not see (and others do)
    for (int b = 0; b < b_; ++b)
      for (int hk = 0; hk < hkv; ++hk) {
        int k1 = std::min(sk - 1, sk / 4 + 1), k2 = std::min(sk - 1, sk / 3 + 2), k3 = std::min(sk - 1, sk * 2 / 3);
        if (c.nan == 2) k1 = std::max(0, sk - 3), k2 = std::max(0, sk - 2), k3 = sk - 1;
        H.v[((size_t(b) * sk + k1) * hkv + hk) * hdv + std::min(3, hdv - 1)] = INFINITY;
        H.v[((size_t(b) * sk + k1) * hkv + hk) * hdv + 0] = -INFINITY;
        H.k[((size_t(b) * sk + k2) * hkv + hk) * hd + std::min(5, hd - 1)] = NAN;
        for (int x = 0; x < hdv; ++x) H.v[((size_t(b) * sk + k3) * hkv + hk) * hdv + x] = NAN;
      }
  }
  const Ref F = reference(c, H, R, c.mask == ja::kMaskRows);

  // device buffers
  const size_t nq = size_t(b_) * sq * hq * hd, nk = size_t(b_) * sk * hkv * hd, nv = size_t(b_) * sk * hkv * hdv,
               no = size_t(b_) * sq * hq * hdv, nl = size_t(b_) * hq * sq;
  const int es = dt_size(c.dt);
  Dev q(nq * es), k(nk * es), v(nv * es), o(no * es), dout(no * es), lse(nl * 4), ws(64 << 20);
  Dev rows(R.rows.size() * 4), cols(R.cols.size() * 4), alibi(H.alibi.size() * 4), bias(H.bias.size() * 4), seed(16);
  auto up = [&](Dev& d, const std::vector<float>& x) {
    std::vector<uint8_t> raw(x.size() * es);
    for (size_t i = 0; i < x.size(); ++i) store(c.dt, raw.data(), i, x[i]);
    if (!raw.empty()) CK(cudaMemcpy(d.p, raw.data(), raw.size(), cudaMemcpyHostToDevice));
  };
  up(q, H.q), up(k, H.k), up(v, H.v), up(dout, H.dout);
  upload(rows, R.rows), upload(cols, R.cols), upload(alibi, H.alibi), upload(bias, H.bias);
  CK(cudaMemcpy(seed.p, H.seed, 16, cudaMemcpyHostToDevice));

  JaMhaProblem p{};
  p.dtype = c.dt, p.batch = b_, p.seq_q = sq, p.seq_k = sk, p.heads_q = hq, p.heads_kv = hkv;
  p.head_dim = hd, p.head_dim_v = hdv, p.mask = c.mask, p.scale = float(1.0 / std::sqrt(double(hd)));
  p.softcap = c.softcap, p.dropout_p = c.dropout;
  if (c.mask == ja::kMaskRows)
    p.rows = static_cast<const int32_t*>(rows.p), p.rows_batch_stride = R.rb == 1 ? 0 : 3 * sq;
  if (c.alibi) p.alibi = static_cast<const float*>(alibi.p), p.alibi_batch_stride = c.alibi == 2 ? hq : 0;
  if (c.bias) {
    p.bias = static_cast<const float*>(bias.p);
    p.bias_batch_stride = bb == 1 ? 0 : int64_t(bh) * sq * sk;
    p.bias_head_stride = bh == 1 ? 0 : int64_t(sq) * sk;
  }
  if (c.dropout > 0) p.seed = static_cast<const uint32_t*>(seed.p);

  // forward, on the kernel the case names
  set_env("JA_MHA_FWD_DECODE_TMA", c.tma_off);
  CK(cudaMemset(o.p, 0xff, o.bytes));
  CK(cudaMemset(lse.p, 0xff, lse.bytes));
  JaMhaFwdArgs fa{p, q.p, k.p, v.p, o.p, static_cast<float*>(lse.p), ws.p, int64_t(ws.bytes)};
  const int64_t before = ja::mha_gpu_path_count(c.fwd_path);
  if (const char* e = inst->fwd(&fa, nullptr, impl_of(c.fwd_path, c.force))) {
    std::printf("%-44s FAIL: forward error: %s\n", c.name.c_str(), e);
    return false;
  }
  CK(cudaDeviceSynchronize());
  bool ok = true;
  std::string why;
  if (ja::mha_gpu_path_count(c.fwd_path) != before + 1) ok = false, why += " fwd ran elsewhere;";
  const std::vector<float> go = download(c.dt, o, no), gl = download(F32, lse, nl);
  const Cmp co = compare(go, F.o);
  std::vector<double> rl(F.lse);
  Cmp cl;
  {
    // lse: +inf where no key is seen; finite ones within 1e-3 absolute
    double worst = 0;
    for (size_t i = 0; i < nl; ++i) {
      const bool ri = std::isinf(rl[i]) && rl[i] > 0, gi = std::isinf(gl[i]) && gl[i] > 0;
      if (ri != gi || std::isfinite(rl[i]) != std::isfinite(gl[i])) ++cl.mismatched;
      else if (std::isfinite(rl[i])) worst = std::max(worst, std::fabs(gl[i] - rl[i]));
    }
    cl.err = worst;
  }
  const double tol = kRtol[c.dt];
  if (!(co.err <= tol) || co.mismatched) ok = false, why += " o;";
  if (!(cl.err <= 1e-3) || cl.mismatched) ok = false, why += " lse;";
  char line[512];
  std::snprintf(line, sizeof line, "o %.1e(%zu) lse %.1e(%zu)", co.err, co.mismatched, cl.err, cl.mismatched);
  std::string detail = line;

  if (c.bwd_path >= 0) {
    const size_t nsync = size_t(b_) * hq * ((sq + 63) / 64);
    Dev dq(nq * es), dk(nk * es), dv(nv * es), dbias(c.bias ? nl * sk * 4 : 0), acc(nq * 4), delta(nl * 4),
        sync(nsync * 4);
    // o as the forward wrote it (the rounded output, as a caller passes it)
    JaMhaBwdArgs ba{};
    ba.p = p, ba.deterministic = c.det, ba.q = q.p, ba.k = k.p, ba.v = v.p, ba.o = o.p, ba.dout = dout.p;
    ba.lse = static_cast<const float*>(lse.p);
    if (c.mask == ja::kMaskRows)
      ba.cols = static_cast<const int32_t*>(cols.p), ba.cols_batch_stride = R.rb == 1 ? 0 : 2 * sk;
    ba.dq = dq.p, ba.dk = dk.p, ba.dv = dv.p, ba.dbias = c.bias ? static_cast<float*>(dbias.p) : nullptr;
    ba.dq_accum = static_cast<float*>(acc.p), ba.delta = static_cast<float*>(delta.p);
    ba.sync = c.det ? static_cast<int32_t*>(sync.p) : nullptr, ba.sync_words = c.det ? int64_t(nsync) : 0;
    std::vector<std::vector<float>> first;
    for (int rep = 0; rep < (c.det ? 2 : 1); ++rep) {
      for (Dev* d : {&dq, &dk, &dv, &dbias, &acc, &delta})
        if (d->bytes) CK(cudaMemset(d->p, 0xff, d->bytes));
      const int64_t bb0 = ja::mha_gpu_path_count(c.bwd_path);
      if (const char* e = inst->bwd(&ba, nullptr, impl_of(c.bwd_path, c.force))) {
        std::printf("%-44s FAIL: backward error: %s\n", c.name.c_str(), e);
        return false;
      }
      CK(cudaDeviceSynchronize());
      if (ja::mha_gpu_path_count(c.bwd_path) != bb0 + 1) ok = false, why += " bwd ran elsewhere;";
      std::vector<std::vector<float>> got = {download(c.dt, dq, nq), download(c.dt, dk, nk), download(c.dt, dv, nv)};
      if (c.bias) got.push_back(download(F32, dbias, nl * sk));
      if (rep == 0) {
        const char* names[] = {"dq", "dk", "dv", "dbias"};
        const std::vector<double>* refs[] = {&F.dq, &F.dk, &F.dv, &F.dbias};
        for (size_t t = 0; t < got.size(); ++t) {
          const Cmp cg = compare(got[t], *refs[t]);
          std::snprintf(line, sizeof line, " %s %.1e(%zu)", names[t], cg.err, cg.mismatched);
          detail += line;
          if (!(cg.err <= tol) || cg.mismatched) ok = false, why += std::string(" ") + names[t] + ";";
        }
        first = got;
      } else {
        for (size_t t = 0; t < got.size(); ++t)
          if (std::memcmp(got[t].data(), first[t].data(), got[t].size() * 4) != 0)
            ok = false, why += " not deterministic;";
      }
    }
  }
  std::printf("%-44s %s  %s%s\n", c.name.c_str(), ok ? "ok  " : "FAIL", detail.c_str(), why.c_str());
  return ok;
}

std::vector<Case> cases() {
  using namespace ja;
  std::vector<Case> v;
  // name, dt, D, b, sq, sk, hq, hkv, hd, hdv, then features; fwd path, bwd path
  auto add = [&](const std::string& name, int dt, int D, int b, int sq, int sk, int hq, int hkv, int hd, int hdv,
                 std::function<void(Case&)> f, int fp, int bp) {
    Case c;
    c.name = name, c.dt = dt, c.D = D, c.b = b, c.sq = sq, c.sk = sk, c.hq = hq, c.hkv = hkv, c.hd = hd, c.hdv = hdv;
    c.fwd_path = fp, c.bwd_path = bp;
    f(c);
    v.push_back(c);
  };
  auto none = [](Case&) {};
  auto causal = [](Case& c) { c.mask = kMaskCausal; };
  auto window = [](int l, int r) { return [=](Case& c) { c.mask = kMaskRows, c.left = l, c.right = r; }; };
  const int S = kPathSimt, M = kPathMma, DEC = kPathDecode;
  for (int path : {S, M}) {
    const std::string P = path == S ? "simt" : "mma";
    const int dt = BF16;
    add(P + " dense", dt, 64, 2, 77, 131, 4, 2, 64, 64, none, path, path);
    add(P + " causal sq<sk", dt, 64, 2, 77, 131, 4, 2, 64, 64, causal, path, path);
    add(P + " causal sq>sk", dt, 64, 1, 131, 77, 2, 1, 64, 64, causal, path, path);
    add(P + " window (20,5)", dt, 64, 2, 150, 150, 2, 2, 64, 64, window(20, 5), path, path);
    add(P + " window (0,0)", dt, 64, 1, 100, 100, 2, 1, 64, 64, window(0, 0), path, path);
    add(P + " window (-1,7) noncausal", dt, 64, 1, 90, 120, 2, 1, 64, 64, window(-1, 7), path, path);
    add(
        P + " window causal (33,0) rows per batch", dt, 128, 2, 140, 140, 2, 1, 128, 128,
        [](Case& c) { c.mask = kMaskRows, c.left = 33, c.right = 0, c.rows_batch = 2; }, path, path);
    add(P + " window larger than seq", dt, 64, 1, 60, 60, 2, 2, 64, 64, window(500, 500), path, path);
    add(
        P + " varlen causal+window, empty seq", dt, 64, 1, 200, 230, 4, 2, 64, 64,
        [](Case& c) {
          c.mask = kMaskRows, c.layout = 1, c.lens_q = {37, 0, 80, 60, 23}, c.lens_k = {50, 10, 80, 70, 20},
          c.left = 30, c.right = 0;
        },
        path, path);
    add(
        P + " varlen noncausal", dt, 64, 1, 150, 150, 2, 1, 64, 64,
        [](Case& c) { c.mask = kMaskRows, c.layout = 1, c.lens_q = {70, 1, 79}, c.lens_k = {70, 1, 79}; }, path, path);
    add(
        P + " segments causal", dt, 64, 3, 128, 128, 2, 2, 64, 64,
        [](Case& c) { c.mask = kMaskRows, c.layout = 2, c.lens_q = {50, 30, 48}, c.right = 0; }, path, path);
    add(
        P + " softcap + window", dt, 128, 2, 100, 100, 2, 1, 128, 128,
        [](Case& c) { c.mask = kMaskRows, c.left = 40, c.right = 0, c.softcap = 5.0f; }, path, path);
    add(P + " softcap d256", dt, 256, 1, 70, 90, 2, 1, 256, 256, [](Case& c) { c.softcap = 3.0f; }, path, path);
    add(
        P + " alibi gqa [hq]", dt, 64, 2, 80, 100, 8, 2, 64, 64,
        [](Case& c) {
          c.alibi = 1;
          c.mask = kMaskCausal;
        },
        path, path);
    add(
        P + " alibi [b,hq] + window", dt, 64, 2, 80, 100, 4, 4, 64, 64,
        [](Case& c) { c.alibi = 2, c.mask = kMaskRows, c.left = 16, c.right = 16; }, path, path);
    add(P + " head_dim 59", dt, 64, 2, 70, 70, 2, 1, 59, 59, causal, path, path);
    add(P + " head_dim 40 / v 64", dt, 64, 1, 66, 90, 4, 2, 40, 64, none, path, path);
    add(P + " head_dim 128 / v 96", dt, 128, 1, 66, 90, 2, 2, 128, 96, causal, path, path);
    add(P + " head_dim 1 / v 3", dt, 64, 1, 40, 50, 2, 1, 1, 3, none, path, path);
    add(P + " head_dim 192 / v 128 causal rows", dt, 256, 1, 50, 70, 2, 1, 192, 128, window(-1, 0), path, path);
    add(
        P + " rows that see nothing (varlen)", dt, 64, 1, 110, 90, 2, 1, 64, 64,
        [](Case& c) {
          c.mask = kMaskRows, c.layout = 1, c.lens_q = {30, 20, 40}, c.lens_k = {40, 0, 50}, c.left = 10, c.right = 0;
        },
        path, path);
    add(
        P + " deterministic causal gqa", dt, 128, 2, 150, 170, 4, 2, 128, 128,
        [](Case& c) { c.mask = kMaskCausal, c.det = 1; }, path, path);
    add(
        P + " deterministic varlen softcap", dt, 64, 1, 200, 200, 2, 1, 64, 64,
        [](Case& c) {
          c.mask = kMaskRows, c.layout = 1, c.lens_q = {90, 110}, c.lens_k = {90, 110}, c.right = 0, c.softcap = 4.0f,
          c.det = 1;
        },
        path, path);
    add(
        P + " NaN/Inf hidden, causal", dt, 64, 1, 96, 96, 2, 1, 64, 64,
        [](Case& c) { c.mask = kMaskCausal, c.nan = 1; }, path, path);
    add(
        P + " NaN/Inf hidden, window", dt, 64, 1, 160, 160, 2, 1, 64, 64,
        [](Case& c) { c.mask = kMaskRows, c.left = 8, c.right = 0, c.nan = 1; }, path, path);
    add(
        P + " NaN/Inf hidden, deterministic", dt, 64, 1, 160, 160, 2, 1, 64, 64,
        [](Case& c) { c.mask = kMaskRows, c.left = 12, c.right = 3, c.nan = 1, c.det = 1; }, path, path);
  }
  // float16 on both kernels
  add("mma f16 causal d128", F16, 128, 2, 99, 140, 4, 1, 128, 128, causal, M, M);
  add(
      "mma f16 window softcap alibi", F16, 64, 1, 120, 120, 4, 2, 64, 64,
      [](Case& c) { c.mask = kMaskRows, c.left = 30, c.right = 10, c.softcap = 6.0f, c.alibi = 1; }, M, M);
  // bias and dropout: the SIMT kernels (bfloat16 calls with them take SIMT even where mma.sync is allowed)
  for (bool force : {true, false}) {
    const std::string P = force ? "simt" : "(mma allowed)";
    add(
        P + " bias [sq,sk] + dbias", BF16, 64, 2, 70, 90, 4, 2, 64, 64, [=](Case& c) { c.bias = 1, c.force = force; },
        S, S);
    add(
        P + " bias [b,1] causal", BF16, 64, 2, 70, 90, 4, 2, 64, 64,
        [=](Case& c) { c.bias = 2, c.mask = kMaskCausal, c.force = force; }, S, S);
    add(
        P + " dropout 0.3", BF16, 64, 2, 70, 90, 4, 2, 64, 64, [=](Case& c) { c.dropout = 0.3f, c.force = force; }, S,
        S);
  }
  add(
      "simt bias [1,hq] window softcap", BF16, 64, 1, 100, 100, 4, 2, 64, 64,
      [](Case& c) { c.bias = 3, c.mask = kMaskRows, c.left = 20, c.right = 0, c.softcap = 5.0f; }, S, S);
  add("simt bias [b,hq] alibi d59", BF16, 64, 2, 60, 80, 2, 1, 59, 48, [](Case& c) { c.bias = 4, c.alibi = 2; }, S, S);
  add(
      "simt dropout varlen deterministic", BF16, 64, 1, 150, 150, 2, 1, 64, 64,
      [](Case& c) {
        c.mask = kMaskRows, c.layout = 1, c.lens_q = {70, 80}, c.lens_k = {70, 80}, c.right = 0, c.dropout = 0.2f,
        c.det = 1;
      },
      S, S);
  add(
      "simt dropout + bias + softcap + alibi", BF16, 128, 1, 80, 100, 4, 2, 128, 128,
      [](Case& c) { c.dropout = 0.25f, c.bias = 2, c.softcap = 4.0f, c.alibi = 1, c.mask = kMaskCausal; }, S, S);
  // float32: the SIMT kernels, every feature
  add("f32 causal gqa", F32, 64, 2, 77, 131, 4, 2, 64, 64, causal, S, S);
  add(
      "f32 window varlen softcap alibi", F32, 64, 1, 150, 160, 4, 2, 64, 64,
      [](Case& c) {
        c.mask = kMaskRows, c.layout = 1, c.lens_q = {60, 0, 90}, c.lens_k = {70, 10, 80}, c.left = 25, c.right = 5,
        c.softcap = 6.0f, c.alibi = 2;
      },
      S, S);
  add(
      "f32 bias dropout deterministic", F32, 128, 2, 60, 70, 2, 1, 100, 128,
      [](Case& c) { c.bias = 4, c.dropout = 0.1f, c.det = 1; }, S, S);
  add("f32 NaN/Inf hidden", F32, 64, 1, 96, 96, 2, 1, 64, 64, [](Case& c) { c.mask = kMaskCausal, c.nan = 1; }, S, S);
  // split-KV decode: seq_q x group <= 64
  add("decode sq1 window", BF16, 128, 2, 1, 3000, 8, 2, 128, 128, window(700, 0), DEC, -1);
  add("decode sq1 causal", BF16, 128, 3, 1, 1500, 32, 4, 128, 128, causal, DEC, -1);
  add(
      "decode sq1 varlen (packed batch)", BF16, 128, 1, 3, 2500, 8, 1, 128, 128,
      [](Case& c) { c.mask = kMaskRows, c.layout = 1, c.lens_q = {1, 1, 1}, c.lens_k = {900, 0, 1600}; }, DEC, -1);
  add("decode sq4 causal draft", BF16, 64, 2, 4, 777, 8, 1, 64, 64, causal, DEC, -1);
  add(
      "decode sq1 softcap alibi", BF16, 64, 2, 1, 999, 4, 4, 64, 64, [](Case& c) { c.softcap = 8.0f, c.alibi = 2; },
      DEC, -1);
  add("decode head_dim 40 / v 64", BF16, 64, 2, 1, 600, 8, 2, 40, 64, none, DEC, -1);
  // (the planted keys, 226, 302 and 600, start sequences 1, 2, 3: hidden from the rows of the others, whose
  // tiles reach into them)
  add(
      "decode varlen NaN/Inf at sequence starts", BF16, 64, 1, 4, 900, 16, 4, 64, 64,
      [](Case& c) {
        c.mask = kMaskRows, c.layout = 1, c.lens_q = {1, 1, 1, 1}, c.lens_k = {226, 76, 298, 300}, c.nan = 1;
      },
      DEC, -1);
  add(
      "decode sq4 causal NaN/Inf hidden", BF16, 64, 1, 4, 500, 8, 2, 64, 64,
      [](Case& c) { c.mask = kMaskCausal, c.nan = 2; }, DEC, -1);
  // the same calls with cp.async loads where sm_90 would take TMA
  for (size_t n = v.size(), i = n - 3; i < n; ++i) {
    Case c = v[i];
    c.name += " (cp.async)", c.tma_off = true;
    v.push_back(c);
  }
  add("decode f16 causal sq2", F16, 128, 2, 2, 1300, 8, 2, 128, 128, causal, DEC, -1);
  add("decode odd head_dim -> mma", BF16, 64, 1, 1, 300, 8, 2, 59, 59, [](Case& c) { c.force = false; }, M, -1);
  return v;
}

// Timing: bfloat16, batch 2, 16 heads (8 kv heads), 1024 x 1024, head dim 128, each kernel plain and with the
// features it takes, forward and backward; TFLOP/s counts 4 b h sq sk d for the forward and 10 b h sq sk d for
// the backward (its five products), times the fraction of (query, key) pairs visible, ms is the median of 3
// runs after a warm-up.
void time_paths() {
  const int b = 2, sq = 1024, sk = 1024, hq = 16, hkv = 8, d = 128;
  const size_t nq = size_t(b) * sq * hq * d, nk = size_t(b) * sk * hkv * d, nl = size_t(b) * hq * sq;
  Dev q(nq * 2), k(nk * 2), v(nk * 2), o(nq * 2), dout(nq * 2), lse(nl * 4), dq(nq * 2), dk(nk * 2), dv(nk * 2),
      acc(nq * 4), delta(nl * 4), bias(size_t(sq) * sk * 4), dbias(nl * sk * 4), seed(16), rows(3 * sq * 4),
      cols(2 * sk * 4), alibi(hq * 4), ws(64 << 20);
  fill_random<<<1024, 256>>>(static_cast<ja::bf16_t*>(q.p), int64_t(nq), 1u);
  fill_random<<<1024, 256>>>(static_cast<ja::bf16_t*>(k.p), int64_t(nk), 2u);
  fill_random<<<1024, 256>>>(static_cast<ja::bf16_t*>(v.p), int64_t(nk), 3u);
  fill_random<<<1024, 256>>>(static_cast<ja::bf16_t*>(dout.p), int64_t(nq), 4u);
  fill_random<<<1024, 256>>>(static_cast<float*>(bias.p), int64_t(sq) * sk, 5u);
  const uint32_t sd[4] = {1u, 2u, 0u, 0u};
  CK(cudaMemcpy(seed.p, sd, 16, cudaMemcpyHostToDevice));
  std::vector<float> sl(hq, 0.01f);
  upload(alibi, sl);
  Case w;
  w.sq = sq, w.sk = sk, w.b = b, w.mask = ja::kMaskRows, w.left = 511, w.right = 0;  // causal window of 512
  const Rows R = make_rows(w);
  upload(rows, R.rows), upload(cols, R.cols);
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  struct T {
    const char* name;
    int path, mask;
    float softcap, dropout;
    bool alibi, bias, det;
  };
  const T runs[] = {{"plain", ja::kPathMma, 0, 0, 0, false, false, false},
                    {"causal", ja::kPathMma, 1, 0, 0, false, false, false},
                    {"window 512 causal", ja::kPathMma, 2, 0, 0, false, false, false},
                    {"softcap 30", ja::kPathMma, 0, 30, 0, false, false, false},
                    {"alibi", ja::kPathMma, 0, 0, 0, true, false, false},
                    {"deterministic", ja::kPathMma, 0, 0, 0, false, false, true},
                    {"plain", ja::kPathSimt, 0, 0, 0, false, false, false},
                    {"bias [sq,sk]", ja::kPathSimt, 0, 0, 0, false, true, false},
                    {"dropout 0.1", ja::kPathSimt, 0, 0, 0.1f, false, false, false},
                    {"deterministic", ja::kPathSimt, 0, 0, 0, false, false, true}};
  std::printf("%-8s %-20s %10s %10s %10s %10s\n", "kernel", "case", "fwd ms", "TFLOP/s", "bwd ms", "TFLOP/s");
  for (const T& r : runs) {
    JaMhaProblem p{};
    p.dtype = BF16, p.batch = b, p.seq_q = sq, p.seq_k = sk, p.heads_q = hq, p.heads_kv = hkv;
    p.head_dim = p.head_dim_v = d, p.mask = r.mask, p.scale = 1.0f / std::sqrt(float(d));
    p.softcap = r.softcap, p.dropout_p = r.dropout;
    if (r.mask == 2) p.rows = static_cast<const int32_t*>(rows.p);
    if (r.alibi) p.alibi = static_cast<const float*>(alibi.p);
    if (r.bias) p.bias = static_cast<const float*>(bias.p);
    if (r.dropout > 0) p.seed = static_cast<const uint32_t*>(seed.p);
    const Inst* inst = nullptr;
    for (const Inst& e : kInstances)
      if (e.dt == BF16 && e.d == d && e.c == (r.mask == 1 ? 1 : 0)) inst = &e;
    JaMhaFwdArgs fa{p, q.p, k.p, v.p, o.p, static_cast<float*>(lse.p), ws.p, int64_t(ws.bytes)};
    JaMhaBwdArgs ba{};
    ba.p = p, ba.deterministic = r.det, ba.q = q.p, ba.k = k.p, ba.v = v.p, ba.o = o.p, ba.dout = dout.p;
    ba.lse = static_cast<const float*>(lse.p), ba.dq = dq.p, ba.dk = dk.p, ba.dv = dv.p;
    if (r.mask == 2) ba.cols = static_cast<const int32_t*>(cols.p);
    ba.dbias = r.bias ? static_cast<float*>(dbias.p) : nullptr;
    ba.dq_accum = static_cast<float*>(acc.p), ba.delta = static_cast<float*>(delta.p);
    auto median = [&](auto&& f) {
      std::vector<float> t;
      for (int i = 0; i < 4; ++i) {
        const float ms = event_ms(nullptr, e0, e1, f);
        if (i) t.push_back(ms);  // the first is a warm-up
      }
      std::sort(t.begin(), t.end());
      return t[t.size() / 2];
    };
    const char* err = nullptr;
    const int64_t f0 = ja::mha_gpu_path_count(r.path);
    const float fms = median([&] { err = err ? err : inst->fwd(&fa, nullptr, impl_of(r.path, true)); });
    const int64_t b0 = ja::mha_gpu_path_count(r.path);
    const float bms = median([&] { err = err ? err : inst->bwd(&ba, nullptr, impl_of(r.path, true)); });
    const bool where = ja::mha_gpu_path_count(r.path) - b0 == 4 && b0 - f0 == 4;
    double seen = 0;  // visible pairs of a (batch, head)
    for (int i = 0; i < sq; ++i) seen += r.mask == 1 ? i + 1 : r.mask == 2 ? std::min(i + 1, 512) : sk;
    const double frac = seen / (double(sq) * sk);
    const double flop = 4.0 * b * hq * double(sq) * sk * d * frac;
    std::printf("%-8s %-20s %10.3f %10.1f %10.3f %10.1f%s%s\n", r.path == ja::kPathMma ? "mma" : "simt", r.name, fms,
                flop / fms * 1e-9, bms, 2.5 * flop / bms * 1e-9, where ? "" : "  (ran on another kernel!)",
                err ? err : "");
  }
}

}  // namespace

int main(int argc, char** argv) {
  const char* filter = argc > 1 ? argv[1] : "";
  if (std::strcmp(filter, "time") == 0) {
    time_paths();
    return 0;
  }
  int fails = 0, runs = 0;
  for (const Case& c : cases()) {
    if (*filter && c.name.find(filter) == std::string::npos) continue;
    ++runs;
    if (!run_case(c)) ++fails;
  }
  std::printf("\n%d of %d cases passed\n", runs - fails, runs);
  return fails ? 1 : 0;
}
