// The rules of ja/kernels/paged.h, checked in host memory before any kernel follows an index: every page a
// sequence uses is a page of the pools, kv_indptr starts at 0 and never decreases, each last page holds 1 ..
// page_size tokens, every slot append_kv writes is in the pools. Each returns the first rule a call breaks, as
// an error naming the argument, the entry, its value, what is allowed and the fix (ja_error's text); nullptr when
// it keeps them. The CPU entry points check every call (the metadata is in host memory; the checks cost
// O(sequences + pages + tokens), nothing beside the attention), and the FFI handlers return the same text as
// InvalidArgument before calling them.
#pragma once
#include <cmath>
#include <cstdint>

#include "ja/api.h"
#include "ja/dtype.h"
#include "ja/kernels/mha.h"
#include "ja/kernels/paged.h"
#include "ja/kernels/paged_rows.h"

namespace ja {

inline bool paged_dtype_ok(int32_t dt) { return dt >= int(DType::kF32) && dt <= int(DType::kF8E4M3); }

// The pools' shape and the page table.
inline const char* paged_kv_error(const JaPagedKv& kv) {
  if (kv.num_pages < 0 || kv.page_size < 1 || kv.heads_kv < 1 || kv.num_seqs < 0 || kv.total_pages < 0)
    return ja_error(
        "paged attention: num_pages %lld, heads_kv %lld, num_seqs %lld, total_pages %lld must be >= 0 "
        "and page_size %lld >= 1",
        (long long)kv.num_pages, (long long)kv.heads_kv, (long long)kv.num_seqs, (long long)kv.total_pages,
        (long long)kv.page_size);
  if (!paged_dtype_ok(kv.dtype)) return ja_error("paged attention: the pools' dtype id %d is unknown", kv.dtype);
  const int32_t* ptr = kv.kv_indptr;
  if (ptr[0] != 0)
    return ja_error(
        "kv_indptr[0] is %d, not 0: kv_indptr[i] is where sequence i's pages start in kv_page_indices "
        "(an exclusive running total of pages per sequence)",
        ptr[0]);
  for (int64_t s = 0; s < kv.num_seqs; ++s)
    if (ptr[s + 1] < ptr[s])
      return ja_error(
          "kv_indptr decreases: kv_indptr[%lld] = %d < kv_indptr[%lld] = %d; it is the running total of "
          "the pages of the sequences before each one",
          (long long)(s + 1), ptr[s + 1], (long long)s, ptr[s]);
  if (ptr[kv.num_seqs] > kv.total_pages)
    return ja_error("kv_indptr[%lld] = %d is past the end of kv_page_indices (%lld entries)", (long long)kv.num_seqs,
                    ptr[kv.num_seqs], (long long)kv.total_pages);
  for (int64_t s = 0; s < kv.num_seqs; ++s) {
    const int32_t last = kv.kv_last_page_lens[s];
    if (ptr[s + 1] == ptr[s] && last != 0)
      return ja_error(
          "kv_last_page_lens[%lld] = %d, but sequence %lld has no page (kv_indptr[%lld] == "
          "kv_indptr[%lld]): a sequence without a page holds no key; give 0",
          (long long)s, last, (long long)s, (long long)s, (long long)(s + 1));
    if (ptr[s + 1] > ptr[s] && (last < 1 || last > kv.page_size))
      return ja_error(
          "kv_last_page_lens[%lld] = %d is outside 1 .. %lld: it counts the tokens in sequence %lld's "
          "last page (page_size %lld)",
          (long long)s, last, (long long)kv.page_size, (long long)s, (long long)kv.page_size);
  }
  for (int64_t i = ptr[0]; i < ptr[kv.num_seqs]; ++i) {
    const int32_t page = kv.kv_page_indices[i];
    if (page < 0 || page >= kv.num_pages)
      return ja_error("kv_page_indices[%lld] = %d is not a page of the pools, whose pages are 0 .. %lld", (long long)i,
                      page, (long long)(kv.num_pages - 1));
  }
  return nullptr;
}

inline const char* paged_descale_error(const char* name, const JaDescale& d, int64_t heads_kv) {
  if (!d.p) return nullptr;
  const bool tensor = d.seq_stride == 0 && d.head_stride == 0;
  const bool per_head = d.seq_stride == heads_kv && d.head_stride == 1;
  if (!tensor && !per_head)
    return ja_error("%s: strides (%lld, %lld) are neither (0, 0) (one value) nor (%lld, 1) ([num_seqs, heads_kv])",
                    name, (long long)d.seq_stride, (long long)d.head_stride, (long long)heads_kv);
  return nullptr;
}

inline const char* paged_attn_error(const JaPagedAttnArgs& a) {
  const JaPagedKv& kv = a.kv;
  if (const char* e = paged_kv_error(kv)) return e;
  if (a.total_q < 0 || a.heads_q < 1 || a.heads_q % kv.heads_kv)
    return ja_error(
        "paged attention: total_q %lld must be >= 0 and heads_q %lld a positive multiple of heads_kv "
        "%lld",
        (long long)a.total_q, (long long)a.heads_q, (long long)kv.heads_kv);
  if (kv.head_dim < 1 || kv.head_dim > JA_MHA_MAX_HEAD_DIM || kv.head_dim_v < 1 || kv.head_dim_v > JA_MHA_MAX_HEAD_DIM)
    return ja_error("paged attention: head_dim %lld and head_dim_v %lld must each be in 1..%d", (long long)kv.head_dim,
                    (long long)kv.head_dim_v, JA_MHA_MAX_HEAD_DIM);
  if (!paged_dtype_ok(a.q_dtype) || !paged_dtype_ok(a.out_dtype) || a.out_dtype == int(DType::kF8E4M3))
    return ja_error("paged attention: q dtype id %d or output dtype id %d is not allowed", a.q_dtype, a.out_dtype);
  if (!std::isfinite(a.scale)) return ja_error("paged attention: scale %g must be finite", double(a.scale));
  if (!(a.softcap >= 0.0f) || !std::isfinite(a.softcap))
    return ja_error("paged attention: softcap %g must be 0 (off) or a finite value > 0", double(a.softcap));
  if (a.window_left < -1 || a.window_right < -1)
    return ja_error("paged attention: window (%lld, %lld): each side is -1 (unbounded) or >= 0",
                    (long long)a.window_left, (long long)a.window_right);
  const JaDescale* ds[] = {&a.q_descale, &a.k_descale, &a.v_descale};
  const char* names[] = {"q_descale", "k_descale", "v_descale"};
  for (int i = 0; i < 3; ++i)
    if (const char* e = paged_descale_error(names[i], *ds[i], kv.heads_kv)) return e;
  const int32_t* cu = a.cu_seqlens_q;
  if (cu[0] != 0)
    return ja_error(
        "cu_seqlens_q[0] is %d, not 0: sequence i's queries are rows cu_seqlens_q[i] .. "
        "cu_seqlens_q[i + 1] - 1 of query",
        cu[0]);
  for (int64_t s = 0; s < kv.num_seqs; ++s)
    if (cu[s + 1] < cu[s])
      return ja_error("cu_seqlens_q decreases: cu_seqlens_q[%lld] = %d < cu_seqlens_q[%lld] = %d", (long long)(s + 1),
                      cu[s + 1], (long long)s, cu[s]);
  if (cu[kv.num_seqs] > a.total_q)
    return ja_error("cu_seqlens_q[%lld] = %d is past query's %lld rows", (long long)kv.num_seqs, cu[kv.num_seqs],
                    (long long)a.total_q);
  if (a.max_seqlen_q < 0 || a.max_seqlen_k < 0)
    return ja_error("paged attention: max_seqlen_q %lld and max_seqlen_k %lld must be >= 0 (0: not given)",
                    (long long)a.max_seqlen_q, (long long)a.max_seqlen_k);
  for (int64_t s = 0; s < kv.num_seqs; ++s) {
    const int64_t seq_q = cu[s + 1] - cu[s], seq_k = paged_seq_k(kv, s);
    if (a.max_seqlen_q && seq_q > a.max_seqlen_q)
      return ja_error("sequence %lld has %lld query tokens, more than max_seqlen_q %lld: raise max_seqlen_q",
                      (long long)s, (long long)seq_q, (long long)a.max_seqlen_q);
    if (a.max_seqlen_k && seq_k > a.max_seqlen_k)
      return ja_error(
          "sequence %lld holds %lld keys, more than max_seqlen_k %lld (paged_attention's max_seq_len): "
          "raise it (bucket it: it is a compile-time constant)",
          (long long)s, (long long)seq_k, (long long)a.max_seqlen_k);
  }
  return nullptr;
}

// append_kv: shapes, dtypes and every slot.
inline const char* append_kv_error(const JaAppendKvArgs& a) {
  if (a.num_tokens < 0 || a.heads_kv < 1 || a.head_dim < 1 || a.head_dim_v < 1 || a.num_pages < 0 || a.page_size < 1)
    return ja_error(
        "append_kv: num_tokens %lld, num_pages %lld must be >= 0 and heads_kv %lld, head_dim %lld, "
        "head_dim_v %lld, page_size %lld >= 1",
        (long long)a.num_tokens, (long long)a.num_pages, (long long)a.heads_kv, (long long)a.head_dim,
        (long long)a.head_dim_v, (long long)a.page_size);
  if (!paged_dtype_ok(a.new_dtype) || !paged_dtype_ok(a.pool_dtype) ||
      (a.pool_dtype != a.new_dtype && a.pool_dtype != int(DType::kF8E4M3)))
    return ja_error(
        "append_kv: k_new's dtype id %d cannot be written into pools of dtype id %d (the pools hold "
        "k_new's dtype, or float8_e4m3fn)",
        a.new_dtype, a.pool_dtype);
  if (a.pool_dtype == int(DType::kF8E4M3) && a.pool_dtype != a.new_dtype) {
    const float* scales[] = {a.k_scale, a.v_scale};
    const char* names[] = {"k_scale", "v_scale"};
    for (int i = 0; i < 2; ++i)
      if (!scales[i] || !(*scales[i] > 0.0f) || !std::isfinite(*scales[i]))
        return ja_error("append_kv: %s[0] = %g must be a finite number > 0 (a float8_e4m3fn pool holds x / %s)",
                        names[i], scales[i] ? double(*scales[i]) : 0.0, names[i]);
  }
  if (a.slot_bits != 32 && a.slot_bits != 64)
    return ja_error("append_kv: slot_mapping must be int32 or int64 (slot_bits %d)", a.slot_bits);
  const int64_t slots = a.num_pages * a.page_size;
  for (int64_t n = 0; n < a.num_tokens; ++n) {
    const int64_t slot = a.slot_bits == 32 ? int64_t(static_cast<const int32_t*>(a.slot_mapping)[n])
                                           : static_cast<const int64_t*>(a.slot_mapping)[n];
    if (slot >= slots)
      return ja_error(
          "slot_mapping[%lld] = %lld is beyond the pools' %lld slots (%lld pages x %lld tokens): slot s "
          "is page s / page_size, row s %% page_size; a negative slot skips the token",
          (long long)n, (long long)slot, (long long)slots, (long long)a.num_pages, (long long)a.page_size);
  }
  return nullptr;
}

}  // namespace ja
