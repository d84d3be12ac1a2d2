// Argument checks shared by the paged KV cache's FFI handlers (append_kv, paged_attn): the operands' dtypes and
// shapes, turned into the structs of ja/kernels/paged.h. The Python ops (jax_aiter/ops/paged.py) check first and
// give the friendlier error; these guard the C ABI against any other caller (a hand-written ffi_call): a bad shape
// or dtype is an InvalidArgument error naming the operand, never an out-of-bounds access. Values (the page table,
// the slots) are checked in host memory by ja/kernels/paged_check.h.
#pragma once
#include <string>

#include "ja/ffi_util.h"
#include "ja/kernels/paged.h"
#include "ja/kernels/paged_check.h"
#include "mha_args.h"

namespace ja {

// The element types of the pools and of FP8 attention's inputs: ffi_util's compute dtypes and float8_e4m3fn.
inline bool to_paged_dtype(ffi::DataType t, DType* out) {
  if (t == ffi::DataType::F8E4M3FN) {
    *out = DType::kF8E4M3;
    return true;
  }
  return to_dtype(t, out);
}

inline ffi::Error paged_invalid(const char* op, const std::string& what) {
  return invalid(std::string(op) + ": " + what);
}

// k_pool [num_pages, page_size, heads_kv, head_dim], v_pool [num_pages, page_size, heads_kv, head_dim_v], one
// dtype; into kv's shape fields.
inline ffi::Error paged_pools(const char* op, const ffi::AnyBuffer& k, const ffi::AnyBuffer& v, JaPagedKv* kv) {
  DType dt;
  if (!to_paged_dtype(k.element_type(), &dt))
    return paged_invalid(op, "k_pool must be float32, bfloat16, float16 or float8_e4m3fn");
  if (v.element_type() != k.element_type()) return paged_invalid(op, "v_pool's dtype differs from k_pool's");
  if (k.dimensions().size() != 4 || v.dimensions().size() != 4)
    return paged_invalid(op, "k_pool " + shape_text(k) + " and v_pool " + shape_text(v) +
                                 " must have rank 4 "
                                 "[num_pages, tokens_per_page, kv_heads, head_dim]");
  const auto kd = k.dimensions(), vd = v.dimensions();
  if (vd[0] != kd[0] || vd[1] != kd[1] || vd[2] != kd[2])
    return paged_invalid(op, "v_pool " + shape_text(v) + " must have k_pool's pages, tokens per page and kv heads (" +
                                 shape_text(k) + ")");
  kv->dtype = int32_t(dt);
  kv->num_pages = kd[0], kv->page_size = kd[1], kv->heads_kv = kd[2], kv->head_dim = kd[3], kv->head_dim_v = vd[3];
  kv->k_pool = k.untyped_data(), kv->v_pool = v.untyped_data();
  return ffi::Error::Success();
}

// A float32 descale: (0,) absent, (1,) one value, or [num_seqs, heads_kv].
inline ffi::Error paged_descale(const char* op, const char* name, const ffi::AnyBuffer& b, int64_t num_seqs,
                                int64_t heads_kv, JaDescale* d) {
  *d = JaDescale{nullptr, 0, 0};
  if (b.element_type() != ffi::DataType::F32) return paged_invalid(op, std::string(name) + " must be float32");
  if (has_dims(b, {0})) return ffi::Error::Success();
  if (has_dims(b, {1})) {
    d->p = static_cast<const float*>(b.untyped_data());
    return ffi::Error::Success();
  }
  if (has_dims(b, {num_seqs, heads_kv})) {
    *d = JaDescale{static_cast<const float*>(b.untyped_data()), heads_kv, 1};
    return ffi::Error::Success();
  }
  return paged_invalid(op, std::string(name) + " has shape " + shape_text(b) + "; a descale is (1,) (one value) or " +
                               dims_text({num_seqs, heads_kv}) + " ([num_seqs, kv_heads]), or (0,) when absent");
}

// An int32 vector of n entries (n < 0: any length).
inline ffi::Error paged_index(const char* op, const char* name, const ffi::AnyBuffer& b, int64_t n) {
  if (b.element_type() != ffi::DataType::S32 || b.dimensions().size() != 1 || (n >= 0 && b.dimensions()[0] != n))
    return paged_invalid(op, std::string(name) + " must be int32 of shape " + (n >= 0 ? dims_text({n}) : "(n,)") +
                                 ", got " + shape_text(b));
  return ffi::Error::Success();
}

}  // namespace ja
