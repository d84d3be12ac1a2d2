// The device's float32 -> bf16 conversion (ja::from_f32, the hardware cvt.rn.bf16.f32 on sm_80+)
// against the portable round-to-nearest-even path (ja::bf16_bits_rne, the host's), on all 2^32 float32
// bit patterns: every non-NaN input must give the same bits, every NaN input a NaN.
//
//   nvcc -std=c++17 -O3 --expt-relaxed-constexpr -arch=sm_90 -Icsrc/include -Icsrc/kernels \
//        benchmarks/gpu/check_bf16_convert.cu -o build/check_bf16_convert
//   build/check_bf16_convert        (exit 0: all agree; 1: a mismatch, printed; 2: a CUDA error)
#include <cstdio>

#include "ja/dtype.h"
#include "harness.cuh"

// counts[0]: non-NaN inputs whose bits differ; counts[1]: NaN inputs that did not give a NaN;
// first[0]: one differing input (its bits), if any.
__global__ void compare_all(unsigned long long* counts, unsigned int* first) {
  unsigned long long mismatch = 0, nan_lost = 0;
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < (uint64_t(1) << 32); i += stride) {
    const uint32_t u = uint32_t(i);
    const float f = __uint_as_float(u);
    const uint16_t hw = ja::from_f32<ja::bf16_t>(f).bits;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      if ((hw & 0x7fffu) <= 0x7f80u) ++nan_lost;
    } else if (hw != ja::bf16_bits_rne(f)) {
      ++mismatch;
      atomicCAS(first, 0u, u);
    }
  }
  atomicAdd(&counts[0], mismatch);
  atomicAdd(&counts[1], nan_lost);
}

int main() {
  unsigned long long* counts;
  unsigned int* first;
  CK(cudaMalloc(&counts, 2 * sizeof(unsigned long long)));
  CK(cudaMalloc(&first, sizeof(unsigned int)));
  CK(cudaMemset(counts, 0, 2 * sizeof(unsigned long long)));
  CK(cudaMemset(first, 0, sizeof(unsigned int)));
  compare_all<<<132 * 16, 256>>>(counts, first);
  CK(cudaGetLastError());
  unsigned long long h[2];
  unsigned int h_first;
  CK(cudaMemcpy(h, counts, sizeof h, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(&h_first, first, sizeof h_first, cudaMemcpyDeviceToHost));
  std::printf("all 2^32 float32 inputs: %llu non-NaN mismatches, %llu NaN inputs not giving a NaN\n", h[0], h[1]);
  if (h[0]) std::printf("first mismatch: input bits 0x%08x\n", h_first);
  return (h[0] || h[1]) ? 1 : 0;
}
