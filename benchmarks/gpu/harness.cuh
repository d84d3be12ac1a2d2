// What the standalone CUDA harnesses in benchmarks/gpu/ share (they include the kernel headers and
// are built by hand, not by the project's build): a CUDA error check, a random fill, event timing, and
// the ja_error the kernel headers call.
#pragma once
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

// A failed CUDA call prints where and why, and exits 2 (a harness's own mismatch exits 1).
#define CK(x)                                                                                 \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(2);                                                                           \
    }                                                                                         \
  } while (0)

// p[i] uniform in [-2, 2), from a hash of i and seed (no host-side generator, any size).
template <typename T>
__global__ void fill_random(T* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    h *= 3266489917u;
    h ^= h >> 16;
    p[i] = ja::from_f32<T>((float(h & 0xffff) / 65535.0f - 0.5f) * 4.0f);
  }
}

// Milliseconds between two events recorded on stream s around f() (which enqueues work on s).
template <typename F>
float event_ms(cudaStream_t s, cudaEvent_t e0, cudaEvent_t e1, F&& f) {
  CK(cudaEventRecord(e0, s));
  f();
  CK(cudaEventRecord(e1, s));
  CK(cudaEventSynchronize(e1));
  float ms;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  return ms;
}

// The umbrella library defines ja_error; a harness that does not link it takes this one (weak, so
// one that does link it is not redefined).
extern "C" __attribute__((weak)) const char* ja_error(const char* fmt, ...) {
  static char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}
