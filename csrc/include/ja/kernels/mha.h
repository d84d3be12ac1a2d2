// C ABI of libmha_fwd.so and libmha_bwd.so (what the mha_fwd_ja.so and
// mha_bwd_ja.so shims call).
//
// Layout is BSHD, contiguous: q/o/dq [batch, seq_q, heads_q, head_dim],
// k/v/dk/dv [batch, seq_k, heads_kv, head_dim]. Grouped-query attention: query
// head h reads kv head h / (heads_q / heads_kv).
//
// Causal masking is aligned to the bottom-right corner, as FlashAttention does:
// query i may attend key j iff j <= i + seq_k - seq_q. With seq_q > seq_k the
// first seq_q - seq_k query rows see no key at all; such a row (and every row
// when seq_k == 0) gets output 0, lse = +inf, and zero gradients, never NaN.
// lse = +inf is FlashAttention's convention: it makes exp(s - lse) exactly 0 in
// the backward pass.
//
// Numerics: every product and sum accumulates in float32; inputs are widened
// on load, outputs are rounded once on store. The softmax uses exp2 with the
// scale folded into log2(e) * scale.
#pragma once
#include <cstdint>

#include "ja/api.h"

struct JaMhaFwdArgs {
  int32_t dtype;  // ja::DType of q, k, v, o
  int64_t batch, seq_q, seq_k, heads_q, heads_kv, head_dim;
  int32_t causal;  // 0 or 1
  float scale;     // softmax scale (usually 1/sqrt(head_dim))
  const void* q;   // [batch, seq_q, heads_q, head_dim]
  const void* k;   // [batch, seq_k, heads_kv, head_dim]
  const void* v;   // [batch, seq_k, heads_kv, head_dim]
  void* o;         // [batch, seq_q, heads_q, head_dim]
  float* lse;      // [batch, heads_q, seq_q]: natural-log log-sum-exp of the scaled scores
  // Workspace (GPU; the CPU ignores it): the split-KV decode path keeps its per-split
  // partial results here, float32; its size caps the number of splits (0 bytes: one
  // split, same results). Every byte a call reads it has written first.
  void* workspace;
  int64_t workspace_bytes;
};

// Workspace: the backward takes two float32 buffers from the caller (the FFI
// shim receives them as extra results, so XLA allocates them and the Python op
// drops them). Both are fully written by every call; their previous contents
// do not matter.
struct JaMhaBwdArgs {
  int32_t dtype;  // ja::DType of q, k, v, o, dout, dq, dk, dv
  int64_t batch, seq_q, seq_k, heads_q, heads_kv, head_dim;
  int32_t causal;
  float scale;
  const void* q;     // [batch, seq_q, heads_q, head_dim]
  const void* k;     // [batch, seq_k, heads_kv, head_dim]
  const void* v;     // [batch, seq_k, heads_kv, head_dim]
  const void* o;     // forward output, [batch, seq_q, heads_q, head_dim]
  const void* dout;  // [batch, seq_q, heads_q, head_dim]
  const float* lse;  // from the forward, [batch, heads_q, seq_q]
  void* dq;          // [batch, seq_q, heads_q, head_dim]
  void* dk;          // [batch, seq_k, heads_kv, head_dim]
  void* dv;          // [batch, seq_k, heads_kv, head_dim]
  float* dq_accum;   // workspace [batch, seq_q, heads_q, head_dim]: dQ summed in float32
  float* delta;      // workspace [batch, heads_q, seq_q]: rowsum(dout * o)
};

// Each entry point picks the generated instance for (dtype, head_dim, causal);
// an unsupported combination returns an error that lists the compiled head dims.
JA_API const char* ja_mha_fwd_cpu(const JaMhaFwdArgs* args);
JA_API const char* ja_mha_fwd_gpu(const JaMhaFwdArgs* args, void* stream);
// Calls of ja_mha_fwd_gpu that the sm_90a (wgmma + TMA) kernel handled in this process.
JA_API int64_t ja_mha_fwd_sm90_calls(void);
JA_API const char* ja_mha_bwd_cpu(const JaMhaBwdArgs* args);
JA_API const char* ja_mha_bwd_gpu(const JaMhaBwdArgs* args, void* stream);
// Calls of ja_mha_bwd_gpu that the sm_90a (wgmma + TMA) backward handled in this process.
JA_API int64_t ja_mha_bwd_sm90_calls(void);
