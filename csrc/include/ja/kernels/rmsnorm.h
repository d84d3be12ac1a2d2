// C ABI of librmsnorm_fwd.so (what the rmsnorm_fwd_ja.so shim calls).
#pragma once
#include <cstdint>

#include "ja/api.h"

struct JaRmsNormArgs {
  int32_t dtype;         // ja::DType of x, residual, weight, out, residual_out
  int64_t rows;
  int64_t hidden;
  const void* x;         // [rows, hidden]
  const void* residual;  // [rows, hidden] or nullptr
  const void* weight;    // [hidden]
  void* out;             // [rows, hidden]
  void* residual_out;    // [rows, hidden] (x + residual) when residual != nullptr
  float eps;
};

// out = x / sqrt(mean(x^2) + eps) * weight, with x <- x + residual first when
// residual is given. Accumulates in float32; rounds once on store.
JA_API const char* ja_rmsnorm_fwd_cpu(const JaRmsNormArgs* args);
JA_API const char* ja_rmsnorm_fwd_gpu(const JaRmsNormArgs* args, void* stream);
