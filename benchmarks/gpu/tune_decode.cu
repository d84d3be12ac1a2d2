// Split-KV decode on one GPU: the shipped kernel (csrc/kernels/mha/decode/fwd.cuh)
// against a library build (e.g. of the previous revision) and the memory ceilings of the same
// bytes, measured in the same run:
//   copy   a device-to-device memcpy moving the K/V bytes (half read, half written)
//   read   a read-only kernel streaming K and V contiguously (every byte read once)
//   rowsU  a read-only kernel with the decode's access pattern (block = split x U kv heads,
//          rows of U x head_dim elements at the K/V row stride), no arithmetic: what any
//          decode kernel with this layout and grid spends at least
//
//   nvcc -O3 -std=c++17 --expt-relaxed-constexpr -arch=sm_90 -Icsrc/include -Icsrc/kernels \
//        -DJA_HAS_GPU=1 -DJA_BACKEND_CUDA=1 benchmarks/gpu/tune_decode.cu -o build/tune_decode \
//        -Lbuild/jax_aiter_build -ljax_aiter -ldl -Xlinker -rpath=$PWD/build/jax_aiter_build
//   build/tune_decode [reps|check] [path/to/libmha_fwd.so]
//   (TUNE_DECODE_CASES=4 in the environment: the first four cases only, the model section's;
//    TUNE_DECODE_FIRST=N: from case N on, e.g. one case under ncu; JA_MHA_FWD_DECODE_TMA=0: the
//    shipped kernel with its cp.async loads instead of TMA on sm_90, for both modes)
//
// Each line: median microseconds of one call between two events (as bench_gpu.py times it:
// "ev"), the per-call time of 16 calls back to back ("b2b", launch gaps hidden by PDL), and
// K/V bytes over the event time against the large copy's bandwidth. Inputs are random bf16
// rotated among sets larger than L2. With a library, its ja_mha_fwd_gpu is timed too and its
// output is the reference the shipped kernel is compared with (max |diff|, output poisoned
// first).
//
// "check" runs no timing: the op tests' small decode shapes (GQA, multi-query with several
// row blocks, draft tokens, causal and not, odd lengths) against the library's output, or
// without one against float64 attention on the host; for compute-sanitizer (memcheck,
// racecheck) and for build-time variants of the kernel. It exits 1 on a mismatch.
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "mha/fwd_gpu.cuh"
#include "harness.cuh"

using T = ja::bf16_t;
constexpr int D = 128;

__global__ void empty_kernel() {}

// Contiguous read of n 16-byte vectors, 8 in flight per thread; one word per block out.
__global__ void __launch_bounds__(256) read_kernel(const uint4* p, int64_t n, uint32_t* sink) {
  uint32_t acc = 0;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  for (; i + 7 * stride < n; i += 8 * stride) {
    uint4 v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = __ldcs(p + i + j * stride);
#pragma unroll
    for (int j = 0; j < 8; ++j) acc ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
  }
  for (; i < n; i += stride) {
    const uint4 v = __ldcs(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) sink[blockIdx.x] = acc;  // practically never: keeps the loads
}

// The decode's access pattern without its arithmetic: block (split, y, b) reads keys
// [x chunk, +chunk) of kv heads [y U, y U + U) of K and V, rows of U * D elements at stride
// hkv * D, 128 threads, 8 vectors in flight per thread per tensor.
template <int U>
__global__ void __launch_bounds__(128)
    rows_kernel(const T* k, const T* v, int64_t sk, int64_t hkv, int64_t chunk, uint32_t* sink) {
  constexpr int kPerRow = U * D / 8;  // 16-byte vectors per row
  constexpr int kRowsPerIt = 128 / kPerRow;
  const int64_t b = blockIdx.z, h0 = int64_t(blockIdx.y) * U;
  const int64_t key0 = int64_t(blockIdx.x) * chunk, key1 = key0 + chunk < sk ? key0 + chunk : sk;
  const int r = threadIdx.x / kPerRow, c = threadIdx.x % kPerRow;
  const uint4* kb = reinterpret_cast<const uint4*>(k + (b * sk * hkv + h0) * D) + c;
  const uint4* vb = reinterpret_cast<const uint4*>(v + (b * sk * hkv + h0) * D) + c;
  const int64_t rs = hkv * D / 8;  // row stride in vectors
  uint32_t acc = 0;
  for (int64_t key = key0 + r; key < key1; key += 8 * kRowsPerIt) {
    uint4 x[16];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int64_t kk = key + j * kRowsPerIt;
      if (kk < key1) {
        x[j] = __ldcs(kb + kk * rs);
        x[8 + j] = __ldcs(vb + kk * rs);
      } else {
        x[j] = x[8 + j] = make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int j = 0; j < 16; ++j) acc ^= x[j].x ^ x[j].y ^ x[j].z ^ x[j].w;
  }
  if (acc == 0x12345678u) sink[blockIdx.x] = acc;
}

struct Case {
  int64_t b, hq, hkv, sk;
};

// The workspace bytes jax_aiter/ops/_attn_sizes.py gives the forward (decode_workspace_shape).
int64_t python_ws_bytes(const Case& c) {
  const int64_t rows = c.hq / c.hkv;
  if (rows > 64) return 0;
  const int64_t bpb = c.hkv * ((rows + 15) / 16);
  const int64_t splits = std::min<int64_t>({256, (2048 + c.b * bpb - 1) / (c.b * bpb), ((c.sk + 63) / 64) / 4});
  if (splits <= 1) return 0;
  return c.b * bpb * splits * 16 * (D + 1) * 4;
}

using Entry = const char* (*)(const JaMhaFwdArgs*, void*, int32_t);

// Float64 attention on the host, the check's reference without a library: bottom-right causal
// alignment, a row with no visible key outputs 0 with lse +inf (the kernels' conventions).
template <bool CAUSAL>
void host_attention(const T* q, const T* k, const T* v, int64_t b, int64_t sq, int64_t sk, int64_t hq, int64_t hkv,
                    double scale, T* o, float* lse) {
  const int64_t group = hq / hkv;
  std::vector<double> p(static_cast<size_t>(sk)), acc(D);
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t qi = 0; qi < sq; ++qi)
      for (int64_t h = 0; h < hq; ++h) {
        const T* qr = q + ((bi * sq + qi) * hq + h) * D;
        T* orow = o + ((bi * sq + qi) * hq + h) * D;
        const int64_t last = std::min(sk - 1, CAUSAL ? qi + sk - sq : sk - 1);
        double mx = -INFINITY, sum = 0.0;
        for (int64_t j = 0; j <= last; ++j) {
          const T* kr = k + ((bi * sk + j) * hkv + h / group) * D;
          double dot = 0.0;
          for (int c = 0; c < D; ++c) dot += double(ja::to_f32(qr[c])) * ja::to_f32(kr[c]);
          p[size_t(j)] = dot * scale;
          mx = std::max(mx, p[size_t(j)]);
        }
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j = 0; j <= last; ++j) {
          const double w = std::exp(p[size_t(j)] - mx);
          const T* vr = v + ((bi * sk + j) * hkv + h / group) * D;
          sum += w;
          for (int c = 0; c < D; ++c) acc[size_t(c)] += w * ja::to_f32(vr[c]);
        }
        for (int c = 0; c < D; ++c) orow[c] = ja::from_f32<T>(last < 0 ? 0.0f : float(acc[size_t(c)] / sum));
        lse[(bi * hq + h) * sq + qi] = last < 0 ? INFINITY : float(mx + std::log(sum));
      }
}

// Check mode (see the header): returns the number of mismatches.
template <bool CAUSAL>
int check_shapes(Entry lib_entry, cudaStream_t s) {
  struct C {
    int64_t b, sq, sk, hq, hkv;
  };
  const C cs[] = {{2, 1, 1, 8, 8},   {2, 1, 65, 8, 1},    {2, 1, 4097, 32, 8}, {2, 1, 3001, 32, 4}, {2, 3, 1000, 8, 2},
                  {2, 7, 501, 4, 2}, {2, 2, 2049, 32, 1}, {2, 20, 10, 4, 4},   {3, 1, 777, 32, 8},  {2, 6, 2, 8, 2}};
  int bad = 0;
  for (const C& c : cs) {
    const int64_t nq = c.b * c.sq * c.hq * D, nkv = c.b * c.sk * c.hkv * D, nl = c.b * c.hq * c.sq;
    T *q, *k, *v, *o;
    float *lse, *ws;
    const int64_t units = c.hkv * ((c.hq / c.hkv * c.sq + 15) / 16);
    const int64_t ws_bytes = c.b * units * 64 * 16 * (D + 1) * 4;
    CK(cudaMalloc(&q, nq * sizeof(T)));
    CK(cudaMalloc(&k, nkv * sizeof(T)));
    CK(cudaMalloc(&v, nkv * sizeof(T)));
    CK(cudaMalloc(&o, nq * sizeof(T)));
    CK(cudaMalloc(&lse, nl * 4));
    CK(cudaMalloc(&ws, ws_bytes));
    fill_random<<<64, 256, 0, s>>>(q, nq, 7u + c.sk);
    fill_random<<<64, 256, 0, s>>>(k, nkv, 8u + c.sk);
    fill_random<<<64, 256, 0, s>>>(v, nkv, 9u + c.sk);
    JaMhaFwdArgs a{};
    a.p.dtype = int32_t(ja::DType::kBF16);
    a.p.batch = c.b, a.p.seq_q = c.sq, a.p.seq_k = c.sk, a.p.heads_q = c.hq, a.p.heads_kv = c.hkv;
    a.p.head_dim = a.p.head_dim_v = D;
    a.p.mask = CAUSAL ? ja::kMaskCausal : ja::kMaskNone, a.p.scale = 1.0f / std::sqrt(float(D));
    a.q = q, a.k = k, a.v = v, a.o = o, a.lse = lse, a.workspace = ws, a.workspace_bytes = ws_bytes;
    std::vector<T> h_ref(nq), h_out(nq);
    std::vector<float> l_ref(nl), l_out(nl);
    auto poison = [&]() {
      CK(cudaMemsetAsync(o, 0xff, nq * sizeof(T), s));
      CK(cudaMemsetAsync(lse, 0xff, nl * 4, s));
    };
    const char* err = nullptr;
    if (lib_entry) {
      poison();
      if ((err = lib_entry(&a, s, JA_MHA_IMPL_AUTO))) {
        std::fprintf(stderr, "%s\n", err);
        std::exit(1);
      }
      CK(cudaStreamSynchronize(s));
      CK(cudaMemcpy(h_ref.data(), o, nq * sizeof(T), cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(l_ref.data(), lse, nl * 4, cudaMemcpyDeviceToHost));
    } else {
      std::vector<T> hq_(nq), hk(nkv), hv(nkv);
      CK(cudaStreamSynchronize(s));
      CK(cudaMemcpy(hq_.data(), q, nq * sizeof(T), cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(hk.data(), k, nkv * sizeof(T), cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(hv.data(), v, nkv * sizeof(T), cudaMemcpyDeviceToHost));
      host_attention<CAUSAL>(hq_.data(), hk.data(), hv.data(), c.b, c.sq, c.sk, c.hq, c.hkv, a.p.scale, h_ref.data(),
                             l_ref.data());
    }
    // Against the host's float64 the kernel's P rounding (2^-9 relative, |V| <= 2) is an absolute error.
    const double floor = lib_entry ? 0.05 : 0.5;
    auto compare = [&](const char* name, int) {
      CK(cudaStreamSynchronize(s));
      CK(cudaGetLastError());
      CK(cudaMemcpy(h_out.data(), o, nq * sizeof(T), cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(l_out.data(), lse, nl * 4, cudaMemcpyDeviceToHost));
      double eo = 0, el = 0;
      for (int64_t i = 0; i < nq; ++i) {
        const double x = ja::to_f32(h_out[i]), y = ja::to_f32(h_ref[i]);
        eo = std::isnan(x) || std::isnan(y) ? 1e30 : std::max(eo, std::fabs(x - y) / (std::fabs(y) + floor));
      }
      for (int64_t i = 0; i < nl; ++i) {
        const double x = l_out[i], y = l_ref[i];
        el = (std::isinf(x) && std::isinf(y) && x == y)
                 ? el
                 : (std::isnan(x) || std::isnan(y) ? 1e30 : std::max(el, std::fabs(x - y)));
      }
      const bool ok = eo <= 0.02 && el <= 1e-3;
      bad += !ok;
      std::printf("  check causal=%d b=%lld sq=%lld sk=%lld hq=%lld hkv=%lld %-12s: out %.2g lse %.2g %s\n",
                  int(CAUSAL), (long long)c.b, (long long)c.sq, (long long)c.sk, (long long)c.hq, (long long)c.hkv,
                  name, eo, el, ok ? "ok" : "MISMATCH");
    };
    poison();
    if ((err = ja::mha_fwd_gpu<T, D, CAUSAL>(a, s, JA_MHA_IMPL_DECODE))) {
      std::fprintf(stderr, "%s\n", err);
      std::exit(1);
    }
    compare("shipped", 0);
    CK(cudaFree(q));
    CK(cudaFree(k));
    CK(cudaFree(v));
    CK(cudaFree(o));
    CK(cudaFree(lse));
    CK(cudaFree(ws));
  }
  return bad;
}

int main(int argc, char** argv) {
  const bool check_mode = argc > 1 && std::string(argv[1]) == "check";
  const int reps = argc > 1 && !check_mode ? std::atoi(argv[1]) : 30;
  Entry lib_entry = nullptr;
  if (argc > 2) {
    void* h = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
    if (!h || !(lib_entry = reinterpret_cast<Entry>(dlsym(h, "ja_mha_fwd_gpu")))) {
      std::fprintf(stderr, "cannot load ja_mha_fwd_gpu from %s: %s\n", argv[2], dlerror());
      return 1;
    }
    std::printf("reference: ja_mha_fwd_gpu of %s\n", argv[2]);
  }
  auto reference = [&](const JaMhaFwdArgs& a, cudaStream_t st) {
    return lib_entry ? lib_entry(&a, st, JA_MHA_IMPL_AUTO) : ja::mha_fwd_gpu<T, D, false>(a, st, JA_MHA_IMPL_DECODE);
  };
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  if (check_mode) {
    const int bad = check_shapes<false>(lib_entry, s) + check_shapes<true>(lib_entry, s);
    std::printf("check: %d mismatches\n", bad);
    return bad ? 1 : 0;
  }
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  auto median = [](std::vector<float> t) {
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  };
  // f(i) launches one call on input set i. ev: one call between events; b2b: 16 calls.
  auto time_us = [&](const std::function<void(int)>& f, int sets, float* b2b) {
    for (int i = 0; i < 3; ++i) f(i % sets);
    std::vector<float> t, tb;
    for (int r = 0; r < reps; ++r) t.push_back(event_ms(s, e0, e1, [&] { f(r % sets); }) * 1000.0f);
    if (b2b) {
      for (int r = 0; r < 5; ++r) {
        tb.push_back(event_ms(s, e0, e1,
                              [&] {
                                for (int j = 0; j < 16; ++j) f((r + j) % sets);
                              }) *
                     1000.0f / 16);
      }
      *b2b = median(tb);
    }
    CK(cudaGetLastError());
    return median(t);
  };

  uint32_t* sink;
  CK(cudaMalloc(&sink, 1 << 20));
  // Large copy: the bandwidth ceiling bench_gpu.py uses (1 GiB, twice).
  double copy_gbps;
  {
    const size_t n = size_t(1) << 30;
    void *a0, *a1, *b0, *b1;
    CK(cudaMalloc(&a0, n));
    CK(cudaMalloc(&a1, n));
    CK(cudaMalloc(&b0, n));
    CK(cudaMalloc(&b1, n));
    CK(cudaMemset(a0, 1, n));
    CK(cudaMemset(a1, 2, n));
    const float us = time_us(
        [&](int i) { CK(cudaMemcpyAsync(i ? b1 : b0, i ? a1 : a0, n, cudaMemcpyDeviceToDevice, s)); }, 2, nullptr);
    copy_gbps = 2.0 * n / us * 1e-3;
    const float rd = time_us(
        [&](int i) { read_kernel<<<132 * 8, 256, 0, s>>>(static_cast<const uint4*>(i ? a1 : a0), n / 16, sink); }, 2,
        nullptr);
    const float ev = time_us([&](int) { empty_kernel<<<1, 32, 0, s>>>(); }, 1, nullptr);
    std::printf(
        "large copy: %.0f GB/s (2 GiB moved in %.1f us); large read: %.0f GB/s (%.2f of copy); "
        "empty kernel between events: %.1f us\n",
        copy_gbps, us, n / rd * 1e-3, n / rd * 1e-3 / copy_gbps, ev);
    CK(cudaFree(a0));
    CK(cudaFree(a1));
    CK(cudaFree(b0));
    CK(cudaFree(b1));
  }

  const std::vector<Case> cases = {{8, 32, 8, 8192},  {8, 32, 8, 32768}, {8, 32, 4, 8192},  {8, 32, 4, 32768},
                                   {1, 32, 8, 32768}, {2, 32, 4, 8192},  {8, 32, 1, 16384}, {32, 32, 8, 2048}};
  const char* ncases_env = std::getenv("TUNE_DECODE_CASES");  // the first N cases only (N = 4: the model's)
  const size_t ncases =
      ncases_env ? std::min<size_t>(cases.size(), std::strtoul(ncases_env, nullptr, 10)) : cases.size();
  const char* first_env = std::getenv("TUNE_DECODE_FIRST");  // skip the cases before this one (for ncu)
  for (size_t ci = first_env ? std::strtoul(first_env, nullptr, 10) : 0; ci < ncases; ++ci) {
    const Case& c = cases[ci];
    const int64_t nq = c.b * c.hq * D, nkv = c.b * c.sk * c.hkv * D;
    const double kv_bytes = 2.0 * nkv * sizeof(T);
    const int sets = int(std::max<int64_t>(2, std::min<int64_t>(4, int64_t(std::ceil(3 * 60e6 / kv_bytes)))));
    std::vector<T*> q(sets), k(sets), v(sets), o(sets);
    std::vector<float*> lse(sets);
    for (int i = 0; i < sets; ++i) {
      CK(cudaMalloc(&q[i], nq * sizeof(T)));
      CK(cudaMalloc(&k[i], nkv * sizeof(T)));
      CK(cudaMalloc(&v[i], nkv * sizeof(T)));
      CK(cudaMalloc(&o[i], nq * sizeof(T)));
      CK(cudaMalloc(&lse[i], c.b * c.hq * sizeof(float)));
      fill_random<<<1024, 256, 0, s>>>(q[i], nq, 11u + i);
      fill_random<<<4096, 256, 0, s>>>(k[i], nkv, 101u + i);
      fill_random<<<4096, 256, 0, s>>>(v[i], nkv, 202u + i);
    }
    const int64_t ws_py = python_ws_bytes(c);
    void* ws;
    CK(cudaMalloc(&ws, std::max<int64_t>(ws_py, 16)));
    auto args = [&](int i, bool) {
      JaMhaFwdArgs a{};
      a.p.dtype = int32_t(ja::DType::kBF16);
      a.p.batch = c.b, a.p.seq_q = 1, a.p.seq_k = c.sk, a.p.heads_q = c.hq, a.p.heads_kv = c.hkv;
      a.p.head_dim = a.p.head_dim_v = D;
      a.p.mask = ja::kMaskNone, a.p.scale = 1.0f / std::sqrt(float(D));
      a.q = q[i], a.k = k[i], a.v = v[i], a.o = o[i], a.lse = lse[i];
      a.workspace = ws, a.workspace_bytes = ws_py;
      return a;
    };
    float b2b;
    const float copy_us = time_us(
        [&](int i) { CK(cudaMemcpyAsync(v[i], k[i], nkv * sizeof(T), cudaMemcpyDeviceToDevice, s)); }, sets, &b2b);
    // (the copy overwrote v with k: refill before the checks)
    for (int i = 0; i < sets; ++i) fill_random<<<4096, 256, 0, s>>>(v[i], nkv, 202u + i);
    const float read_us = time_us(
        [&](int i) {
          read_kernel<<<132 * 8, 256, 0, s>>>(reinterpret_cast<const uint4*>(k[i]), nkv * sizeof(T) / 16, sink);
          read_kernel<<<132 * 8, 256, 0, s>>>(reinterpret_cast<const uint4*>(v[i]), nkv * sizeof(T) / 16, sink);
        },
        sets, nullptr);
    const float read1_us = time_us(
        [&](int i) {  // K alone, one launch
          read_kernel<<<132 * 8, 256, 0, s>>>(reinterpret_cast<const uint4*>(k[i]), nkv * sizeof(T) / 16, sink);
        },
        sets, nullptr);
    std::printf("\ncase b=%lld hq=%lld hkv=%lld sk=%lld d=%d: K/V %.1f MB, %d input sets, workspace %.1f MB (python)\n",
                (long long)c.b, (long long)c.hq, (long long)c.hkv, (long long)c.sk, D, kv_bytes / 1e6, sets,
                ws_py / 1e6);
    std::printf("  %-26s ev %7.1f us  (%.2f of copy bw)  b2b %7.1f us\n", "memcpy same bytes", copy_us,
                kv_bytes / copy_us * 1e-3 / copy_gbps, b2b);
    std::printf("  %-26s ev %7.1f us  (%.2f of copy bw)  [K then V, 2 launches]\n", "read K,V contiguous", read_us,
                kv_bytes / read_us * 1e-3 / copy_gbps);
    std::printf("  %-26s ev %7.1f us  (%.2f of copy bw)  [half the bytes, 1 launch]\n", "read K contiguous", read1_us,
                kv_bytes / 2 / read1_us * 1e-3 / copy_gbps);

    // Reference: the library's output, else the shipped dispatch's.
    std::vector<T> h_ref(nq), h_out(nq);
    std::vector<float> h_lref(c.b * c.hq), h_lout(c.b * c.hq);
    {
      JaMhaFwdArgs a = args(0, false);
      CK(cudaMemsetAsync(o[0], 0xff, nq * sizeof(T), s));
      if (const char* err = reference(a, s)) {
        std::fprintf(stderr, "%s\n", err);
        return 1;
      }
      CK(cudaStreamSynchronize(s));
      CK(cudaGetLastError());
      CK(cudaMemcpy(h_ref.data(), o[0], nq * sizeof(T), cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(h_lref.data(), lse[0], c.b * c.hq * 4, cudaMemcpyDeviceToHost));
    }
    auto check = [&]() {
      CK(cudaMemcpy(h_out.data(), o[0], nq * sizeof(T), cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(h_lout.data(), lse[0], c.b * c.hq * 4, cudaMemcpyDeviceToHost));
      double worst = 0;
      for (int64_t i = 0; i < nq; ++i) {
        const double x = ja::to_f32(h_out[i]), y = ja::to_f32(h_ref[i]);
        if (!(std::fabs(x - y) < 1e30)) return 1e30;
        worst = std::max(worst, std::fabs(x - y));
      }
      for (size_t i = 0; i < h_lout.size(); ++i) {
        if (!(std::fabs(h_lout[i] - h_lref[i]) < 1e30)) return 1e30;
        worst = std::max(worst, double(std::fabs(h_lout[i] - h_lref[i])));
      }
      return worst;
    };
    {
      float bb;
      const float us =
          time_us([&](int i) { ja::mha_fwd_gpu<T, D, false>(args(i, false), s, JA_MHA_IMPL_DECODE); }, sets, &bb);
      CK(cudaMemsetAsync(o[0], 0xff, nq * sizeof(T), s));
      CK(cudaMemsetAsync(lse[0], 0xff, c.b * c.hq * 4, s));
      if (const char* err = ja::mha_fwd_gpu<T, D, false>(args(0, false), s, JA_MHA_IMPL_DECODE)) {
        std::fprintf(stderr, "%s\n", err);
        return 1;
      }
      CK(cudaStreamSynchronize(s));
      std::printf("  %-26s ev %7.1f us (%.3f of copy bw)  b2b %7.1f  max diff %.2g\n", "shipped", us,
                  kv_bytes / us * 1e-3 / copy_gbps, bb, check());
      if (lib_entry) {
        const float ul = time_us(
            [&](int i) {
              const JaMhaFwdArgs a = args(i, false);
              lib_entry(&a, s, JA_MHA_IMPL_AUTO);
            },
            sets, &bb);
        std::printf("  %-26s ev %7.1f us (%.3f of copy bw)  b2b %7.1f\n", "library", ul,
                    kv_bytes / ul * 1e-3 / copy_gbps, bb);
      }
    }
    auto rows_pattern = [&](auto u_tag, const char* name) {
      constexpr int U = decltype(u_tag)::value;
      if (c.hkv % U) return;
      // chunk: the keys per block that give ~2 blocks per multiprocessor, whole waves
      const int64_t groups = c.b * c.hkv / U;
      int64_t splits = std::max<int64_t>(1, 264 / groups);
      const int64_t chunk = (c.sk + splits - 1) / splits;
      splits = (c.sk + chunk - 1) / chunk;
      const float us = time_us(
          [&](int i) {
            rows_kernel<U><<<dim3(unsigned(splits), unsigned(c.hkv / U), unsigned(c.b)), 128, 0, s>>>(
                k[i], v[i], c.sk, c.hkv, chunk, sink);
          },
          sets, nullptr);
      std::printf("  %-26s splits %4lld blocks %5lld  ev %7.1f us (%.3f of copy bw)\n", name, (long long)splits,
                  (long long)(splits * groups), us, kv_bytes / us * 1e-3 / copy_gbps);
    };
    rows_pattern(std::integral_constant<int, 1>{}, "rows pattern U=1");
    rows_pattern(std::integral_constant<int, 4>{}, "rows pattern U=4");
    rows_pattern(std::integral_constant<int, 8>{}, "rows pattern U=8");

    for (int i = 0; i < sets; ++i) {
      CK(cudaFree(q[i]));
      CK(cudaFree(k[i]));
      CK(cudaFree(v[i]));
      CK(cudaFree(o[i]));
      CK(cudaFree(lse[i]));
    }
    CK(cudaFree(ws));
  }
  return 0;
}
