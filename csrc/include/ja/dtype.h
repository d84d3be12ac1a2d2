// Element types shared by the CPU and GPU kernels.
//
// On the host, bf16 and fp16 are plain 16-bit storage types with explicit
// round-to-nearest-even conversion, so CPU kernels do not depend on compiler
// extensions (_Float16, __bf16) that vary across g++ versions.
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define JA_HD __host__ __device__ inline
#if defined(__HIPCC__)
#include <hip/hip_runtime.h>  // __uint_as_float and friends (not implicit before ROCm 6)
#include <hip/hip_fp16.h>
#else
#include <cuda_fp16.h>
#endif
#else
#define JA_HD inline
#endif

#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
#define JA_DEVICE_PASS 1
#endif

namespace ja {

enum class DType : int { kF32 = 0, kBF16 = 1, kF16 = 2 };

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "float32";
    case DType::kBF16: return "bfloat16";
    case DType::kF16: return "float16";
  }
  return "unknown";
}

struct alignas(2) bf16_t {
  uint16_t bits;
};
struct alignas(2) f16_t {
  uint16_t bits;
};

// Bit casts. The device pass uses the intrinsics: hipcc rejects std::memcpy
// (a host function) inside __host__ __device__ code.
JA_HD float bits_to_f32(uint32_t u) {
#if defined(JA_DEVICE_PASS)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}
JA_HD uint32_t f32_to_bits(float f) {
#if defined(JA_DEVICE_PASS)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

JA_HD float to_f32(float v) { return v; }
JA_HD float to_f32(bf16_t v) { return bits_to_f32(uint32_t(v.bits) << 16); }
JA_HD float to_f32(f16_t v) {
#if defined(JA_DEVICE_PASS)
  return __half2float(__ushort_as_half(v.bits));
#else
  const uint32_t h = v.bits;
  const uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  if (exp == 0) {
    if (man == 0) return bits_to_f32(sign);
    // subnormal: normalise
    int e = -1;
    do {
      man <<= 1;
      ++e;
    } while ((man & 0x400u) == 0);
    man &= 0x3ffu;
    return bits_to_f32(sign | (uint32_t(127 - 15 - e) << 23) | (man << 13));
  }
  if (exp == 0x1f) return bits_to_f32(sign | 0x7f800000u | (man << 13));
  return bits_to_f32(sign | ((exp + 127 - 15) << 23) | (man << 13));
#endif
}

template <typename T>
JA_HD T from_f32(float f);
template <>
JA_HD float from_f32<float>(float f) {
  return f;
}
// float32 -> bf16 bits, rounded to nearest even; a NaN stays a quiet NaN with its sign and top payload
// bits. The host's conversion, and the device's where the hardware has none.
JA_HD uint16_t bf16_bits_rne(float f) {
  uint32_t u = f32_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return uint16_t(u >> 16);
}
template <>
JA_HD bf16_t from_f32<bf16_t>(float f) {
#if defined(JA_DEVICE_PASS) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  // The hardware conversion (sm_80+): the same rounding in one instruction instead of six; a NaN becomes
  // the canonical quiet NaN (0x7fff). benchmarks/gpu/check_bf16_convert.cu compares the two on every input.
  uint16_t r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
  return bf16_t{r};
#else
  return bf16_t{bf16_bits_rne(f)};
#endif
}
template <>
JA_HD f16_t from_f32<f16_t>(float f) {
#if defined(JA_DEVICE_PASS)
  return f16_t{__half_as_ushort(__float2half_rn(f))};
#else
  const uint32_t u = f32_to_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t au = u & 0x7fffffffu;
  if (au > 0x7f800000u) return f16_t{uint16_t(sign | 0x7e00u)};
  if (au >= 0x477ff000u) return f16_t{uint16_t(sign | 0x7c00u)};  // overflow -> inf
  if (au < 0x38800000u) {  // subnormal or zero in fp16
    const float af = bits_to_f32(au);
    // 2^-24 is the fp16 subnormal step; add a magic number to round.
    const float scaled = af + 0.5f;  // 0.5 = 2^-1 aligns mantissa so ulp = 2^-24
    uint32_t r = f32_to_bits(scaled) - f32_to_bits(0.5f);
    return f16_t{uint16_t(sign | r)};
  }
  uint32_t mant_odd = (au >> 13) & 1u;
  uint32_t v = au + 0xc8000fffu + mant_odd;  // rebias exponent (-112<<23) and round
  return f16_t{uint16_t(sign | (v >> 13))};
#endif
}

// Token-pasting names used by generated instance sources: ja::type_bf16, ja::dt_bf16.
using type_f32 = float;
using type_bf16 = bf16_t;
using type_f16 = f16_t;
constexpr DType dt_f32 = DType::kF32;
constexpr DType dt_bf16 = DType::kBF16;
constexpr DType dt_f16 = DType::kF16;

template <typename T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::kF32;
};
template <>
struct dtype_of<bf16_t> {
  static constexpr DType value = DType::kBF16;
};
template <>
struct dtype_of<f16_t> {
  static constexpr DType value = DType::kF16;
};

}  // namespace ja
