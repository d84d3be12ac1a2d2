// Rows of an element type chosen at run time (ja::DType), widened to float32 on load and rounded once on store:
// the paged kernels' loads (cpu/paged.h, cpu/append_kv.h), whose q, pools and output each have a dtype of their
// own (float8_e4m3fn among them), so one instance per head dim serves every combination. The switch runs once a
// row; the loop inside it is the typed one.
#pragma once
#include <cstdint>
#include <type_traits>

#include "ja/dtype.h"
#include "mha/cpu/common.h"

namespace ja {
namespace mha_cpu {

// Calls f(T*) with `p` as a pointer to the element type `dtype` names (one of ja::DType).
template <typename F>
JA_CPU_INLINE void with_type(int32_t dtype, const void* p, F&& f) {
  switch (DType(dtype)) {
    case DType::kF32: return f(static_cast<const float*>(p));
    case DType::kBF16: return f(static_cast<const bf16_t*>(p));
    case DType::kF16: return f(static_cast<const f16_t*>(p));
    case DType::kF8E4M3: return f(static_cast<const f8e4m3_t*>(p));
  }
}

// dst[c] = mul * src[c] for c < n, 0 for n <= c < D.
template <int D>
JA_CPU_INLINE void load_row_as(float* __restrict dst, const void* src, int32_t dtype, int n, float mul) {
  with_type(dtype, src, [&](auto* s) {
    for (int c = 0; c < n; ++c) dst[c] = to_f32(s[c]) * mul;
  });
  for (int c = n; c < D; ++c) dst[c] = 0.0f;
}

// Column j of a transposed tile kt [D][ld]: kt[c * ld + j] = src[c] for c < n, 0 for n <= c < D.
template <int D>
JA_CPU_INLINE void load_col_as(float* __restrict kt, int ld, int j, const void* src, int32_t dtype, int n) {
  with_type(dtype, src, [&](auto* s) {
    for (int c = 0; c < n; ++c) kt[c * ld + j] = to_f32(s[c]);
  });
  for (int c = n; c < D; ++c) kt[c * ld + j] = 0.0f;
}

// dst[c] = src[c] * mul for c < n, rounded once to the type `dtype` names (float32, bfloat16, float16, or
// float8_e4m3fn, which saturates: ja/dtype.h).
JA_CPU_INLINE void store_row_as(void* dst, int32_t dtype, const float* __restrict src, int n, float mul) {
  with_type(dtype, dst, [&](auto* d) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(d)>>;
    store_row(const_cast<T*>(d), src, n, mul);
  });
}

}  // namespace mha_cpu
}  // namespace ja
