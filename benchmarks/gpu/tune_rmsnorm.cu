// RMSNorm and SiLU-and-mul launch-shape sweep on one GPU: the shipped kernel templates
// (csrc/kernels/rmsnorm/rmsnorm_gpu.cuh, csrc/kernels/activation/silu_and_mul_gpu.cuh)
// under several block shapes, timed with CUDA events against a device-to-device copy of
// the same bytes measured in the same run.
//
//   nvcc -O3 -std=c++17 --expt-relaxed-constexpr -arch=sm_90 -Icsrc/include -Icsrc/kernels \
//        -DJA_HAS_GPU=1 -DJA_BACKEND_CUDA=1 benchmarks/gpu/tune_rmsnorm.cu -o build/tune_rmsnorm \
//        -Lbuild/jax_aiter_build -ljax_aiter -Xlinker -rpath=$PWD/build/jax_aiter_build
//   build/tune_rmsnorm [reps] [hidden] [small]
//
// "small" (for compute-sanitizer) takes rows 1, 5 and 129 instead of 1k-32k, and hidden 1000
// too (the streaming path); hidden 0 means every hidden size.
//
// Inputs are random bf16, rotated among sets, and every timed launch starts with a cold
// L2 (256 MiB read between launches, outside the events), as bench_gpu.py times; each
// variant's output is compared with the default launch's (max |diff| in bf16 ulps of the
// value) so a shape that computes something else cannot win. Prints one line per
// (case, variant): median microseconds and fraction of the same-size copy. Used to choose
// the launch tables in rmsnorm_fwd_gpu and silu_and_mul_gpu; not part of the build.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "activation/silu_and_mul_gpu.cuh"
#include "rmsnorm/rmsnorm_gpu.cuh"
#include "harness.cuh"

using T = ja::bf16_t;
constexpr int kSets = 4;

// Reads n 16-byte vectors (the L2 flush): leaves L2 full of clean lines of this buffer.
__global__ void flush_kernel(const uint4* p, int64_t n, uint32_t* sink) {
  uint32_t acc = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) sink[blockIdx.x] = acc;
}

struct Case {
  int64_t rows, hidden;
  bool residual;
};

template <int THREADS, int REGS, int RPB, int MINB, int WMODE = ja::kWeightAfter>
void launch(const JaRmsNormArgs& a, cudaStream_t s) {
  if (a.residual) ja::rmsnorm_launch<T, true, THREADS, REGS, RPB, MINB, WMODE>(a, s);
  else ja::rmsnorm_launch<T, false, THREADS, REGS, RPB, MINB, WMODE>(a, s);
}

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 30;
  const int64_t only_hidden = argc > 2 ? std::atoll(argv[2]) : 0;
  const bool small = argc > 3 && std::string(argv[3]) == "small";
  const std::vector<int64_t> row_list =
      small ? std::vector<int64_t>{1, 5, 129} : std::vector<int64_t>{1024, 2048, 4096, 8192, 16384, 32768};
  const std::vector<int64_t> hidden_list =
      small ? std::vector<int64_t>{4096, 5120, 7168, 8192, 1000} : std::vector<int64_t>{4096, 5120, 7168, 8192};
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const int64_t flush_n = (int64_t(256) << 20) / 16;
  uint4* flush_buf;
  uint32_t* sink;
  CK(cudaMalloc(&flush_buf, flush_n * 16));
  CK(cudaMemset(flush_buf, 0, flush_n * 16));
  CK(cudaMalloc(&sink, 1 << 20));
  auto time_us = [&](const std::function<void(int)>& f) {
    for (int i = 0; i < 3; ++i) f(i % kSets);
    std::vector<float> t;
    for (int r = 0; r < reps; ++r) {
      flush_kernel<<<132 * 4, 512, 0, s>>>(flush_buf, flush_n, sink);
      t.push_back(event_ms(s, e0, e1, [&] { f(r % kSets); }) * 1000.0f);
    }
    CK(cudaGetLastError());
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  };
  for (int pdl : {1, 0}) {  // through launch_pdl, which launches plainly when pdl_force() is 0
    ja::pdl_force() = pdl;
    const float ev = time_us([&](int) {
      ja::launch_pdl(flush_kernel, dim3(1), dim3(32), 0, s, static_cast<const uint4*>(flush_buf), int64_t(0), sink);
    });
    std::printf("empty launch (%s) between events: %.1f us\n", pdl ? "PDL" : "no PDL", ev);
  }
  ja::pdl_force() = -1;

  // Hidden sizes of common models x rows from 1k to 32k (bench_gpu.py's grid), with and without
  // a residual; argv[2], if given, keeps only the cases of that hidden size.
  std::vector<Case> cases;
  for (int64_t hidden : hidden_list)
    for (int64_t rows : row_list)
      for (bool res : {false, true})
        if (!only_hidden || hidden == only_hidden) cases.push_back({rows, hidden, res});
  for (const Case& c : cases) {
    const int64_t n = c.rows * c.hidden;
    std::vector<T*> x(kSets), r(kSets), o(kSets), ro(kSets);
    T *w, *ref;
    for (int i = 0; i < kSets; ++i) {
      CK(cudaMalloc(&x[i], n * sizeof(T)));
      CK(cudaMalloc(&r[i], n * sizeof(T)));
      CK(cudaMalloc(&o[i], n * sizeof(T)));
      CK(cudaMalloc(&ro[i], n * sizeof(T)));
      fill_random<<<1024, 256, 0, s>>>(x[i], n, 17u + i);
      fill_random<<<1024, 256, 0, s>>>(r[i], n, 91u + i);
    }
    CK(cudaMalloc(&w, c.hidden * sizeof(T)));
    CK(cudaMalloc(&ref, n * sizeof(T)));
    fill_random<<<64, 256, 0, s>>>(w, c.hidden, 5u);
    auto args = [&](int i) {
      JaRmsNormArgs a{};
      a.rows = c.rows, a.hidden = c.hidden, a.x = x[i], a.weight = w, a.out = o[i], a.eps = 1e-6f;
      a.residual = c.residual ? r[i] : nullptr;
      a.residual_out = c.residual ? ro[i] : nullptr;
      return a;
    };
    // Copy ceiling: the same bytes this case reads and writes, as one memcpy each of x (and residual).
    const double bytes = double(n) * sizeof(T) * (c.residual ? 4 : 2);
    const float copy_us = time_us([&](int i) {
      CK(cudaMemcpyAsync(o[i], x[i], n * sizeof(T), cudaMemcpyDeviceToDevice, s));
      if (c.residual) CK(cudaMemcpyAsync(ro[i], r[i], n * sizeof(T), cudaMemcpyDeviceToDevice, s));
    });
    std::printf("rmsnorm rows=%lld hidden=%lld residual=%d: copy %.1f us (%.0f GB/s)\n", (long long)c.rows,
                (long long)c.hidden, int(c.residual), copy_us, bytes / copy_us * 1e-3);
    {
      JaRmsNormArgs a = args(0);
      CK(cudaGetLastError());
      if (const char* err = ja::rmsnorm_fwd_gpu<T>(a, s)) {
        std::fprintf(stderr, "%s\n", err);
        return 1;
      }
      CK(cudaMemcpyAsync(ref, o[0], n * sizeof(T), cudaMemcpyDeviceToDevice, s));
      CK(cudaStreamSynchronize(s));
    }
    const int64_t nc = std::min<int64_t>(n, 512 * c.hidden);  // the rows compared: the first 512
    std::vector<T> h_ref(nc), h_out(nc);
    CK(cudaMemcpy(h_ref.data(), ref, nc * sizeof(T), cudaMemcpyDeviceToHost));
    auto check = [&]() {
      CK(cudaMemcpy(h_out.data(), o[0], nc * sizeof(T), cudaMemcpyDeviceToHost));
      double worst = 0;
      for (int64_t i = 0; i < nc; ++i) {
        const double a = ja::to_f32(h_out[i]), b = ja::to_f32(h_ref[i]);
        if (!(std::fabs(a - b) <= 1e30)) return 1e30;
        worst = std::max(worst, std::fabs(a - b) / std::max(std::fabs(b) * 0x1p-8, 1e-30));
      }
      return worst;
    };
    struct Variant {
      std::string name;
      std::function<void(const JaRmsNormArgs&, cudaStream_t)> f;
    };
    const int nvec = int(c.hidden / 8);
    std::vector<Variant> vs = {
        {"default", [](const JaRmsNormArgs& a, cudaStream_t st) { ja::rmsnorm_fwd_gpu<T>(a, st); }}};
    auto add = [&](const char* tag, int threads, int regs, int rpb, int minb, auto fn) {
      if (threads * regs >= nvec && threads * (regs - 1) < nvec)
        vs.push_back({std::string(tag) + "t" + std::to_string(threads) + "r" + std::to_string(regs) + "p" +
                          std::to_string(rpb) + "b" + std::to_string(minb),
                      fn});
    };
    // Block shapes (threads x vectors per thread) that hold a row of 512, 640, 896 or 1024
    // vectors (hidden 4096, 5120, 7168, 8192 in bf16), several exactly, x 1, 2 or 4 rows per block, and
    // for one-row blocks the weight read after the reduction or held in registers across it (wr).
#define JA_TUNE(t, r, b)                                       \
  add("", t, r, 1, b, launch<t, r, 1, b>);                     \
  add("wr", t, r, 1, b, launch<t, r, 1, b, ja::kWeightEarly>); \
  add("", t, r, 2, b, launch<t, r, 2, b>);                     \
  add("", t, r, 4, b, launch<t, r, 4, b>)
    JA_TUNE(128, 4, 1);
    JA_TUNE(256, 2, 1);
    JA_TUNE(512, 1, 1);
    JA_TUNE(160, 4, 1);
    JA_TUNE(320, 2, 1);
    JA_TUNE(640, 1, 1);
    JA_TUNE(224, 4, 1);
    JA_TUNE(448, 2, 1);
    JA_TUNE(128, 7, 1);
    JA_TUNE(256, 4, 1);
    JA_TUNE(512, 2, 1);
    JA_TUNE(1024, 1, 1);
    vs.push_back({"default-nopdl", [](const JaRmsNormArgs& a, cudaStream_t st) {
                    ja::pdl_force() = 0;
                    ja::rmsnorm_fwd_gpu<T>(a, st);
                    ja::pdl_force() = -1;
                  }});
    for (const Variant& v : vs) {
      CK(cudaMemsetAsync(o[0], 0xff, n * sizeof(T), s));
      v.f(args(0), s);
      CK(cudaStreamSynchronize(s));
      CK(cudaGetLastError());
      const double err = check();
      const float us = time_us([&](int i) { v.f(args(i), s); });
      std::printf("  %-14s %8.1f us  %.3f of copy  max diff %.2f ulp\n", v.name.c_str(), us, copy_us / us, err);
    }
    // 8 back-to-back launches of the shipped dispatch, each reading the previous one's output (as
    // a model's layers run it), with programmatic dependent launch off and on (gpu_launch.cuh).
    for (int pdl : {0, 1}) {
      ja::pdl_force() = pdl;
      const float us = time_us([&](int i) {
        for (int k = 0; k < 8; ++k) {
          JaRmsNormArgs a = args(i);
          if (k % 2) {
            a.x = o[i], a.out = x[i];
            if (c.residual) a.residual = ro[i], a.residual_out = r[i];
          } else if (c.residual) {
            a.residual_out = ro[i];
          }
          ja::rmsnorm_fwd_gpu<T>(a, s);
        }
      });
      std::printf("  chain8 pdl=%d %8.1f us  %.3f of copy (per call %.1f us)\n", pdl, us, 8 * copy_us / us, us / 8);
    }
    ja::pdl_force() = -1;
    for (int i = 0; i < kSets; ++i) {
      CK(cudaFree(x[i]));
      CK(cudaFree(r[i]));
      CK(cudaFree(o[i]));
      CK(cudaFree(ro[i]));
    }
    CK(cudaFree(w));
    CK(cudaFree(ref));
  }

  // SiLU-and-mul: [rows, 2 h] -> [rows, h]; the shipped dispatch against other block shapes.
  for (int64_t hidden : hidden_list)
    for (int64_t rows : row_list) {
      if (only_hidden && hidden != only_hidden) continue;
      const int64_t n = rows * hidden;
      std::vector<T*> x(kSets), o(kSets);
      for (int i = 0; i < kSets; ++i) {
        CK(cudaMalloc(&x[i], 2 * n * sizeof(T)));
        CK(cudaMalloc(&o[i], n * sizeof(T)));
        fill_random<<<1024, 256, 0, s>>>(x[i], 2 * n, 33u + i);
      }
      auto args = [&](int i) {
        JaSiluAndMulArgs a{};
        a.rows = rows, a.d = hidden, a.x = x[i], a.out = o[i];
        return a;
      };
      const float copy_us = time_us([&](int i) {  // the same bytes: 2 n read, n written
        CK(cudaMemcpyAsync(o[i], x[i], n * sizeof(T), cudaMemcpyDeviceToDevice, s));
        CK(cudaMemcpyAsync(o[(i + 1) % kSets], x[i] + n, n / 2 * sizeof(T), cudaMemcpyDeviceToDevice, s));
      });
      std::printf("silu rows=%lld hidden=%lld: copy %.1f us (%.0f GB/s)\n", (long long)rows, (long long)hidden, copy_us,
                  3.0 * n * sizeof(T) / copy_us * 1e-3);
      const int64_t nc = std::min<int64_t>(n, 512 * hidden);  // the rows compared: the first 512
      std::vector<T> h_ref(nc), h_out(nc);
      CK(cudaMemsetAsync(o[0], 0xff, n * sizeof(T), s));
      ja::silu_and_mul_gpu<T>(args(0), s);
      CK(cudaStreamSynchronize(s));
      CK(cudaMemcpy(h_ref.data(), o[0], nc * sizeof(T), cudaMemcpyDeviceToHost));
      struct SVariant {
        std::string name;
        std::function<void(const JaSiluAndMulArgs&, cudaStream_t)> f;
      };
      std::vector<SVariant> vs = {
          {"default", [](const JaSiluAndMulArgs& a, cudaStream_t st) { ja::silu_and_mul_gpu<T>(a, st); }}};
      auto add = [&](int threads, auto unroll_tag) {
        constexpr int U = decltype(unroll_tag)::value;
        vs.push_back({"t" + std::to_string(threads) + "u" + std::to_string(U),
                      [threads](const JaSiluAndMulArgs& a, cudaStream_t st) {
                        const int64_t dv = a.d / 8;
                        const dim3 grid(unsigned((dv + threads * U - 1) / (threads * U)),
                                        unsigned(std::min<int64_t>(a.rows, 65535)));
                        ja::launch_pdl(ja::silu_and_mul_vec_kernel<T, U>, grid, dim3(threads), 0, st, a);
                      }});
      };
      for (int threads : {64, 128, 256, 512}) {
        add(threads, std::integral_constant<int, 1>{});
        add(threads, std::integral_constant<int, 2>{});
        add(threads, std::integral_constant<int, 4>{});
      }
      for (const SVariant& v : vs) {
        CK(cudaMemsetAsync(o[0], 0xff, n * sizeof(T), s));
        v.f(args(0), s);
        CK(cudaStreamSynchronize(s));
        CK(cudaGetLastError());
        CK(cudaMemcpy(h_out.data(), o[0], nc * sizeof(T), cudaMemcpyDeviceToHost));
        double worst = 0;
        for (int64_t i = 0; i < nc; ++i) {
          const double a = ja::to_f32(h_out[i]), b = ja::to_f32(h_ref[i]);
          worst = !(std::fabs(a - b) <= 1e30) ? 1e30 : std::max(worst, std::fabs(a - b));
        }
        const float us = time_us([&](int i) { v.f(args(i), s); });
        std::printf("  %-14s %8.1f us  %.3f of copy  max diff %.2g\n", v.name.c_str(), us, copy_us / us, worst);
      }
      for (int i = 0; i < kSets; ++i) {
        CK(cudaFree(x[i]));
        CK(cudaFree(o[i]));
      }
    }
  return 0;
}
