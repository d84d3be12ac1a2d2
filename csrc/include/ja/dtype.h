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

// kF8E4M3 (float8_e4m3fn) is a storage type only: the paged KV pools and FP8 attention's inputs, widened to
// float32 on load (the paged kernels, ja/kernels/paged.h); no other kernel takes it.
enum class DType : int { kF32 = 0, kBF16 = 1, kF16 = 2, kF8E4M3 = 3 };

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "float32";
    case DType::kBF16: return "bfloat16";
    case DType::kF16: return "float16";
    case DType::kF8E4M3: return "float8_e4m3fn";
  }
  return "unknown";
}

// Bytes per element of dtype id t (a ja::DType).
inline int64_t dtype_size(int32_t t) { return t == int(DType::kF32) ? 4 : t == int(DType::kF8E4M3) ? 1 : 2; }

struct alignas(2) bf16_t {
  uint16_t bits;
};
struct alignas(2) f16_t {
  uint16_t bits;
};
struct f8e4m3_t {
  uint8_t bits;
};  // float8_e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinity

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

// float8_e4m3fn -> float32, exact: S.1111.111 is NaN (the format has no infinity), exponent 0 is subnormal
// (mantissa * 2^-9).
JA_HD float to_f32(f8e4m3_t v) {
  const uint32_t sign = uint32_t(v.bits & 0x80u) << 24;
  const uint32_t exp = (v.bits >> 3) & 0xfu, man = v.bits & 0x7u;
  if (exp == 0xfu && man == 0x7u) return bits_to_f32(sign | 0x7fc00000u);
  if (exp == 0) {
    const float m = float(man) * 0.001953125f;  // 2^-9
    return sign ? -m : m;
  }
  return bits_to_f32(sign | ((exp + 120u) << 23) | (man << 20));  // rebias 7 -> 127
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

// float32 -> float8_e4m3fn, rounded to nearest even and saturated: a magnitude of 448 (the largest finite
// value) or more, infinity included, becomes +-448; NaN stays NaN. (Saturation, as vLLM's and aiter's KV-cache
// quantization: a cast that overflows to NaN would poison every later attention over the cache.)
template <>
JA_HD f8e4m3_t from_f32<f8e4m3_t>(float f) {
  const uint32_t u = f32_to_bits(f);
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  const uint32_t au = u & 0x7fffffffu;
  if (au > 0x7f800000u) return f8e4m3_t{uint8_t(sign | 0x7fu)};  // NaN
  if (au >= 0x43e00000u) return f8e4m3_t{uint8_t(sign | 0x7eu)};  // >= 448: saturate
  if (au < 0x3c800000u) {  // below 2^-6, the smallest normal: steps of 2^-9, rounded to nearest even
    const float t = bits_to_f32(au) * 512.0f;                       // exact (a power of two)
    return f8e4m3_t{uint8_t(sign | uint32_t((t + 8388608.0f) - 8388608.0f))};  // 2^23: round to an integer
  }
  const uint32_t r = au + 0x7ffffu + ((au >> 20) & 1u);  // round to 3 mantissa bits, nearest even
  return f8e4m3_t{uint8_t(sign | ((r >> 20) - (120u << 3)))};  // rebias 127 -> 7 (a carry lands in the exponent)
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
template <>
struct dtype_of<f8e4m3_t> {
  static constexpr DType value = DType::kF8E4M3;
};

}  // namespace ja
