// Standalone check and timing of the Hopper attention backward (csrc/kernels/mha/mha_bwd_sm90.cuh)
// against the mma.sync backward (mha_bwd_gpu.cuh, itself tested against a float64 reference
// by tests/ops/test_attention.py), bfloat16, on random data; no JAX.
//
//   nvcc -std=c++17 -O3 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a \
//        -Icsrc/include -Icsrc/kernels -isystem <nvidia-cutlass>/cutlass_library/source/include \
//        -DJA_HAS_GPU=1 -DJA_BACKEND_CUDA=1 -DNDEBUG benchmarks/gpu/check_mha_bwd_sm90.cu -o check_mha_bwd_sm90
//   ./check_mha_bwd_sm90 [reps] [cases]     (reps 0: no timing; cases N: the first N checks only)
//
// o and lse come from the mma.sync forward. The Hopper outputs are filled with NaN first; each
// gradient is compared by ||x - ref|| / ||ref||. The timing table gives the whole backward
// (preprocess, main kernel, dQ conversion) of both paths in ms.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "mha/mha_fwd_gpu.cuh"
#include "mha/mha_bwd_sm90.cuh"
#include "harness.cuh"

#define CE(x)                                  \
  do {                                         \
    const char* m_ = (x);                      \
    if (m_) {                                  \
      std::printf("error: %s\n", m_);          \
      std::exit(2);                            \
    }                                          \
  } while (0)

static uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);
  return uint16_t(u >> 16);
}
static float from_bf16(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

static int g_fail = 0;

template <int D, bool C>
void run_case(int B, int sq, int sk, int hq, int hkv, int reps) {
  using T = ja::bf16_t;
  const size_t nq = size_t(B) * sq * hq * D, nk = size_t(B) * sk * hkv * D, nl = size_t(B) * hq * sq;
  uint64_t rng = 0x9e3779b97f4a7c15ull * uint64_t(1234 + sq * 7 + sk);
  auto rnd = [&](size_t n) {  // uniform in [-1, 1), xorshift64* (fast enough for the 8k cases)
    std::vector<uint16_t> v(n);
    for (auto& x : v) {
      rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
      x = to_bf16(float(int64_t(rng * 0x2545f4914f6cdd1dull) >> 40) * 0x1p-23f);
    }
    return v;
  };
  auto hq_ = rnd(nq), hk_ = rnd(nk), hv_ = rnd(nk), hdo = rnd(nq);
  uint16_t *q, *k, *v, *o, *dout, *dq[2], *dk[2], *dv[2];
  float *lse, *acc, *delta;
  CK(cudaMalloc(&q, nq * 2));
  CK(cudaMalloc(&o, nq * 2));
  CK(cudaMalloc(&dout, nq * 2));
  CK(cudaMalloc(&k, nk * 2));
  CK(cudaMalloc(&v, nk * 2));
  for (int i = 0; i < 2; ++i) {
    CK(cudaMalloc(&dq[i], nq * 2));
    CK(cudaMalloc(&dk[i], nk * 2));
    CK(cudaMalloc(&dv[i], nk * 2));
  }
  CK(cudaMalloc(&lse, nl * 4));
  CK(cudaMalloc(&delta, nl * 4));
  CK(cudaMalloc(&acc, nq * 4));
  CK(cudaMemcpy(q, hq_.data(), nq * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(k, hk_.data(), nk * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(v, hv_.data(), nk * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dout, hdo.data(), nq * 2, cudaMemcpyHostToDevice));
  const float scale = 1.0f / std::sqrt(float(D));
  JaMhaFwdArgs fa{};
  fa.dtype = int32_t(ja::dtype_of<T>::value);
  fa.batch = B, fa.seq_q = sq, fa.seq_k = sk, fa.heads_q = hq, fa.heads_kv = hkv, fa.head_dim = D;
  fa.causal = C, fa.scale = scale, fa.q = q, fa.k = k, fa.v = v, fa.o = o, fa.lse = lse;
  fa.workspace = nullptr, fa.workspace_bytes = 0;
  CE((ja::mha_fwd_gpu<T, D, C>(fa, nullptr)));
  JaMhaBwdArgs a{};
  a.dtype = fa.dtype;
  a.batch = B, a.seq_q = sq, a.seq_k = sk, a.heads_q = hq, a.heads_kv = hkv, a.head_dim = D;
  a.causal = C, a.scale = scale, a.q = q, a.k = k, a.v = v, a.o = o, a.dout = dout, a.lse = lse;
  a.dq_accum = acc, a.delta = delta;
  auto set_out = [&](int i) { a.dq = dq[i], a.dk = dk[i], a.dv = dv[i]; };
  set_out(0);
  CE((ja::mha_bwd_gpu<T, D, C>(a, nullptr)));
  set_out(1);
  CK(cudaMemset(dq[1], 0xff, nq * 2));  // NaN
  CK(cudaMemset(dk[1], 0xff, nk * 2));
  CK(cudaMemset(dv[1], 0xff, nk * 2));
  int handled = 0;
  CE((ja::mha_sm90::mha_bwd_sm90<T, D, C>(a, nullptr, &handled)));
  CK(cudaDeviceSynchronize());
  if (!handled) {
    std::printf("not handled\n");
    g_fail = 1;
    return;
  }
  auto cmp = [&](const char* name, uint16_t* r, uint16_t* x, size_t n) {
    std::vector<uint16_t> hr(n), hx(n);
    CK(cudaMemcpy(hr.data(), r, n * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hx.data(), x, n * 2, cudaMemcpyDeviceToHost));
    double num = 0, den = 0;
    for (size_t i = 0; i < n; ++i) {
      const double fr = from_bf16(hr[i]), fx = from_bf16(hx[i]);
      num += (fx - fr) * (fx - fr);
      den += fr * fr;
    }
    const double rel = std::sqrt(num / (den > 0 ? den : 1));
    const bool ok = rel < 2e-2;  // NaN fails
    if (!ok) g_fail = 1;
    std::printf(" %s %.2e%s", name, rel, ok ? "" : " FAIL");
  };
  std::printf("b%d sq%d sk%d hq%d hkv%d d%d c%d:", B, sq, sk, hq, hkv, D, int(C));
  cmp("dq", dq[0], dq[1], nq);
  cmp("dk", dk[0], dk[1], nk);
  cmp("dv", dv[0], dv[1], nk);
  if (reps > 0) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float t[3];
    for (int i = 0; i < 3; ++i) {
      set_out(i == 0 ? 0 : 1);
      auto call = [&]() {
        if (i == 0) CE((ja::mha_bwd_gpu<T, D, C>(a, nullptr)));
        else if (i == 1) CE((ja::mha_sm90::mha_bwd_sm90<T, D, C>(a, nullptr, &handled)));
        else CE((ja::mha_sm90::mha_bwd_sm90_launch<T, D, C>(a, nullptr)));  // the main kernel alone
      };
      call();
      t[i] = event_ms(nullptr, e0, e1, [&] {
               for (int r = 0; r < reps; ++r) call();
             }) / reps;
    }
    const double flops = 10.0 * B * hq * double(sq) * sk * D * (C ? 0.5 : 1.0);  // 5 matmuls
    std::printf("  | mma %.3f ms  sm90 %.3f ms (%.1f TFLOP/s)  x%.2f  main kernel %.3f ms (%.1f TFLOP/s)", t[0],
                t[1], flops / t[1] * 1e-9, t[0] / t[1], t[2], flops / t[2] * 1e-9);
  }
  std::printf("\n");
  for (void* ptr : {(void*)q, (void*)k, (void*)v, (void*)o, (void*)dout, (void*)lse, (void*)delta, (void*)acc})
    CK(cudaFree(ptr));
  for (int i = 0; i < 2; ++i) {
    CK(cudaFree(dq[i]));
    CK(cudaFree(dk[i]));
    CK(cudaFree(dv[i]));
  }
}

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 10;
  const int ncases = argc > 2 ? std::atoi(argv[2]) : 1000;
  int n = 0;
#define CASE(D, C, ...) \
  if (n++ < ncases) run_case<D, C>(__VA_ARGS__, 0);
  CASE(128, false, 1, 128, 128, 2, 2)
  CASE(128, true, 1, 128, 128, 2, 1)
  CASE(128, false, 2, 200, 333, 4, 2)
  CASE(128, true, 2, 200, 333, 4, 2)
  CASE(128, true, 1, 333, 200, 4, 1)
  CASE(64, false, 2, 257, 190, 4, 2)
  CASE(64, true, 2, 190, 257, 4, 4)
  CASE(128, true, 2, 1024, 1024, 8, 2)
#undef CASE
  if (reps > 0) {
    for (int s : {1024, 4096, 8192}) {
      run_case<128, false>(4, s, s, 32, 32, reps);
      run_case<128, true>(4, s, s, 32, 32, reps);
    }
  }
  std::printf(g_fail ? "FAILED\n" : "ALL OK\n");
  return g_fail;
}
