// append_kv on the CPU (ja/kernels/paged.h): each token's K and V rows written into their pool slot, in place;
// into a float8_e4m3fn pool quantized (x / scale, rounded to nearest even, saturated at +-448).
#pragma once
#include <cstdint>
#include <cstring>
#include <vector>

#include "ja/api.h"
#include "ja/dtype.h"
#include "ja/kernels/paged.h"
#include "mha/cpu/elements.h"

namespace ja {

// One pool's rows: token n's heads_kv * dim values from src to slot slot_mapping[n] of pool, in token order (two
// tokens given the same slot: the later one stays). A copy of a few rows per token: serial.
inline void append_rows(const JaAppendKvArgs& a, const void* src, void* pool, int64_t dim, const float* scale) {
  const int64_t width = a.heads_kv * dim;  // elements of one token's row
  const int64_t src_row = width * dtype_size(a.new_dtype), pool_row = width * dtype_size(a.pool_dtype);
  const bool same = a.pool_dtype == a.new_dtype;
  const float div = scale ? *scale : 1.0f;
  std::vector<float> row(same ? 0 : size_t(width));
  for (int64_t n = 0; n < a.num_tokens; ++n) {
    const int64_t slot = a.slot_bits == 32 ? int64_t(static_cast<const int32_t*>(a.slot_mapping)[n])
                                           : static_cast<const int64_t*>(a.slot_mapping)[n];
    if (slot < 0) continue;
    const char* from = static_cast<const char*>(src) + n * src_row;
    char* to = static_cast<char*>(pool) + slot * pool_row;
    if (same) {
      std::memcpy(to, from, size_t(src_row));
      continue;
    }
    mha_cpu::with_type(a.new_dtype, from, [&](auto* x) {
      for (int64_t c = 0; c < width; ++c) row[size_t(c)] = to_f32(x[c]) / div;
    });
    mha_cpu::store_row_as(to, a.pool_dtype, row.data(), int(width), 1.0f);
  }
}

inline const char* append_kv_cpu(const JaAppendKvArgs& a) {
  append_rows(a, a.k_new, a.k_pool, a.head_dim, a.k_scale);
  append_rows(a, a.v_new, a.v_pool, a.head_dim_v, a.v_scale);
  return nullptr;
}

}  // namespace ja
