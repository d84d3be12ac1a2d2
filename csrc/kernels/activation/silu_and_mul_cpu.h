// SiLU-and-mul on the CPU: out = silu(a) * b for x = [a | b] along the last axis.
#pragma once
#include <algorithm>
#include <cmath>

#include "ja/api.h"
#include "ja/dtype.h"
#include "ja/kernels/activation.h"

namespace ja {

inline float silu(float v) { return v / (1.0f + std::exp(-v)); }

template <typename T>
const char* silu_and_mul_cpu(const JaSiluAndMulArgs& a) {
  const T* x = static_cast<const T*>(a.x);
  T* out = static_cast<T*>(a.out);
  const int64_t d = a.d;
  parallel_for(a.rows, std::max<int64_t>(1, 32768 / std::max<int64_t>(d, 1)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* gate = x + r * 2 * d;
      const T* up = gate + d;
      T* o = out + r * d;
      for (int64_t i = 0; i < d; ++i) o[i] = from_f32<T>(silu(to_f32(gate[i])) * to_f32(up[i]));
    }
  });
  return nullptr;
}

}  // namespace ja
