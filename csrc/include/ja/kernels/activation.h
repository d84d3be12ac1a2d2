// C ABI of the silu_and_mul kernels (compiled into silu_and_mul_ja.so).
#pragma once
#include <cstdint>

#include "ja/api.h"

struct JaSiluAndMulArgs {
  int32_t dtype;  // ja::DType of x and out
  int64_t rows;
  int64_t d;      // x is [rows, 2*d], out is [rows, d]
  const void* x;
  void* out;
};

// out = silu(x[:, :d]) * x[:, d:], computed in float32, rounded once.
const char* ja_silu_and_mul_cpu(const JaSiluAndMulArgs* args);
const char* ja_silu_and_mul_gpu(const JaSiluAndMulArgs* args, void* stream);
