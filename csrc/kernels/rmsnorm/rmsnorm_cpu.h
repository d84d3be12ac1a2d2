// RMSNorm forward on the CPU: rows in parallel, float32 accumulation.
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>

#include "ja/api.h"
#include "ja/dtype.h"
#include "ja/kernels/rmsnorm.h"

namespace ja {

template <typename T>
const char* rmsnorm_fwd_cpu(const JaRmsNormArgs& a) {
  const T* x = static_cast<const T*>(a.x);
  const T* res = static_cast<const T*>(a.residual);
  const T* w = static_cast<const T*>(a.weight);
  T* out = static_cast<T*>(a.out);
  T* res_out = static_cast<T*>(a.residual_out);
  const int64_t h = a.hidden;
  const float inv_h = 1.0f / float(h);
  parallel_for(a.rows, std::max<int64_t>(1, 65536 / std::max<int64_t>(h, 1)), [&](int64_t r0, int64_t r1) {
    std::vector<float> row(static_cast<size_t>(h));
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = x + r * h;
      // Four partial sums keep the reduction vectorisable and better conditioned.
      float acc[4] = {0.f, 0.f, 0.f, 0.f};
      for (int64_t i = 0; i < h; ++i) {
        float v = to_f32(xr[i]);
        if (res) {
          v += to_f32(res[r * h + i]);
          res_out[r * h + i] = from_f32<T>(v);
        }
        row[size_t(i)] = v;
        acc[i & 3] += v * v;
      }
      const float ms = ((acc[0] + acc[1]) + (acc[2] + acc[3])) * inv_h;
      const float inv_rms = 1.0f / std::sqrt(ms + a.eps);
      T* o = out + r * h;
      for (int64_t i = 0; i < h; ++i) o[i] = from_f32<T>(row[size_t(i)] * inv_rms * to_f32(w[i]));
    }
  });
  return nullptr;
}

}  // namespace ja
