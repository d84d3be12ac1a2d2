// Portability header: one kernel source compiles with nvcc (CUDA) and hipcc (HIP).
//
// Kernel code uses only the ja_* names below, never cuda*/hip* directly, so a
// tuning that only one compiler accepts stays behind this header.
#pragma once
#include <cstdint>

#if defined(__HIPCC__) || defined(JA_BACKEND_ROCM)
#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
#if __has_include(<hip/hip_bf16.h>)  // ROCm >= 5.7; older ROCm has only hip_bfloat16.h
#include <hip/hip_bf16.h>
#endif
#define JA_GPU_HIP 1
using ja_stream_t = hipStream_t;
using ja_error_t = hipError_t;
#define ja_success hipSuccess
#define ja_get_last_error hipGetLastError
#define ja_peek_last_error hipPeekAtLastError
#define ja_get_error_string hipGetErrorString
#define ja_memset_async hipMemsetAsync
using ja_event_t = hipEvent_t;
#define ja_event_create hipEventCreate
#define ja_event_record hipEventRecord
#define ja_event_synchronize hipEventSynchronize
#define ja_event_elapsed_time hipEventElapsedTime
#define ja_memcpy_d2d_async(dst, src, n, s) hipMemcpyAsync(dst, src, n, hipMemcpyDeviceToDevice, s)
#define ja_func_set_max_dynamic_smem(fn, bytes) \
  hipFuncSetAttribute(reinterpret_cast<const void*>(fn), hipFuncAttributeMaxDynamicSharedMemorySize, bytes)
#define JA_WARP_SIZE_MAX 64
#define JA_PLATFORM_NAME "ROCM"
#elif defined(__CUDACC__) || defined(JA_BACKEND_CUDA)
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#define JA_GPU_CUDA 1
using ja_stream_t = cudaStream_t;
using ja_error_t = cudaError_t;
#define ja_success cudaSuccess
#define ja_get_last_error cudaGetLastError
#define ja_peek_last_error cudaPeekAtLastError
#define ja_get_error_string cudaGetErrorString
#define ja_memset_async cudaMemsetAsync
using ja_event_t = cudaEvent_t;
#define ja_event_create cudaEventCreate
#define ja_event_record cudaEventRecord
#define ja_event_synchronize cudaEventSynchronize
#define ja_event_elapsed_time cudaEventElapsedTime
#define ja_memcpy_d2d_async(dst, src, n, s) cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, s)
#define ja_func_set_max_dynamic_smem(fn, bytes) \
  cudaFuncSetAttribute(reinterpret_cast<const void*>(fn), cudaFuncAttributeMaxDynamicSharedMemorySize, bytes)
#define JA_WARP_SIZE_MAX 32
#define JA_PLATFORM_NAME "CUDA"
#else
#error "ja/gpu.h needs nvcc or hipcc (define JA_BACKEND_CUDA or JA_BACKEND_ROCM)"
#endif

#if defined(__CUDACC__) || defined(__HIPCC__)
#define JA_DEVICE __device__ __forceinline__
#define JA_HOST_DEVICE __host__ __device__ __forceinline__
#define JA_GLOBAL __global__

// Warp-level reductions. The warp width is a compile-time property of the
// device pass (32 on NVIDIA, 64 on CDNA), exposed as ja_warp_size().
#if defined(JA_GPU_HIP)
JA_DEVICE constexpr int ja_warp_size() {
#if defined(__GFX9__) || defined(__gfx90a__) || defined(__gfx940__) || defined(__gfx941__) || defined(__gfx942__) || \
    defined(__gfx950__)
  return 64;
#else
  return 32;
#endif
}
template <typename T>
JA_DEVICE T ja_shfl_xor(T v, int mask) {
  return __shfl_xor(v, mask);
}
template <typename T>
JA_DEVICE T ja_shfl(T v, int src) {
  return __shfl(v, src);
}
#else
JA_DEVICE constexpr int ja_warp_size() { return 32; }
template <typename T>
JA_DEVICE T ja_shfl_xor(T v, int mask) {
  return __shfl_xor_sync(0xffffffffu, v, mask);
}
template <typename T>
JA_DEVICE T ja_shfl(T v, int src) {
  return __shfl_sync(0xffffffffu, v, src);
}
#endif

JA_DEVICE float ja_warp_sum(float v) {
#pragma unroll
  for (int m = ja_warp_size() / 2; m > 0; m >>= 1) v += ja_shfl_xor(v, m);
  return v;
}
JA_DEVICE float ja_warp_max(float v) {
#pragma unroll
  for (int m = ja_warp_size() / 2; m > 0; m >>= 1) v = fmaxf(v, ja_shfl_xor(v, m));
  return v;
}

JA_DEVICE float ja_exp2(float x) { return exp2f(x); }
// Makes the compiler treat a register as rewritten here, so values derived
// from it before this point are recomputed after it instead of being kept
// live across it (trades a few instructions for registers). No-op on HIP.
JA_DEVICE void ja_reg_barrier(uint32_t& r) {
#if defined(JA_GPU_CUDA) && defined(__CUDA_ARCH__)
  asm volatile("" : "+r"(r));
#else
  (void)r;
#endif
}

// log2(e): e^x is computed as 2^(x log2 e) (SiLU), and attention folds it into its softmax scale.
constexpr float ja_log2e = 1.4426950408889634f;

// exp2 on the special-function unit alone (CUDA: ex2.approx.ftz, about 2 ulp,
// results below 2^-126 flushed to 0); for softmax numerators, where that is harmless.
JA_DEVICE float ja_exp2_approx(float x) {
#if defined(JA_GPU_CUDA) && defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return exp2f(x);
#endif
}
JA_DEVICE float ja_log2(float x) { return log2f(x); }
// tanh(x) as 1 - 2 / (e^(2x) + 1), with ja_exp2_approx and a fast division: the absolute error is a few
// 1e-7 (what an attention logit capped by softcap * tanh(s / softcap) needs: its error is softcap times this),
// in about five instructions where tanhf takes about twenty. +-1 exactly for |x| past about 44.
JA_DEVICE float ja_tanh(float x) {
  const float e = ja_exp2_approx(2.0f * ja_log2e * x);
  return 1.0f - __fdividef(2.0f, e + 1.0f);
}
JA_DEVICE float ja_rsqrt(float x) { return rsqrtf(x); }

// Reductions over aligned groups of W consecutive lanes (W a power of two
// <= 32, so the same code is right for 32- and 64-wide warps).
template <int W>
JA_DEVICE float ja_group_sum(float v) {
#pragma unroll
  for (int m = W / 2; m > 0; m >>= 1) v += ja_shfl_xor(v, m);
  return v;
}
template <int W>
JA_DEVICE float ja_group_max(float v) {
#pragma unroll
  for (int m = W / 2; m > 0; m >>= 1) v = fmaxf(v, ja_shfl_xor(v, m));
  return v;
}

// float atomic add to global memory (dQ accumulation). One name, so a faster
// hardware path on one platform (e.g. unsafeAtomicAdd on CDNA) can go here.
JA_DEVICE void ja_atomic_add(float* addr, float v) { atomicAdd(addr, v); }
// Two adjacent floats, addr 8-byte aligned: one vector atomic where the
// hardware has it (CUDA sm_90: red.global.add.v2.f32), two scalar ones otherwise.
JA_DEVICE void ja_atomic_add2(float* addr, float x, float y) {
#if defined(JA_GPU_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(addr), "f"(x), "f"(y) : "memory");
#else
  atomicAdd(addr, x);
  atomicAdd(addr + 1, y);
#endif
}
#endif  // device compiler
