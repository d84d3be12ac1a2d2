// The page table's and the mask's arithmetic of ja/kernels/paged.h, written once for every backend and for the
// checks (ja/kernels/paged_check.h): how many keys a sequence holds, where key j lives, which keys a query row sees.
#pragma once
#include <cstdint>

#include "ja/kernels/mha_features.h"
#include "ja/kernels/paged.h"

namespace ja {

// Keys of sequence s: (pages - 1) * page_size + its last page's tokens; 0 for a sequence without a page.
JA_MHA_HD int64_t paged_seq_k(const JaPagedKv& kv, int64_t s) {
  const int64_t pages = int64_t(kv.kv_indptr[s + 1]) - kv.kv_indptr[s];
  return pages <= 0 ? 0 : (pages - 1) * kv.page_size + kv.kv_last_page_lens[s];
}

// The pool row (page * page_size + row in page) that holds key j of sequence s.
JA_MHA_HD int64_t paged_slot(const JaPagedKv& kv, int64_t s, int64_t j) {
  return int64_t(kv.kv_page_indices[kv.kv_indptr[s] + j / kv.page_size]) * kv.page_size + j % kv.page_size;
}

// The keys [lo, hi) query token t of a sequence (seq_q tokens, seq_k keys) sees, and its diagonal: bottom-right
// aligned, the window (left, right) with causal folded in as right = 0 (docs/attention.md, "Masks").
JA_MHA_HD MhaRow paged_row(int64_t t, int64_t seq_q, int64_t seq_k, int32_t causal, int64_t left, int64_t right) {
  const int64_t diag = t + seq_k - seq_q;
  if (causal) right = 0;
  const int64_t lo = left < 0 ? 0 : mha_clamp(diag - left, 0, seq_k);
  const int64_t hi = right < 0 ? seq_k : mha_clamp(diag + right + 1, 0, seq_k);
  return MhaRow{lo, hi > lo ? hi : lo, diag};
}

// A descale's value for (sequence s, kv head h): 1 when absent.
JA_MHA_HD float paged_descale(const JaDescale& d, int64_t s, int64_t h) {
  return d.p ? d.p[s * d.seq_stride + h * d.head_stride] : 1.0f;
}

}  // namespace ja
