// The rules of ja/kernels/mha.h's structs, checked once for every caller (host code only: the entry points of
// libmha_fwd.so and libmha_bwd.so, and the FFI handlers).
#pragma once
#include <cmath>
#include <cstdint>

#include "ja/api.h"
#include "ja/kernels/mha.h"
#include "ja/kernels/mha_features.h"

namespace ja {

// The name of a kernel family (JaMhaImpl) as the Python API spells it; "auto" for JA_MHA_IMPL_AUTO.
inline const char* mha_impl_name(int32_t impl) {
  static const char* const kNames[JA_MHA_IMPL_COUNT] = {"auto", "cpu", "simt", "mma", "decode", "sm90"};
  return impl >= 0 && impl < JA_MHA_IMPL_COUNT ? kNames[impl] : "unknown";
}

// Whether `impl` may run on this platform (gpu: the GPU handlers; else the CPU's): nullptr, or the error.
inline const char* mha_impl_error(const char* op, int32_t impl, bool gpu) {
  if (impl < 0 || impl >= JA_MHA_IMPL_COUNT)
    return ja_error("%s: implementation %d is not a kernel family (0 auto, 1 cpu, 2 simt, 3 mma, 4 decode, 5 sm90)", op,
                    int(impl));
  if (gpu && impl == JA_MHA_IMPL_CPU)
    return ja_error(
        "%s: implementation 'cpu' runs on the CPU platform; on the GPU ask for 'sm90', 'mma', 'decode' "
        "or 'simt', or None (automatic)",
        op);
  if (!gpu && impl != JA_MHA_IMPL_AUTO && impl != JA_MHA_IMPL_CPU)
    return ja_error(
        "%s: implementation '%s' is a GPU kernel family; on the CPU only 'cpu' runs (or None: "
        "automatic)",
        op, mha_impl_name(impl));
  return nullptr;
}

// The first way a call breaks the C ABI's rules (ja/kernels/mha.h), as an error naming the field, the value and
// what is allowed (ja_error's text); nullptr when it keeps them. The entry points check every call with it, and the
// FFI handlers return it as InvalidArgument after their own checks of the operands' shapes and dtypes.
inline const char* mha_problem_error(const char* op, const JaMhaProblem& p) {
  if (p.batch < 0 || p.seq_q < 0 || p.seq_k < 0 || p.heads_q < 0)
    return ja_error("%s: batch %lld, seq_q %lld, seq_k %lld and heads_q %lld must be >= 0", op, (long long)p.batch,
                    (long long)p.seq_q, (long long)p.seq_k, (long long)p.heads_q);
  if (p.heads_kv <= 0 || p.heads_q % p.heads_kv)
    return ja_error("%s: heads_q (%lld) must be a multiple of heads_kv (%lld)", op, (long long)p.heads_q,
                    (long long)p.heads_kv);
  if (p.head_dim < 1 || p.head_dim > JA_MHA_MAX_HEAD_DIM || p.head_dim_v < 1 || p.head_dim_v > JA_MHA_MAX_HEAD_DIM)
    return ja_error("%s: head_dim %lld (q, k) and head_dim_v %lld (v) must each be in 1..%d", op, (long long)p.head_dim,
                    (long long)p.head_dim_v, JA_MHA_MAX_HEAD_DIM);
  if (p.mask != kMaskNone && p.mask != kMaskCausal && p.mask != kMaskRows)
    return ja_error("%s: mask %d is not 0 (none), 1 (causal) or 2 (rows)", op, int(p.mask));
  if (p.mask == kMaskRows && !p.rows) return ja_error("%s: the ROWS mask needs its rows array (rows is null)", op);
  if (p.mask == kMaskRows && p.rows_batch_stride != 0 && p.rows_batch_stride != 3 * p.seq_q)
    return ja_error("%s: rows_batch_stride %lld must be 0 or 3 * seq_q = %lld", op, (long long)p.rows_batch_stride,
                    (long long)(3 * p.seq_q));
  if (!std::isfinite(p.scale)) return ja_error("%s: scale %g must be finite", op, double(p.scale));
  if (!(p.softcap >= 0.0f) || !std::isfinite(p.softcap))
    return ja_error("%s: softcap %g must be 0 (off) or a finite value > 0", op, double(p.softcap));
  if (!(p.dropout_p >= 0.0f && p.dropout_p < 1.0f))
    return ja_error("%s: dropout_p %g must be in [0, 1)", op, double(p.dropout_p));
  if (p.dropout_p > 0.0f && !p.seed) return ja_error("%s: dropout_p > 0 needs the seed (seed is null)", op);
  return nullptr;
}

inline const char* mha_problem_error(const char* op, const JaMhaFwdArgs& a) { return mha_problem_error(op, a.p); }

inline const char* mha_problem_error(const char* op, const JaMhaBwdArgs& a) {
  if (const char* e = mha_problem_error(op, a.p)) return e;
  if (a.p.mask == kMaskRows && !a.cols) return ja_error("%s: the ROWS mask needs its cols array (cols is null)", op);
  if (a.p.mask == kMaskRows && a.cols_batch_stride != 0 && a.cols_batch_stride != 2 * a.p.seq_k)
    return ja_error("%s: cols_batch_stride %lld must be 0 or 2 * seq_k = %lld", op, (long long)a.cols_batch_stride,
                    (long long)(2 * a.p.seq_k));
  if (a.dbias && !a.p.bias) return ja_error("%s: dbias is given without a bias", op);
  return nullptr;
}

}  // namespace ja
