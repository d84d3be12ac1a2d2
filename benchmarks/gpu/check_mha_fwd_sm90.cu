// Standalone check and timing of the Hopper attention forward (csrc/kernels/mha/mha_fwd_sm90.cuh)
// against a float32 reference kernel and the mma.sync kernel, on random data; no JAX.
//
//   nvcc -std=c++17 -O3 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a \
//        -Icsrc/include -Icsrc/kernels -isystem <nvidia-cutlass>/cutlass_library/source/include \
//        -DJA_HAS_GPU=1 -DJA_BACKEND_CUDA=1 -DNDEBUG benchmarks/gpu/check_mha_fwd_sm90.cu -o check_mha_fwd_sm90
//   ./check_mha_fwd_sm90 [reps] [cases] [d]  (reps 0: no timing; cases N: the first N checks only,
//                                             e.g. `0 3` under compute-sanitizer; d: time that head dim only)
//
// Every case fills out and lse with NaN first (an unwritten element fails), compares out by
// ||out - ref|| / ||ref|| and lse by max |diff| (rows with no visible key must be 0 and +inf),
// then the timing table gives TFLOP/s of both kernels (4 * b * h * sq * sk * d, halved when causal).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "mha/mha_fwd_gpu.cuh"
#include "mha/mha_fwd_sm90.cuh"
#include "harness.cuh"

__device__ float ld(const uint16_t* p, int64_t i, bool bf) {
  const uint16_t u = p[i];
  if (bf) return __uint_as_float(uint32_t(u) << 16);
  return __half2float(__ushort_as_half(u));
}

__global__ void ref_kernel(const uint16_t* q, const uint16_t* k, const uint16_t* v, float* o, float* lse, int B,
                           int sq, int sk, int hq, int hkv, int D, int causal, float scale, bool bf) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= int64_t(B) * hq * sq) return;
  const int i = int(idx % sq), h = int((idx / sq) % hq), b = int(idx / (int64_t(sq) * hq));
  const int hk = h / (hq / hkv);
  const uint16_t* qr = q + ((int64_t(b) * sq + i) * hq + h) * D;
  float* orow = o + ((int64_t(b) * sq + i) * hq + h) * D;
  float m = -INFINITY;
  for (int j = 0; j < sk; ++j) {
    if (causal && j > i + sk - sq) continue;
    const uint16_t* kr = k + ((int64_t(b) * sk + j) * hkv + hk) * D;
    float s = 0;
    for (int d = 0; d < D; ++d) s += ld(qr, d, bf) * ld(kr, d, bf);
    m = fmaxf(m, s * scale);
  }
  float acc[256];
  for (int d = 0; d < D; ++d) acc[d] = 0;
  float l = 0;
  if (m != -INFINITY) {
    for (int j = 0; j < sk; ++j) {
      if (causal && j > i + sk - sq) continue;
      const uint16_t* kr = k + ((int64_t(b) * sk + j) * hkv + hk) * D;
      const uint16_t* vr = v + ((int64_t(b) * sk + j) * hkv + hk) * D;
      float s = 0;
      for (int d = 0; d < D; ++d) s += ld(qr, d, bf) * ld(kr, d, bf);
      const float pr = expf(s * scale - m);
      l += pr;
      for (int d = 0; d < D; ++d) acc[d] += pr * ld(vr, d, bf);
    }
  }
  for (int d = 0; d < D; ++d) orow[d] = l > 0 ? acc[d] / l : 0.0f;
  lse[(int64_t(b) * hq + h) * sq + i] = l > 0 ? m + logf(l) : INFINITY;
}

struct Case {
  int b, sq, sk, hq, hkv, d, causal;
  bool bf;
};

template <typename T, int D, bool C>
const char* run_sm90(const JaMhaFwdArgs& a) {
  return ja::mha_sm90::mha_fwd_sm90_launch<T, D, C>(a, nullptr);
}
template <typename T, int D, bool C>
const char* run_mma(const JaMhaFwdArgs& a) {
  return ja::mha_fwd_gpu<T, D, C>(a, nullptr);
}

template <template <typename, int, bool> class F>
struct Pick;
using RunFn = const char* (*)(const JaMhaFwdArgs&);
template <typename T>
RunFn pick_d(int d, int c, bool sm90) {
#define P(D)                                                                        \
  if (d == D) {                                                                     \
    if (sm90) return c ? run_sm90<T, D, true> : run_sm90<T, D, false>;              \
    return c ? run_mma<T, D, true> : run_mma<T, D, false>;                          \
  }
  P(64) P(128) P(256)
#undef P
  return nullptr;
}
RunFn pick(const Case& c, bool sm90) {
  return c.bf ? pick_d<ja::bf16_t>(c.d, c.causal, sm90) : pick_d<ja::f16_t>(c.d, c.causal, sm90);
}

static uint16_t to16(float f, bool bf) {
  if (bf) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return uint16_t((u + 0x7fff + ((u >> 16) & 1)) >> 16);
  }
  __half h = __float2half(f);
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}
static float from16(uint16_t u, bool bf) {
  if (bf) {
    uint32_t x = uint32_t(u) << 16;
    float f;
    std::memcpy(&f, &x, 4);
    return f;
  }
  __half h;
  std::memcpy(&h, &u, 2);
  return __half2float(h);
}

struct Bufs {
  uint16_t *q, *k, *v, *o;
  float *lse, *ro, *rlse;
};

static Bufs alloc(const Case& c, std::mt19937& rng, bool ref) {
  Bufs B{};
  const size_t nq = size_t(c.b) * c.sq * c.hq * c.d, nk = size_t(c.b) * c.sk * c.hkv * c.d;
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<uint16_t> h(std::max(nq, nk));
  CK(cudaMalloc(&B.q, nq * 2));
  CK(cudaMalloc(&B.k, nk * 2));
  CK(cudaMalloc(&B.v, nk * 2));
  CK(cudaMalloc(&B.o, nq * 2));
  CK(cudaMalloc(&B.lse, size_t(c.b) * c.hq * c.sq * 4));
  for (uint16_t** p : {&B.q, &B.k, &B.v}) {
    const size_t n = *p == B.q ? nq : nk;
    if (ref || n < (size_t(1) << 26)) {
      for (size_t i = 0; i < n; ++i) h[i] = to16(nd(rng), c.bf);
    } else {  // large timing inputs: a cheap pattern is enough (not zeros)
      for (size_t i = 0; i < n; ++i) h[i] = to16(float(int((i * 2654435761u) >> 20) % 17 - 8) * 0.125f, c.bf);
    }
    CK(cudaMemcpy(*p, h.data(), n * 2, cudaMemcpyHostToDevice));
  }
  if (ref) {
    CK(cudaMalloc(&B.ro, nq * 4));
    CK(cudaMalloc(&B.rlse, size_t(c.b) * c.hq * c.sq * 4));
  }
  return B;
}
static void release(Bufs& B) {
  for (void* p : {(void*)B.q, (void*)B.k, (void*)B.v, (void*)B.o, (void*)B.lse, (void*)B.ro, (void*)B.rlse})
    if (p) cudaFree(p);
}
static JaMhaFwdArgs args(const Case& c, const Bufs& B) {
  JaMhaFwdArgs a{};
  a.p.dtype = c.bf ? 1 : 2;
  a.p.batch = c.b, a.p.seq_q = c.sq, a.p.seq_k = c.sk, a.p.heads_q = c.hq, a.p.heads_kv = c.hkv;
  a.p.head_dim = a.p.head_dim_v = c.d;
  a.p.mask = c.causal ? ja::kMaskCausal : ja::kMaskNone;
  a.p.scale = 1.0f / std::sqrt(float(c.d));
  a.q = B.q, a.k = B.k, a.v = B.v, a.o = B.o, a.lse = B.lse;
  return a;
}

static bool check(const Case& c, std::mt19937& rng, bool sm90) {
  Bufs B = alloc(c, rng, true);
  const JaMhaFwdArgs a = args(c, B);
  const size_t nq = size_t(c.b) * c.sq * c.hq * c.d, nl = size_t(c.b) * c.hq * c.sq;
  CK(cudaMemset(B.o, 0xff, nq * 2));  // NaN in both dtypes
  CK(cudaMemset(B.lse, 0xff, nl * 4));
  const char* err = pick(c, sm90)(a);
  if (err) {
    std::printf("launch error: %s\n", err);
    return false;
  }
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  const int64_t rows = int64_t(c.b) * c.hq * c.sq;
  ref_kernel<<<unsigned((rows + 127) / 128), 128>>>(B.q, B.k, B.v, B.ro, B.rlse, c.b, c.sq, c.sk, c.hq, c.hkv, c.d,
                                                    c.causal, a.p.scale, c.bf);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<uint16_t> o(nq);
  std::vector<float> ro(nq), l(nl), rl(nl);
  CK(cudaMemcpy(o.data(), B.o, nq * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(ro.data(), B.ro, nq * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(l.data(), B.lse, nl * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(rl.data(), B.rlse, nl * 4, cudaMemcpyDeviceToHost));
  double num = 0, den = 0, lmax = 0;
  size_t nan = 0, inf_bad = 0;
  for (size_t i = 0; i < nq; ++i) {
    const float x = from16(o[i], c.bf);
    if (!std::isfinite(x)) ++nan;
    num += double(x - ro[i]) * (x - ro[i]);
    den += double(ro[i]) * ro[i];
  }
  for (size_t i = 0; i < nl; ++i) {
    if (std::isinf(rl[i]) || std::isinf(l[i])) {
      inf_bad += !(std::isinf(rl[i]) && rl[i] > 0 && std::isinf(l[i]) && l[i] > 0);
    } else if (std::isnan(l[i])) {
      ++nan;
    } else {
      lmax = std::max(lmax, double(std::fabs(l[i] - rl[i])));
    }
  }
  const double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  const bool ok = nan == 0 && inf_bad == 0 && rel < (c.bf ? 1e-2 : 3e-3) && lmax < 1e-3 * 8;
  std::printf("%-5s %s b%d sq%-5d sk%-5d hq%-2d hkv%-2d d%-3d c%d  rel %.2e  lse %.2e  nan %zu  inf %zu  %s\n",
              sm90 ? "sm90" : "mma", c.bf ? "bf16" : "f16 ", c.b, c.sq, c.sk, c.hq, c.hkv, c.d, c.causal, rel, lmax,
              nan, inf_bad, ok ? "ok" : "FAIL");
  release(B);
  return ok;
}

static void timing(const Case& c, std::mt19937& rng, int reps) {
  Bufs B = alloc(c, rng, false);
  const JaMhaFwdArgs a = args(c, B);
  double flops = 4.0 * c.b * c.hq * double(c.sq) * c.sk * c.d * (c.causal ? 0.5 : 1.0);
  float ms[2];
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int k = 0; k < 2; ++k) {
    RunFn f = pick(c, k == 0);
    for (int i = 0; i < 3; ++i) f(a);
    CK(cudaDeviceSynchronize());
    std::vector<float> t(reps);
    for (int i = 0; i < reps; ++i) t[i] = event_ms(nullptr, e0, e1, [&] { f(a); });
    std::sort(t.begin(), t.end());
    ms[k] = t[reps / 2];
  }
  std::printf("time  %s b%d s%-5d hq%-2d d%-3d c%d  sm90 %.3f ms %6.1f TF/s   mma %.3f ms %6.1f TF/s   x%.2f\n",
              c.bf ? "bf16" : "f16 ", c.b, c.sq, c.hq, c.d, c.causal, ms[0], flops / ms[0] * 1e-9, ms[1],
              flops / ms[1] * 1e-9, ms[1] / ms[0]);
  release(B);
}

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 20;
  std::mt19937 rng(1234);
  const Case cases[] = {
      {2, 300, 500, 4, 2, 128, 0, true},  {2, 300, 500, 4, 2, 128, 1, true},  {2, 513, 200, 4, 4, 128, 1, true},
      {2, 513, 200, 4, 4, 128, 0, false}, {1, 1000, 1000, 8, 1, 128, 1, false}, {1, 77, 77, 2, 2, 128, 1, true},
      {2, 200, 1, 4, 2, 128, 1, true},    {2, 200, 1, 4, 2, 128, 0, true},    {2, 257, 333, 4, 2, 64, 0, true},
      {2, 257, 333, 4, 2, 64, 1, true},   {2, 129, 421, 4, 2, 256, 0, true},  {2, 129, 421, 4, 2, 256, 1, true},
      {2, 300, 170, 4, 1, 256, 1, false}, {1, 1024, 1024, 4, 4, 128, 0, true}, {1, 1024, 1024, 4, 4, 128, 1, true},
      {1, 640, 2048, 4, 2, 64, 1, false},
  };
  const int all = int(sizeof cases / sizeof cases[0]);
  const int ncases = argc > 2 ? std::min(std::atoi(argv[2]), all) : all;
  int fails = 0;
  for (int i = 0; i < ncases; ++i) fails += !check(cases[i], rng, true);
  if (reps > 0) check(cases[1], rng, false);  // the reference against the mma.sync kernel, for scale
  const Case perf[] = {
      {4, 1024, 1024, 32, 32, 128, 0, true}, {4, 1024, 1024, 32, 32, 128, 1, true},
      {4, 4096, 4096, 32, 32, 128, 0, true}, {4, 4096, 4096, 32, 32, 128, 1, true},
      {4, 8192, 8192, 32, 32, 128, 0, true}, {4, 8192, 8192, 32, 32, 128, 1, true},
      {4, 4096, 4096, 32, 32, 64, 0, true},  {4, 4096, 4096, 32, 32, 128, 0, false},
      {4, 1024, 1024, 32, 32, 256, 0, true}, {4, 1024, 1024, 32, 32, 256, 1, true},
      {4, 4096, 4096, 32, 32, 256, 0, true}, {4, 4096, 4096, 32, 32, 256, 1, true},
      {4, 8192, 8192, 32, 32, 256, 0, true}, {4, 8192, 8192, 32, 32, 256, 1, true},
  };
  const int only_d = argc > 3 ? std::atoi(argv[3]) : 0;  // time this head dim only (0: all)
  if (reps > 0)
    for (const Case& c : perf)
      if (only_d == 0 || c.d == only_d) timing(c, rng, reps);
  std::printf("%s: %d failing case(s)\n", fails ? "FAIL" : "PASS", fails);
  return fails ? 1 : 0;
}
