// C ABI of libpaged_attn.so (what the append_kv_ja.so and paged_attn_ja.so shims call): a paged KV cache,
// written in place by append_kv and read by attention through a page table.
//
// Pools are NHD, K and V separate: k_pool [num_pages, page_size, heads_kv, head_dim], v_pool [num_pages,
// page_size, heads_kv, head_dim_v], contiguous. Token slot s of the pool is page s / page_size, row
// s % page_size. The page table is FlashInfer's, int32:
//   kv_indptr          [num_seqs + 1]  sequence i owns kv_page_indices[kv_indptr[i] .. kv_indptr[i + 1])
//   kv_page_indices    [total_pages]   page ids (each in [0, num_pages)), in token order
//   kv_last_page_lens  [num_seqs]      tokens in each sequence's last page: 1 .. page_size (0 for a sequence
//                                       with no page: it holds no key)
// so sequence i holds seq_k = (pages - 1) * page_size + last tokens, key j on page kv_page_indices[kv_indptr[i]
// + j / page_size], row j % page_size. Queries are packed: sequence i owns rows [cu_seqlens_q[i],
// cu_seqlens_q[i + 1]) of q [total_q, heads_q, head_dim] (decode: one row each).
//
// Attention of query token t of sequence i (seq_q of them) is bottom-right aligned in the sequence's keys, as
// ja/kernels/mha.h's: diag = t + seq_k - seq_q; the window (left, right), -1 unbounded, with causal folded in
// (right = 0), gives the keys [lo, hi): lo = clamp(diag - left, 0, seq_k) (0 if left < 0), hi = clamp(diag +
// right + 1, 0, seq_k) (seq_k if right < 0), hi = max(hi, lo). The score is s = scale * qd * kd * (q . k) (qd, kd:
// the descales below), through softcap * tanh(s / softcap) when softcap > 0; out = vd * softmax(s) v. A row that
// sees no key gives 0 (lse +inf), never NaN. GQA: query head h reads kv head h / (heads_q / heads_kv).
//
// Element types (ja::DType): q in float32, bfloat16, float16 or float8_e4m3fn; the pools each in q's dtype or
// float8_e4m3fn (k_pool and v_pool the same); out in float32, bfloat16 or float16. Every product and sum
// accumulates in float32.
//
// Descales multiply: the value a float8 element stands for is element * descale (FlashAttention 3's q/k/v
// descales, and vLLM's k_scale / v_scale of an FP8 KV cache). Each descale is absent (null: 1), one float32 for
// the whole tensor, or one per (sequence, kv head): float32 [num_seqs, heads_kv].
//
// Every index the kernels follow is checked first (ja/kernels/paged_check.h): a call whose metadata breaks a rule
// above returns an error naming the argument, and no kernel reads out of bounds.
#pragma once
#include <cstdint>

#include "ja/api.h"

// One descale: absent (p null), per tensor (both strides 0) or per (sequence, kv head) (seq_stride heads_kv,
// head_stride 1).
struct JaDescale {
  const float* p;
  int64_t seq_stride, head_stride;
};

// The pools and the page table of one call.
struct JaPagedKv {
  int32_t dtype;  // ja::DType of both pools
  int64_t num_pages, page_size, heads_kv, head_dim, head_dim_v;
  const void* k_pool;
  const void* v_pool;
  int64_t num_seqs, total_pages;
  const int32_t* kv_indptr;          // [num_seqs + 1]
  const int32_t* kv_page_indices;    // [total_pages]
  const int32_t* kv_last_page_lens;  // [num_seqs]
};

struct JaPagedAttnArgs {
  JaPagedKv kv;
  int32_t q_dtype, out_dtype;        // ja::DType
  int64_t total_q, heads_q;
  const void* q;                     // [total_q, heads_q, head_dim]
  const int32_t* cu_seqlens_q;       // [num_seqs + 1]
  JaDescale q_descale, k_descale, v_descale;
  float scale;                       // softmax scale, finite
  float softcap;                     // 0: off; > 0: scores pass through softcap * tanh(s / softcap)
  int32_t causal;                    // 1: right = 0 (the window's right edge is the diagonal)
  int64_t window_left, window_right; // -1: unbounded
  int64_t max_seqlen_q, max_seqlen_k; // 0: not given; given, no sequence may have more query tokens or keys
  void* out;                         // [total_q, heads_q, head_dim_v], out_dtype
  float* lse;                        // [heads_q, total_q] natural-log log-sum-exp of the visible scores; null: not
                                     // wanted
};

// append_kv: token n of k_new/v_new [num_tokens, heads_kv, head_dim(_v)] goes to slot slot_mapping[n] of the
// pools (a negative slot skips the token); k_pool/v_pool are written in place (kv.k_pool, kv.v_pool point at the
// same memory, made writable). Into a float8_e4m3fn pool a value x is stored as x / scale rounded to nearest and
// saturated to +-448 (the scale multiplies on read), k_scale / v_scale float32 [1]; into a pool of k_new's dtype
// it is copied.
struct JaAppendKvArgs {
  int32_t new_dtype;       // ja::DType of k_new and v_new
  int32_t slot_bits;       // 32 or 64: slot_mapping is int32 or int64
  int64_t num_tokens, heads_kv, head_dim, head_dim_v;
  const void* k_new;
  const void* v_new;
  const void* slot_mapping;  // [num_tokens]
  const float* k_scale;      // [1]; null: 1 (a pool of k_new's dtype ignores it)
  const float* v_scale;
  int32_t pool_dtype;        // ja::DType of both pools
  int64_t num_pages, page_size;
  void* k_pool;
  void* v_pool;
};

JA_API const char* ja_paged_attn_cpu(const JaPagedAttnArgs* args);
JA_API const char* ja_append_kv_cpu(const JaAppendKvArgs* args);
