// XLA FFI handler of attention over a paged KV cache on the CPU (ja/kernels/paged.h): decode, prefill, and FP8
// attention (whose K and V the Python op hands over as a page table).
#include "../paged_args.h"

namespace ffi = xla::ffi;

JA_DEFINE_FFI_API_VERSION()

namespace {

struct Operands {
  const ffi::AnyBuffer &q, &k_pool, &v_pool, &cu_seqlens_q, &kv_indptr, &kv_page_indices, &kv_last_page_lens,
      &q_descale, &k_descale, &v_descale;
};

struct Attrs {
  float scale, softcap;
  bool causal;
  int64_t window_left, window_right, max_seqlen_q, max_seqlen_k;
};

ffi::Error paged_attn_args(const Operands& in, ffi::AnyBuffer& out, ffi::AnyBuffer& lse, const Attrs& at,
                           JaPagedAttnArgs* a) {
  const char* op = "paged attention";
  *a = JaPagedAttnArgs{};
  if (auto e = ja::paged_pools(op, in.k_pool, in.v_pool, &a->kv); e.failure()) return e;
  ja::DType qt, ot;
  if (!ja::to_paged_dtype(in.q.element_type(), &qt))
    return ja::paged_invalid(op, "query must be float32, bfloat16, float16 or float8_e4m3fn");
  if (int32_t(qt) != a->kv.dtype && a->kv.dtype != int32_t(ja::DType::kF8E4M3))
    return ja::paged_invalid(op, "the pools hold query's dtype or float8_e4m3fn");
  if (!ja::has_dims(in.q, {in.q.dimensions().size() == 3 ? in.q.dimensions()[0] : -1,
                           in.q.dimensions().size() == 3 ? in.q.dimensions()[1] : -1, a->kv.head_dim}))
    return ja::paged_invalid(op, "query " + ja::shape_text(in.q) +
                                     " must be [tokens, heads, head_dim] with the "
                                     "pools' head_dim (k_pool " +
                                     ja::shape_text(in.k_pool) + ")");
  a->total_q = in.q.dimensions()[0], a->heads_q = in.q.dimensions()[1];
  a->q_dtype = int32_t(qt), a->q = in.q.untyped_data();
  if (auto e = ja::paged_index(op, "kv_last_page_lens", in.kv_last_page_lens, -1); e.failure()) return e;
  const int64_t n = in.kv_last_page_lens.dimensions()[0];
  if (auto e = ja::paged_index(op, "kv_indptr", in.kv_indptr, n + 1); e.failure()) return e;
  if (auto e = ja::paged_index(op, "cu_seqlens_q", in.cu_seqlens_q, n + 1); e.failure()) return e;
  if (auto e = ja::paged_index(op, "kv_page_indices", in.kv_page_indices, -1); e.failure()) return e;
  a->kv.num_seqs = n, a->kv.total_pages = in.kv_page_indices.dimensions()[0];
  a->kv.kv_indptr = static_cast<const int32_t*>(in.kv_indptr.untyped_data());
  a->kv.kv_page_indices = static_cast<const int32_t*>(in.kv_page_indices.untyped_data());
  a->kv.kv_last_page_lens = static_cast<const int32_t*>(in.kv_last_page_lens.untyped_data());
  a->cu_seqlens_q = static_cast<const int32_t*>(in.cu_seqlens_q.untyped_data());
  if (auto e = ja::paged_descale(op, "q_descale", in.q_descale, n, a->kv.heads_kv, &a->q_descale); e.failure())
    return e;
  if (auto e = ja::paged_descale(op, "k_descale", in.k_descale, n, a->kv.heads_kv, &a->k_descale); e.failure())
    return e;
  if (auto e = ja::paged_descale(op, "v_descale", in.v_descale, n, a->kv.heads_kv, &a->v_descale); e.failure())
    return e;
  if (!ja::to_dtype(out.element_type(), &ot) || (qt != ja::DType::kF8E4M3 && ot != qt))
    return ja::paged_invalid(op, "out must have query's dtype (float32, bfloat16 or float16 for a float8 query)");
  if (!ja::has_dims(out, {a->total_q, a->heads_q, a->kv.head_dim_v}))
    return ja::paged_invalid(op, "out has shape " + ja::shape_text(out) + ", expected " +
                                     ja::dims_text({a->total_q, a->heads_q, a->kv.head_dim_v}));
  a->out_dtype = int32_t(ot), a->out = out.untyped_data();
  if (lse.element_type() != ffi::DataType::F32 ||
      !(ja::has_dims(lse, {0}) || ja::has_dims(lse, {a->heads_q, a->total_q})))
    return ja::paged_invalid(op, "lse must be float32 of shape " + ja::dims_text({a->heads_q, a->total_q}) +
                                     " or (0,) (not wanted), got " + ja::shape_text(lse));
  a->lse = ja::has_dims(lse, {0}) ? nullptr : static_cast<float*>(lse.untyped_data());
  a->scale = at.scale, a->softcap = at.softcap, a->causal = at.causal ? 1 : 0;
  a->window_left = at.window_left, a->window_right = at.window_right;
  a->max_seqlen_q = at.max_seqlen_q, a->max_seqlen_k = at.max_seqlen_k;
  if (const char* e = ja::paged_attn_error(*a)) return ja::invalid(e);
  return ffi::Error::Success();
}

ffi::Error paged_attn_cpu(ffi::AnyBuffer q, ffi::AnyBuffer k_pool, ffi::AnyBuffer v_pool, ffi::AnyBuffer cu_seqlens_q,
                          ffi::AnyBuffer kv_indptr, ffi::AnyBuffer kv_page_indices, ffi::AnyBuffer kv_last_page_lens,
                          ffi::AnyBuffer q_descale, ffi::AnyBuffer k_descale, ffi::AnyBuffer v_descale,
                          ffi::RemainingArgs poison, ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> lse,
                          float scale, float softcap, bool causal, int64_t window_left, int64_t window_right,
                          int64_t max_seqlen_q, int64_t max_seqlen_k) {
  if (auto e = ja::check_poison(poison, 2); e.failure()) return e;
  JaPagedAttnArgs a{};
  const Operands in{q,         k_pool,    v_pool,   cu_seqlens_q, kv_indptr, kv_page_indices, kv_last_page_lens,
                    q_descale, k_descale, v_descale};
  const Attrs at{scale, softcap, causal, window_left, window_right, max_seqlen_q, max_seqlen_k};
  if (auto e = paged_attn_args(in, *out, *lse, at, &a); e.failure()) return e;
  return ja::from_kernel(ja_paged_attn_cpu(&a));
}

}  // namespace

JA_FFI_HANDLER(JaPagedAttnCpu);
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaPagedAttnCpu, paged_attn_cpu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>() /* query */
                                  .Arg<ffi::AnyBuffer>() /* k_pool */
                                  .Arg<ffi::AnyBuffer>() /* v_pool */
                                  .Arg<ffi::AnyBuffer>() /* cu_seqlens_q */
                                  .Arg<ffi::AnyBuffer>() /* kv_indptr */
                                  .Arg<ffi::AnyBuffer>() /* kv_page_indices */
                                  .Arg<ffi::AnyBuffer>() /* kv_last_page_lens */
                                  .Arg<ffi::AnyBuffer>() /* q_descale */
                                  .Arg<ffi::AnyBuffer>() /* k_descale */
                                  .Arg<ffi::AnyBuffer>() /* v_descale */
                                  .RemainingArgs()
                                  .Ret<ffi::AnyBuffer>() /* out */
                                  .Ret<ffi::AnyBuffer>() /* lse */
                                  .Attr<float>("scale")
                                  .Attr<float>("softcap")
                                  .Attr<bool>("causal")
                                  .Attr<int64_t>("window_left")
                                  .Attr<int64_t>("window_right")
                                  .Attr<int64_t>("max_seqlen_q")
                                  .Attr<int64_t>("max_seqlen_k"));
