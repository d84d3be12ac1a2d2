// C ABI of libmha_fwd.so and libmha_bwd.so (what the mha_fwd_ja.so and
// mha_bwd_ja.so shims call).
//
// Layout is BSHD, contiguous: q/o/dq [batch, seq_q, heads_q, head_dim],
// k/dk [batch, seq_k, heads_kv, head_dim], v/dv [batch, seq_k, heads_kv, head_dim_v]
// (o and dout have head_dim_v columns). Grouped-query attention: query head h reads
// kv head h / (heads_q / heads_kv). Varlen and packed batches reach the kernels as
// one dense batch (the Python op packs them) whose mask is given row by row (ROWS).
//
// The score of query i and key j, in the natural-log domain, is
//   s = scale * q_i . k_j                     (softcap == 0)
//   s = softcap * tanh(scale * q_i . k_j / softcap)   (softcap > 0)
//   s += -alibi[h] * |diag_i - j|             (alibi != null)
//   s += bias[b, h, i, j]                     (bias != null)
// and key j is visible to query i iff lo_i <= j < hi_i (the mask, below); P is the
// softmax of the visible scores of a row, then, with dropout, P_ij * keep_ij / (1 - p).
// The helpers of ja/kernels/mha_features.h compute each of these terms; every backend
// calls them, so the CPU and the GPUs agree on the definitions (and draw the same mask).
//
// The mask (ja::MhaMask):
//   NONE    lo_i = 0, hi_i = seq_k.
//   CAUSAL  aligned to the bottom-right corner, as FlashAttention does: lo_i = 0,
//           hi_i = clamp(i + seq_k - seq_q + 1, 0, seq_k).
//   ROWS    lo_i, hi_i and diag_i read from `rows` (below): causal, sliding windows,
//           varlen and segment masks, and their combinations, computed by the Python op.
//           Both lo_i and hi_i are non-decreasing in i, and lo_i <= hi_i, so the keys a tile
//           of rows sees are [lo of its first row, hi of its last row), and the rows a key
//           sees are [cols q_lo_j, cols q_hi_j) (the backward's `cols`).
// diag_i (the key aligned with query i, ALiBi's origin) is i + seq_k - seq_q for NONE and
// CAUSAL, and rows[b][2][i] for ROWS.
//
// A query row that sees no key at all (hi_i <= lo_i, or seq_k == 0) gets output 0,
// lse = +inf and zero gradients, never NaN. lse = +inf is FlashAttention's convention:
// it makes exp(s - lse) exactly 0 in the backward pass. A key that a row does not see
// never changes that row's output or gradients, even where k or v holds NaN or Inf.
//
// Numerics: every product and sum accumulates in float32; inputs are widened on
// load, outputs are rounded once on store. The softmax uses exp2 with log2(e)
// folded into the scale.
#pragma once
#include <cstdint>

#include "ja/api.h"

// The ABI's limits and units, written once here: the checks (ja/kernels/mha_check.h), the FFI handlers and the
// kernels read these, and tests/build/test_abi_constants.py holds the Python op's mirrors to them.
#define JA_MHA_MAX_HEAD_DIM 256   // head_dim and head_dim_v: 1 .. this
#define JA_MHA_SYNC_TILE_ROWS 64  // query rows per int32 word of the deterministic GPU backward's sync workspace

// Fields shared by the forward and the backward: shapes, the score's terms and the mask.
struct JaMhaProblem {
  int32_t dtype;  // ja::DType of q, k, v, o (and dout, dq, dk, dv)
  int64_t batch, seq_q, seq_k, heads_q, heads_kv;
  int64_t head_dim;    // of q and k: any of 1 .. JA_MHA_MAX_HEAD_DIM
  int64_t head_dim_v;  // of v and o: any of 1 .. JA_MHA_MAX_HEAD_DIM
  int32_t mask;        // ja::MhaMask: 0 NONE, 1 CAUSAL, 2 ROWS
  float scale;         // softmax scale (usually 1/sqrt(head_dim))
  float softcap;       // 0: off; > 0: scores pass through softcap * tanh(s / softcap)
  float dropout_p;     // 0: off; in (0, 1): drop probability
  // ROWS: [rows_batch, 3, seq_q] int32: lo, hi, diag of each query row. rows_batch_stride is
  // 0 (one set of rows for every batch) or 3 * seq_q. Null unless mask == ROWS.
  const int32_t* rows;
  int64_t rows_batch_stride;
  // ALiBi slopes, float32 [alibi_batch, heads_q]; alibi_batch_stride 0 or heads_q. Null: none.
  const float* alibi;
  int64_t alibi_batch_stride;
  // Additive bias, float32 [., ., seq_q, seq_k], row stride seq_k; the batch and head strides
  // are 0 where the bias is broadcast over that axis. Null: none.
  const float* bias;
  int64_t bias_batch_stride, bias_head_stride;
  // Dropout: uint32 [4] = philox key (lo, hi), then the batch and query-head offsets of this
  // call in the whole array (a shard adds its offset, so a sharded run draws the same mask as
  // an unsharded one). In the memory of the call's platform (device memory on a GPU). Null
  // unless dropout_p > 0.
  const uint32_t* seed;
};

struct JaMhaFwdArgs {
  JaMhaProblem p;
  const void* q;  // [batch, seq_q, heads_q, head_dim]
  const void* k;  // [batch, seq_k, heads_kv, head_dim]
  const void* v;  // [batch, seq_k, heads_kv, head_dim_v]
  void* o;        // [batch, seq_q, heads_q, head_dim_v]
  float* lse;     // [batch, heads_q, seq_q]: natural-log log-sum-exp of the visible scores
  // Workspace (GPU; the CPU ignores it): the split-KV decode path keeps its per-split
  // partial results here, float32; its size caps the number of splits (0 bytes: one
  // split, same results). Every byte a call reads it has written first.
  void* workspace;
  int64_t workspace_bytes;
};

// Workspace: the backward takes float32 buffers from the caller (the FFI shim receives
// them as extra results, so XLA allocates them and the Python op drops them). Every
// call writes them before it reads them; their previous contents do not matter.
struct JaMhaBwdArgs {
  JaMhaProblem p;
  int32_t deterministic;  // 1: dq, dk, dv (and dbias) bitwise identical run after run
  const void* q;          // [batch, seq_q, heads_q, head_dim]
  const void* k;          // [batch, seq_k, heads_kv, head_dim]
  const void* v;          // [batch, seq_k, heads_kv, head_dim_v]
  const void* o;          // forward output, [batch, seq_q, heads_q, head_dim_v]
  const void* dout;       // [batch, seq_q, heads_q, head_dim_v]
  const float* lse;       // from the forward, [batch, heads_q, seq_q]
  // ROWS: [rows_batch, 2, seq_k] int32: q_lo, q_hi of each key (the query rows that see key j
  // are [q_lo_j, q_hi_j)); same batch stride rule as rows (0 or 2 * seq_k). Null unless ROWS.
  const int32_t* cols;
  int64_t cols_batch_stride;
  void* dq;               // [batch, seq_q, heads_q, head_dim]
  void* dk;               // [batch, seq_k, heads_kv, head_dim]
  void* dv;               // [batch, seq_k, heads_kv, head_dim_v]
  // With a bias: float32 [batch, heads_q, seq_q, seq_k], the gradient of the score s (the
  // Python op sums it over the bias's broadcast axes). Null: no bias gradient.
  float* dbias;
  float* dq_accum;        // workspace [batch, seq_q, heads_q, head_dim]: dQ summed in float32
  float* delta;           // workspace [batch, heads_q, seq_q]: rowsum(dout * o)
  // Workspace of int32 the deterministic GPU backward orders its dQ updates with: the Python op
  // passes batch * heads_q * ceil(seq_q / JA_MHA_SYNC_TILE_ROWS) words when deterministic (one per query tile
  // of that many rows, the smallest any GPU backward uses), else none; a kernel zeroes what it uses before use. The
  // CPU backward is always deterministic and ignores it.
  int32_t* sync;
  int64_t sync_words;
};

// Which kernel family runs a call (the attention API's implementation=, docs/attention.md). AUTO picks as
// documented: on the GPU the Hopper kernels (sm90) where they apply, else the split-KV decode kernel for decode
// shapes, else mma.sync, else SIMT; on the CPU the CPU kernels. A family asked for by name runs the call or
// returns an error naming the family and what it does not take; it never falls back to another.
enum JaMhaImpl : int32_t {
  JA_MHA_IMPL_AUTO = 0,
  JA_MHA_IMPL_CPU = 1,
  JA_MHA_IMPL_SIMT = 2,
  JA_MHA_IMPL_MMA = 3,
  JA_MHA_IMPL_DECODE = 4,  // the forward only: a backward asked for it runs AUTO
  JA_MHA_IMPL_SM90 = 5,
  JA_MHA_IMPL_COUNT = 6
};

// Each entry point picks the generated instance for (dtype, head dims, mask) in the family `impl` allows; an
// unsupported combination returns an error that names what was asked and what exists.
JA_API const char* ja_mha_fwd_cpu(const JaMhaFwdArgs* args);
JA_API const char* ja_mha_fwd_gpu(const JaMhaFwdArgs* args, void* stream, int32_t impl);
// Calls of ja_mha_fwd_gpu that the sm_90a (wgmma + TMA) kernel handled in this process.
JA_API int64_t ja_mha_fwd_sm90_calls(void);
JA_API const char* ja_mha_bwd_cpu(const JaMhaBwdArgs* args);
JA_API const char* ja_mha_bwd_gpu(const JaMhaBwdArgs* args, void* stream, int32_t impl);
// Calls of ja_mha_bwd_gpu that the sm_90a (wgmma + TMA) backward handled in this process.
JA_API int64_t ja_mha_bwd_sm90_calls(void);
