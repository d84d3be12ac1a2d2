// Helpers shared by the XLA FFI shims (csrc/ffi/<op>/).
#pragma once
#include <string>

#include "ja/api.h"
#include "ja/dtype.h"
#include "xla/ffi/api/ffi.h"

namespace ja {
namespace ffi = xla::ffi;

// Maps an FFI element type to ours; false for types the kernels do not take.
inline bool to_dtype(ffi::DataType t, DType* out) {
  switch (t) {
    case ffi::DataType::F32: *out = DType::kF32; return true;
    case ffi::DataType::BF16: *out = DType::kBF16; return true;
    case ffi::DataType::F16: *out = DType::kF16; return true;
    default: return false;
  }
}

inline ffi::Error invalid(const std::string& msg) { return ffi::Error::InvalidArgument(msg); }
inline ffi::Error from_kernel(const char* err) { return err ? ffi::Error::Internal(err) : ffi::Error::Success(); }

// Handlers take optional trailing "poison" buffers: test builds pass NaN-filled
// buffers aliased to the results (JA_POISON_OUTPUTS=1 in jax_aiter/ops/_ffi.py),
// so elements a kernel forgets to write stay NaN. They are never read here.
inline ffi::Error check_poison(const ffi::RemainingArgs& poison, size_t n_results) {
  if (poison.size() != 0 && poison.size() != n_results)
    return invalid("expected 0 or " + std::to_string(n_results) + " aliased output buffers, got " +
                   std::to_string(poison.size()));
  return ffi::Error::Success();
}

// Product of all dimensions but the last (the "rows" of a row-wise op).
inline int64_t leading_rows(const ffi::AnyBuffer& b) {
  const auto dims = b.dimensions();
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < dims.size(); ++i) rows *= dims[i];
  return rows;
}
inline int64_t last_dim(const ffi::AnyBuffer& b) {
  const auto dims = b.dimensions();
  return dims.size() ? dims[dims.size() - 1] : 1;
}
}  // namespace ja

// Every shim exports the XLA FFI API version of the headers it was compiled
// against; the Python loader compares it with the installed jaxlib's before
// registering any handler.
#define JA_DEFINE_FFI_API_VERSION()                       \
  JA_API int ja_ffi_api_version(int* major, int* minor) { \
    *major = XLA_FFI_API_MAJOR;                           \
    *minor = XLA_FFI_API_MINOR;                           \
    return 0;                                             \
  }

#define JA_FFI_HANDLER(name) JA_API XLA_FFI_Error* name(XLA_FFI_CallFrame* call_frame)
