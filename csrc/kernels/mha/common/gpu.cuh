// Building blocks of the GPU flash-attention kernels (CUDA and HIP from one source).
//
// Thread layout shared by all MHA kernels: 128 threads = 8 row groups (ty) x
// 16 lanes (tx). A thread owns tile rows ty, ty + 8, ... and columns tx,
// tx + 16, ...; the 16 lanes of a row group are consecutive lanes of one warp
// (on 32- and 64-wide warps alike), so row reductions are 16-lane shuffles.
//
// Tiles live in shared memory in the input dtype, rows padded by one 32-bit
// word so the 16 lanes reading 16 different rows at the same column hit 16
// different banks. The inner products are plain loops over shared memory
// (SIMT, float32 FMA); the mma.sync kernels use the matrix units instead.
//
// Every kernel takes the instance's padded head dim D as a template parameter and the call's head_dim and
// head_dim_v (1..D each) at run time: tiles are zero-padded past them on load, and only they are stored.
// The mask reaches every kernel as per-row [lo, hi) key ranges (mha_row: NONE, CAUSAL and ROWS alike), the
// score's terms as ScoreTerms, dropout as Dropout (ja/kernels/mha_features.h's definitions).
#pragma once
#include <cstdint>
#include <string>

#include "ja/api.h"
#include "ja/dtype.h"
#include "ja/env.h"
#include "ja/gpu.h"
#include "ja/kernels/mha.h"
#include "ja/kernels/mha_check.h"
#include "ja/kernels/mha_features.h"
#include "ja/mma.h"

namespace ja {
namespace mha_gpu {

constexpr int kThreads = 128;
constexpr int kTx = 16;               // lanes per row group
constexpr int kTy = kThreads / kTx;   // row groups
constexpr int kSmemBudget = 48 * 1024;  // shared memory without opt-in (CUDA); LDS is 64 KiB on CDNA
#if defined(JA_GPU_HIP)
constexpr int kSmemMax = 64 * 1024;  // a block's LDS on CDNA
#else
constexpr int kSmemMax = 227 * 1024;  // a block's shared memory with opt-in (sm_90; sm_80 has 163 KiB)
#endif
constexpr float kLn2 = 0.6931471805599453f;

// The features (ja::MhaFeature bits, ja/kernels/mha_features.h) each GPU kernel handles. The dispatch in
// mha_fwd_gpu / mha_bwd_gpu sends a call to the first kernel that handles all of its features (split-KV
// decode, then mma.sync, then SIMT), and the SIMT kernels handle every one, so a call is refused only where
// no kernel can run it (refuse_unhandled names the feature); the sm_90a kernels decline what they do not
// handle (theirs: kFwdFeatures, kBwdFeatures in sm90/fwd_args.cuh, sm90/bwd_args.cuh). Bias and dropout
// run on the SIMT kernels only.
constexpr uint32_t kMhaFwdAll = kMhaHeadDimV | kMhaRows | kMhaSoftcap | kMhaAlibi | kMhaBias | kMhaDropout;
constexpr uint32_t kFwdSimtFeatures = kMhaFwdAll;
constexpr uint32_t kFwdMmaFeatures = kMhaHeadDimV | kMhaRows | kMhaSoftcap | kMhaAlibi;
constexpr uint32_t kFwdDecodeFeatures = kMhaHeadDimV | kMhaRows | kMhaSoftcap | kMhaAlibi;
constexpr uint32_t kBwdSimtFeatures = kMhaFwdAll | kMhaDeterministic;
constexpr uint32_t kBwdMmaFeatures = kFwdMmaFeatures | kMhaDeterministic;

// nullptr when the kernel `kernel` handles every feature of args (JaMhaFwdArgs::p or JaMhaBwdArgs), else an
// error naming the first one it does not.
template <typename Args>
inline const char* refuse_unhandled(const char* op, const char* kernel, const Args& args, uint32_t handled) {
  const char* f = mha_unhandled_feature(args, handled);
  return f ? ja_error("%s: the %s GPU kernel does not handle %s yet; run this call on the CPU backend", op, kernel, f)
           : nullptr;
}

// The error of a call that asked for the kernel family `impl` by name (the attention API's implementation=) where
// that family does not take it: `why`, and the way out. A named family never falls back to another.
// `why` may be ja_error's own thread-local text (decode_refusal's): it is copied before ja_error writes again.
inline const char* refuse_forced(const char* op, int32_t impl, const char* why) {
  const std::string reason = why;
  return ja_error(
      "%s: implementation '%s' does not take this call: %s; use implementation=None to choose "
      "automatically",
      op, mha_impl_name(impl), reason.c_str());
}

// The instance's padded head dim D holds the call's head_dim and head_dim_v (each 1..D; the kernels zero-pad
// the columns past them on load and never store them), and positions fit int32 (the ROWS mask's type).
template <int D>
inline const char* check_problem(const char* op, const JaMhaProblem& p) {
  if (p.head_dim < 1 || p.head_dim > D || p.head_dim_v < 1 || p.head_dim_v > D)
    return ja_error(
        "%s: head_dim %lld and head_dim_v %lld must each lie in [1, %d] for the GPU instance of head "
        "dim %d",
        op, (long long)p.head_dim, (long long)p.head_dim_v, D, D);
  if (p.seq_q > 0x3fffffffLL || p.seq_k > 0x3fffffffLL)
    return ja_error("%s: seq_q %lld and seq_k %lld must be below 2^30 on the GPU", op, (long long)p.seq_q,
                    (long long)p.seq_k);
  if (p.dropout_p != 0.0f && !(p.dropout_p > 0.0f && p.dropout_p < 1.0f))
    return ja_error("%s: dropout_p %g must lie in [0, 1)", op, double(p.dropout_p));
  return nullptr;
}

// Elements per 16-byte vector of T.
template <typename T>
constexpr int vec_elems() {
  return 16 / int(sizeof(T));
}

// Whether rows of head_dim and head_dim_v elements split into whole 16-byte vectors (the base pointers are
// 16-byte aligned: the launches check it), so tiles load by 16-byte copies; else element by element.
template <typename T>
JA_HOST_DEVICE bool vec_dims(const JaMhaProblem& p) {
  return p.head_dim % vec_elems<T>() == 0 && p.head_dim_v % vec_elems<T>() == 0;
}

// Whether a value of T is an infinity or a NaN (exponent bits all ones).
JA_DEVICE bool nonfinite(float v) { return (__float_as_uint(v) & 0x7f800000u) == 0x7f800000u; }
JA_DEVICE bool nonfinite(bf16_t v) { return (v.bits & 0x7f80u) == 0x7f80u; }
JA_DEVICE bool nonfinite(f16_t v) { return (v.bits & 0x7c00u) == 0x7c00u; }

// The score of q_i . k_j = acc in the natural-log domain (ja/kernels/mha.h): scale, softcap, ALiBi, bias,
// for one (batch, query head). Every GPU kernel computes it here, forward and backward alike, so the
// backward's P = exp(s - lse) recomputes the forward's s.
struct ScoreTerms {
  float scale, softcap, inv_softcap, slope;
  bool alibi;
  const float* bias;  // this (batch, head)'s [seq_q][seq_k] rows (row stride seq_k); null: none
  int64_t seq_k;
  // softcap, ALiBi or bias: without them the score is scale * acc, which kernels fold into one product.
  JA_DEVICE bool any() const { return softcap > 0.0f || alibi || bias != nullptr; }
  // *t: tanh(scale acc / softcap) (the backward's softcap derivative is 1 - t^2); 0 without softcap.
  JA_DEVICE float operator()(float acc, int64_t i, int64_t diag, int64_t j, float* t) const {
    float x = acc * scale;
    *t = 0.0f;
    if (softcap > 0.0f) {
      *t = ja_tanh(x * inv_softcap);
      x = softcap * *t;
    }
    if (alibi) x += mha_alibi(slope, diag, j);
    if (bias) x += bias[i * seq_k + j];
    return x;
  }
};

JA_DEVICE ScoreTerms score_terms(const JaMhaProblem& p, int64_t b, int64_t h) {
  ScoreTerms st;
  st.scale = p.scale;
  st.softcap = p.softcap;
  st.inv_softcap = p.softcap > 0.0f ? 1.0f / p.softcap : 0.0f;
  st.alibi = p.alibi != nullptr;
  st.slope = st.alibi ? p.alibi[b * p.alibi_batch_stride + h] : 0.0f;
  st.bias = p.bias ? p.bias + b * p.bias_batch_stride + h * p.bias_head_stride : nullptr;
  st.seq_k = p.seq_k;
  return st;
}

// Dropout of one call (ja/kernels/mha_features.h's draw): a kept element of P is scaled by 1 / (1 - p).
struct Dropout {
  uint32_t seed[4];
  uint32_t threshold;
  float scale;
  bool on;
  // The keep bits of rows [i0, i0 + rows) x keys [j0, j0 + nk) of (b, h), nk <= 32 W: key j of row r is bit
  // (j - j0) % 32 of bits[r * W + (j - j0) / 32] (0 past rows / nk). The block's threads compute them together,
  // each philox block (four keys) once: a quarter of the draws one per element would take.
  template <int ROWS, int W>
  JA_DEVICE void tile_bits(int64_t b, int64_t h, int64_t i0, int rows, int64_t j0, int nk, uint32_t* bits) const {
    for (int idx = threadIdx.x; idx < ROWS * W; idx += kThreads) {
      const int r = idx / W, w = idx % W;
      const int64_t k0 = j0 + 32 * w, k1 = j0 + (32 * w + 32 < nk ? 32 * w + 32 : nk);
      uint32_t word = 0;
      if (r < rows)
        for (int64_t kb = k0 >> 2; kb <= (k1 - 1) >> 2 && k0 < k1; ++kb) {
          const MhaPhilox x = mha_dropout_block(seed, b, h, i0 + r, 4 * kb);
#pragma unroll
          for (int u = 0; u < 4; ++u) {
            const int64_t key = 4 * kb + u;
            if (key >= k0 && key < k1 && x.x[u] >= threshold) word |= 1u << (key - k0);
          }
        }
      bits[idx] = word;
    }
  }
  // The factor of a kept (bit 1) or dropped element: 1 / (1 - p) or 0.
  JA_DEVICE float factor(const uint32_t* bits, int W, int r, int j) const {
    return (bits[r * W + (j >> 5)] >> (j & 31)) & 1u ? scale : 0.0f;
  }
};

JA_DEVICE Dropout dropout_of(const JaMhaProblem& p) {
  Dropout d{};
  d.on = p.dropout_p > 0.0f;
  if (d.on) {
#pragma unroll
    for (int i = 0; i < 4; ++i) d.seed[i] = p.seed[i];
    d.threshold = mha_dropout_threshold(p.dropout_p);
    d.scale = 1.0f / (1.0f - p.dropout_p);
  }
  return d;
}

// Row stride (elements) of a [rows][D] tile of T in shared memory.
template <typename T, int D>
constexpr int tile_ld() {
  return D + int(4 / sizeof(T));
}

template <typename T, int N>
struct alignas(16) Pack {
  T v[N];
};

// Copies rows [0, rows_valid) x columns [0, cols) of a global tile (rows `stride` elements apart) to shared
// memory [ROWS][D] (row stride tile_ld), zero elsewhere: with 16-byte loads when `vec` (cols and stride
// multiples of 16 bytes, g 16-byte aligned), else element by element. With CHECK, returns whether this
// thread loaded a non-finite value (the kernels' NaN/Inf guard).
template <typename T, int ROWS, int D, bool CHECK = false>
JA_DEVICE bool load_tile(T* smem, const T* g, int64_t stride, int rows_valid, int cols, bool vec) {
  constexpr int kVec = vec_elems<T>();
  constexpr int kPerRow = D / kVec;
  constexpr int kLd = tile_ld<T, D>();
  static_assert(D % kVec == 0, "the padded head dim must be a multiple of 16 bytes");
  bool bad = false;
  if (vec) {
    for (int idx = threadIdx.x; idx < ROWS * kPerRow; idx += kThreads) {
      const int r = idx / kPerRow, c = (idx % kPerRow) * kVec;
      Pack<T, kVec> p;
      if (r < rows_valid && c < cols) {
        p = *reinterpret_cast<const Pack<T, kVec>*>(g + r * stride + c);
        if (CHECK) {
#pragma unroll
          for (int e = 0; e < kVec; ++e) bad |= nonfinite(p.v[e]);
        }
      } else {
#pragma unroll
        for (int e = 0; e < kVec; ++e) p.v[e] = from_f32<T>(0.0f);
      }
#pragma unroll
      for (int e = 0; e < kVec; ++e) smem[r * kLd + c + e] = p.v[e];
    }
  } else {
    for (int idx = threadIdx.x; idx < ROWS * D; idx += kThreads) {
      const int r = idx / D, c = idx % D;
      T x = from_f32<T>(0.0f);
      if (r < rows_valid && c < cols) {
        x = g[r * stride + c];
        if (CHECK) bad |= nonfinite(x);
      }
      smem[r * kLd + c] = x;
    }
  }
  return bad;
}

// First query row that can see key `key` (bottom-right causal alignment).
JA_HOST_DEVICE int64_t first_query_for_key(int64_t key, int64_t seq_q, int64_t seq_k) {
  const int64_t q = key - (seq_k - seq_q);
  return q > 0 ? q : 0;
}

// Where a block of a (tiles, heads, batches) grid works. Causal tiles differ in work (a forward's last query
// tile sees every key, its first one few; a backward's first key block is seen by every query tile, its last
// by few), and blocks start about in the order of their linear index. With `longest_first` the (head, batch)
// pairs are taken in chunks of `chunk` pairs (0: all of them), and within a chunk the linear index runs over
// its pairs first and tiles last, from each head's heaviest tile (the last one when `heavy_last`, else the
// first) to its lightest: heavy tiles start before light ones (longest-processing-time first), so light ones
// fill the last wave, where the grid's own order (tiles fastest) leaves the last heads' heavy tiles to start
// last and run alone. The chunk keeps the blocks that run at once on few heads, whose inputs they share in L2:
// one chunk of all pairs spreads them over as many heads as there are blocks (causal_chunk sizes it for the
// Hopper kernels). Without a mask every tile has the same work, and the grid's order, in which consecutive
// blocks share a head's inputs in L2, is kept.
struct GridPlace {
  int64_t tile, head, batch;
};

JA_DEVICE GridPlace grid_place(bool longest_first, bool heavy_last, int64_t chunk = 0) {
  if (!longest_first) return {int64_t(blockIdx.x), int64_t(blockIdx.y), int64_t(blockIdx.z)};
  const int64_t tiles = gridDim.x, heads = gridDim.y, pairs = heads * gridDim.z;  // (head, batch) pairs
  const int64_t lin = blockIdx.x + tiles * (blockIdx.y + heads * blockIdx.z);
  const int64_t per = chunk > 0 && chunk < pairs ? chunk : pairs;  // pairs per chunk
  const int64_t c = lin / (per * tiles), r = lin % (per * tiles);
  const int64_t n = pairs - c * per < per ? pairs - c * per : per;  // pairs in this chunk (the last may have fewer)
  const int64_t rank = r / n, pair = c * per + r % n;              // rank 0: each head's heaviest tile
  return {heavy_last ? tiles - 1 - rank : rank, pair % heads, pair / heads};
}

// What a forward block works on (both prefill forward kernels): rows [q0, q0 + rows) of query head h, which
// reads kv head hk, in batch b; the sizes, the row strides of q, k, v and o (runtime head dims), and the
// softmax scale in the log2 domain.
struct FwdBlock {
  int64_t q0, h, b, sq, sk, hq, hkv, hk, q_stride, k_stride, v_stride, o_stride;
  int rows;
  float s2;
};

JA_DEVICE FwdBlock fwd_block(const JaMhaFwdArgs& a, GridPlace at, int br) {
  const JaMhaProblem& p = a.p;
  const int64_t q0 = at.tile * br, sq = p.seq_q, hq = p.heads_q, hkv = p.heads_kv, h = at.head;
  return {q0,
          h,
          at.batch,
          sq,
          p.seq_k,
          hq,
          hkv,
          h / (hq / hkv),
          hq * p.head_dim,
          hkv * p.head_dim,
          hkv * p.head_dim_v,
          hq * p.head_dim_v,
          int(sq - q0 < br ? sq - q0 : br),
          p.scale * ja_log2e};
}

// Whether instances for T run on the matrix units (ja/mma.h) or the SIMT kernels.
template <typename T>
constexpr bool use_mma() {
#if JA_HAS_WARP_MMA
  return mma::is_mma_type<T>::value;
#else
  return false;
#endif
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

inline const char* launch_status(const char* what) {
  const ja_error_t err = ja_get_last_error();
  if (err != ja_success) return ja_error("%s: kernel launch failed: %s", what, ja_get_error_string(err));
  return nullptr;
}

// Lets `kernel` take `smem` bytes of dynamic shared memory: above the 48 KiB default that needs an
// opt-in, which is per device and so made before every launch (and occupancy query). nullptr, or the error.
template <typename Kernel>
const char* allow_smem(Kernel kernel, int smem, const char* what) {
  if (smem <= kSmemBudget) return nullptr;
  const ja_error_t opt_in = ja_func_set_max_dynamic_smem(kernel, smem);
  if (opt_in == ja_success) return nullptr;
  return ja_error("%s: could not enable %d bytes of shared memory: %s", what, smem, ja_get_error_string(opt_in));
}

// Launches `kernel` with `smem` bytes of dynamic shared memory (allow_smem).
template <typename Args>
const char* launch_with_smem(void (*kernel)(Args), dim3 grid, int threads, int smem, ja_stream_t stream, const Args& a,
                             const char* what) {
  if (const char* e = allow_smem(kernel, smem, what)) return e;
  kernel<<<grid, threads, smem, stream>>>(a);
  return launch_status(what);
}

// Grid y/z are limited to 65535 on both platforms.
inline const char* check_grid(const char* op, int64_t x, int64_t y, int64_t z) {
  if (x > 0x7fffffffLL || y > 65535 || z > 65535)
    return ja_error(
        "%s: grid (%lld, %lld, %lld) exceeds the GPU limits (2^31-1, 65535, 65535); "
        "split the batch or heads",
        op, (long long)x, (long long)y, (long long)z);
  return nullptr;
}

}  // namespace mha_gpu
}  // namespace ja
