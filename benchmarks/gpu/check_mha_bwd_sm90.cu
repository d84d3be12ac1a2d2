// Standalone check and timing of the Hopper attention backward (csrc/kernels/mha/mha_bwd_sm90.cuh,
// head_dim 256: mha_bwd_sm90_d256.cuh) against the mma.sync backward (mha_bwd_gpu.cuh) and, for
// the small cases, against a float64 host reference; bfloat16 and float16, random data; no JAX.
//
//   nvcc -std=c++17 -O3 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a \
//        -Icsrc/include -Icsrc/kernels -isystem <nvidia-cutlass>/cutlass_library/source/include \
//        -DJA_HAS_GPU=1 -DJA_BACKEND_CUDA=1 -DNDEBUG benchmarks/gpu/check_mha_bwd_sm90.cu -o check_mha_bwd_sm90
//   ./check_mha_bwd_sm90 [reps] [cases] [head_dim] [batch seq heads_q heads_kv]
//     reps 0: no timing; cases N: the first N checks only; head_dim: time only that head dim;
//     a shape (with head_dim 128 or 256): time only it, causal and not (e.g. the model bench's
//     Gemma-like train step: 20 0 256 4 2048 16 8)
//
// o and lse come from the mma.sync forward. The Hopper outputs are filled with NaN first; each
// gradient is compared by ||x - ref|| / ||ref|| with the bounds of tests/ops/reference.py
// (bfloat16 1e-2, float16 2e-3) against float64, 2e-2 against the mma.sync path. The timing
// table gives the whole backward (preprocess, main kernel, dQ conversion) of both paths in ms,
// b4 h32, seq 1k-8k, inputs of a device-side hash (no comparison there).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
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

static int g_fail = 0;

template <typename T>
static std::vector<double> to_host(const T* d, size_t n) {
  std::vector<T> h(n);
  CK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  std::vector<double> r(n);
  for (size_t i = 0; i < n; ++i) r[i] = ja::to_f32(h[i]);
  return r;
}

// float64 gradients of softmax(Q K^T * scale) V (bottom-right causal; rows without a visible
// key give 0; GQA heads summed into their kv head), layouts [b, s, h, d].
struct Ref {
  std::vector<double> dq, dk, dv;
};
static Ref reference(const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
                     const std::vector<double>& g, int B, int sq, int sk, int hq, int hkv, int D, bool causal,
                     double scale) {
  Ref r{std::vector<double>(q.size()), std::vector<double>(k.size()), std::vector<double>(k.size())};
  std::vector<double> p(sk), dp(sk);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < hq; ++h) {
      const int hk = h / (hq / hkv);
      auto Q = [&](int i) { return &q[((size_t(b) * sq + i) * hq + h) * D]; };
      auto G = [&](int i) { return &g[((size_t(b) * sq + i) * hq + h) * D]; };
      auto K = [&](const std::vector<double>& x, int j) { return &x[((size_t(b) * sk + j) * hkv + hk) * D]; };
      for (int i = 0; i < sq; ++i) {
        const int last = causal ? i + sk - sq : sk - 1;  // keys [0, last] visible
        if (last < 0) continue;
        double mx = -1e300, sum = 0, delta = 0;
        for (int j = 0; j <= last; ++j) {
          double dot = 0;
          for (int c = 0; c < D; ++c) dot += Q(i)[c] * K(k, j)[c];
          p[j] = dot * scale;
          mx = std::max(mx, p[j]);
        }
        for (int j = 0; j <= last; ++j) sum += (p[j] = std::exp(p[j] - mx));
        for (int j = 0; j <= last; ++j) {
          p[j] /= sum;
          double dot = 0;
          for (int c = 0; c < D; ++c) dot += G(i)[c] * K(v, j)[c];
          dp[j] = dot;
          delta += p[j] * dot;
        }
        double* dq = &r.dq[((size_t(b) * sq + i) * hq + h) * D];
        for (int j = 0; j <= last; ++j) {
          const double ds = p[j] * (dp[j] - delta);
          double* dk = &r.dk[((size_t(b) * sk + j) * hkv + hk) * D];
          double* dv = &r.dv[((size_t(b) * sk + j) * hkv + hk) * D];
          for (int c = 0; c < D; ++c) {
            dq[c] += scale * ds * K(k, j)[c];
            dk[c] += scale * ds * Q(i)[c];
            dv[c] += p[j] * G(i)[c];
          }
        }
      }
    }
  return r;
}

static bool cmp(const char* name, const std::vector<double>& r, const std::vector<double>& x, double bound) {
  double num = 0, den = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    num += (x[i] - r[i]) * (x[i] - r[i]);
    den += r[i] * r[i];
  }
  const double rel = std::sqrt(num / (den > 0 ? den : 1));
  const bool ok = rel < bound;  // NaN fails
  if (!ok) g_fail = 1;
  std::printf(" %s %.2e%s", name, rel, ok ? "" : " FAIL");
  return ok;
}

// mode 0: check against the mma.sync path (and float64 when ref64); mode > 0: time with reps = mode.
template <typename T, int D, bool C>
void run_case(int B, int sq, int sk, int hq, int hkv, int reps, bool ref64 = false) {
  const size_t nq = size_t(B) * sq * hq * D, nk = size_t(B) * sk * hkv * D, nl = size_t(B) * hq * sq;
  T *q, *k, *v, *o, *dout, *dq[2], *dk[2], *dv[2];
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
  const uint32_t seed = 1234u + uint32_t(sq * 7 + sk + D);
  fill_random<T><<<1024, 256>>>(q, int64_t(nq), seed);
  fill_random<T><<<1024, 256>>>(k, int64_t(nk), seed + 1);
  fill_random<T><<<1024, 256>>>(v, int64_t(nk), seed + 2);
  fill_random<T><<<1024, 256>>>(dout, int64_t(nq), seed + 3);
  CK(cudaGetLastError());
  const float scale = 1.0f / std::sqrt(float(D));
  JaMhaFwdArgs fa{};
  fa.p.dtype = int32_t(ja::dtype_of<T>::value);
  fa.p.batch = B, fa.p.seq_q = sq, fa.p.seq_k = sk, fa.p.heads_q = hq, fa.p.heads_kv = hkv;
  fa.p.head_dim = fa.p.head_dim_v = D;
  fa.p.mask = C ? ja::kMaskCausal : ja::kMaskNone, fa.p.scale = scale;
  fa.q = q, fa.k = k, fa.v = v, fa.o = o, fa.lse = lse;
  fa.workspace = nullptr, fa.workspace_bytes = 0;
  CE((ja::mha_fwd_gpu<T, D, C>(fa, nullptr)));
  JaMhaBwdArgs a{};
  a.p = fa.p;
  a.q = q, a.k = k, a.v = v, a.o = o, a.dout = dout, a.lse = lse;
  a.dq_accum = acc, a.delta = delta;
  auto set_out = [&](int i) { a.dq = dq[i], a.dk = dk[i], a.dv = dv[i]; };
  const char* dt = std::is_same<T, ja::bf16_t>::value ? "bf16" : "f16";
  std::printf("%s b%d sq%d sk%d hq%d hkv%d d%d c%d:", dt, B, sq, sk, hq, hkv, D, int(C));
  int handled = 0;
  if (reps == 0) {
    set_out(0);
    CE((ja::mha_bwd_gpu<T, D, C>(a, nullptr)));
    set_out(1);
    CK(cudaMemset(dq[1], 0xff, nq * 2));  // NaN
    CK(cudaMemset(dk[1], 0xff, nk * 2));
    CK(cudaMemset(dv[1], 0xff, nk * 2));
    CE((ja::mha_sm90::mha_bwd_sm90<T, D, C>(a, nullptr, &handled)));
    CK(cudaDeviceSynchronize());
    if (!handled) {
      std::printf(" not handled FAIL\n");
      g_fail = 1;
      return;
    }
    const auto mdq = to_host(dq[0], nq), mdk = to_host(dk[0], nk), mdv = to_host(dv[0], nk);
    const auto hdq = to_host(dq[1], nq), hdk = to_host(dk[1], nk), hdv = to_host(dv[1], nk);
    std::printf(" vs mma:");
    cmp("dq", mdq, hdq, 2e-2);
    cmp("dk", mdk, hdk, 2e-2);
    cmp("dv", mdv, hdv, 2e-2);
    if (ref64) {
      const double bound = std::is_same<T, ja::bf16_t>::value ? 1e-2 : 2e-3;
      const Ref r = reference(to_host(q, nq), to_host(k, nk), to_host(v, nk), to_host(dout, nq), B, sq, sk, hq, hkv,
                              D, C, scale);
      std::printf(" | f64: sm90");
      cmp("dq", r.dq, hdq, bound);
      cmp("dk", r.dk, hdk, bound);
      cmp("dv", r.dv, hdv, bound);
      std::printf(" mma");
      cmp("dq", r.dq, mdq, bound);
      cmp("dk", r.dk, mdk, bound);
      cmp("dv", r.dv, mdv, bound);
    }
  } else {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float t[3];
    for (int i = 0; i < 3; ++i) {
      set_out(i == 0 ? 0 : 1);
      auto call = [&]() {
        if (i == 0) CE((ja::mha_bwd_gpu<T, D, C>(a, nullptr)));
        else if (i == 1) CE((ja::mha_sm90::mha_bwd_sm90<T, D, C>(a, nullptr, &handled)));
        else if constexpr (D == 256) CE((ja::mha_sm90::mha_bwd_sm90_d256_launch<T, C>(a, nullptr)));
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
  using ja::bf16_t;
  using ja::f16_t;
  const int reps = argc > 1 ? std::atoi(argv[1]) : 10;
  const int ncases = argc > 2 ? std::atoi(argv[2]) : 1000;
  const int time_d = argc > 3 ? std::atoi(argv[3]) : 0;
  int n = 0;
#define CASE(T, D, C, REF, ...) \
  if (n++ < ncases) run_case<T, D, C>(__VA_ARGS__, 0, REF);
  CASE(bf16_t, 256, false, true, 1, 128, 128, 2, 2)
  CASE(bf16_t, 256, true, true, 1, 128, 128, 2, 1)
  CASE(bf16_t, 256, false, true, 2, 200, 333, 4, 2)
  CASE(bf16_t, 256, true, true, 2, 200, 333, 4, 2)
  CASE(f16_t, 256, true, true, 1, 333, 200, 4, 1)
  CASE(f16_t, 256, false, true, 2, 65, 63, 4, 4)
  CASE(bf16_t, 256, true, true, 1, 1, 300, 4, 4)
  CASE(f16_t, 256, true, true, 1, 20, 5, 2, 2)
  CASE(bf16_t, 256, true, false, 2, 1024, 1024, 8, 2)
  CASE(f16_t, 256, false, false, 1, 1000, 1000, 8, 1)
  CASE(bf16_t, 128, false, true, 1, 128, 128, 2, 2)
  CASE(bf16_t, 128, true, false, 1, 128, 128, 2, 1)
  CASE(bf16_t, 128, false, false, 2, 200, 333, 4, 2)
  CASE(bf16_t, 128, true, true, 2, 200, 333, 4, 2)
  CASE(f16_t, 128, true, false, 1, 333, 200, 4, 1)
  CASE(bf16_t, 64, false, false, 2, 257, 190, 4, 2)
  CASE(bf16_t, 64, true, false, 2, 190, 257, 4, 4)
  CASE(bf16_t, 128, true, false, 2, 1024, 1024, 8, 2)
#undef CASE
  if (reps > 0 && argc > 7) {
    const int B = std::atoi(argv[4]), S = std::atoi(argv[5]), HQ = std::atoi(argv[6]), HKV = std::atoi(argv[7]);
    if (B <= 0 || S <= 0 || HQ <= 0 || HKV <= 0 || HQ % HKV != 0 || (time_d != 128 && time_d != 256)) {
      std::printf("usage: %s reps cases head_dim(128|256) batch seq heads_q heads_kv"
                  " (heads_q a multiple of heads_kv)\n", argv[0]);
      return 2;
    }
    if (time_d == 256) {
      run_case<bf16_t, 256, true>(B, S, S, HQ, HKV, reps);
      run_case<bf16_t, 256, false>(B, S, S, HQ, HKV, reps);
    } else {
      run_case<bf16_t, 128, true>(B, S, S, HQ, HKV, reps);
      run_case<bf16_t, 128, false>(B, S, S, HQ, HKV, reps);
    }
  } else if (reps > 0) {
    for (int s : {1024, 2048, 4096, 8192}) {
      if (time_d == 0 || time_d == 256) {
        run_case<bf16_t, 256, false>(4, s, s, 32, 32, reps);
        run_case<bf16_t, 256, true>(4, s, s, 32, 32, reps);
      }
      if (time_d == 0 || time_d == 128) {
        run_case<bf16_t, 128, false>(4, s, s, 32, 32, reps);
        run_case<bf16_t, 128, true>(4, s, s, 32, 32, reps);
      }
    }
  }
  std::printf(g_fail ? "FAILED\n" : "ALL OK\n");
  return g_fail;
}
