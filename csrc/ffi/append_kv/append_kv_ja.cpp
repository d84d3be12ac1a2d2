// XLA FFI handler of append_kv on the CPU: new K/V rows written into the paged pools, in place. The pools are
// operands 5 and 6 and results 0 and 1, and must be aliased (input_output_aliases={5: 0, 6: 1}): a call whose
// results are other buffers than its pools is refused, since it would write a copy and leave the pools as they
// were.
#include "../paged_args.h"

namespace ffi = xla::ffi;

JA_DEFINE_FFI_API_VERSION()

namespace {

ffi::Error append_kv_args(const ffi::AnyBuffer& k_new, const ffi::AnyBuffer& v_new, const ffi::AnyBuffer& slots,
                          const ffi::AnyBuffer& k_scale, const ffi::AnyBuffer& v_scale, const ffi::AnyBuffer& k_pool,
                          const ffi::AnyBuffer& v_pool, const ffi::AnyBuffer& k_out, const ffi::AnyBuffer& v_out,
                          JaAppendKvArgs* a) {
  const char* op = "append_kv";
  JaPagedKv kv{};
  if (auto e = ja::paged_pools(op, k_pool, v_pool, &kv); e.failure()) return e;
  if (k_out.untyped_data() != k_pool.untyped_data() || v_out.untyped_data() != v_pool.untyped_data())
    return ja::paged_invalid(op,
                             "the results are not the pools' buffers: ja_append_kv writes k_pool and v_pool in "
                             "place and must be called with input_output_aliases={5: 0, 6: 1} (k_pool to result 0, "
                             "v_pool to result 1; jax_aiter.ops.append_kv does); unaliased, it would write copies and "
                             "leave the pools unchanged");
  ja::DType dt;
  if (!ja::to_paged_dtype(k_new.element_type(), &dt) || v_new.element_type() != k_new.element_type())
    return ja::paged_invalid(op,
                             "k_new and v_new must share one dtype: float32, bfloat16, float16 or "
                             "float8_e4m3fn");
  const int64_t t = k_new.dimensions().size() == 3 ? k_new.dimensions()[0] : -1;
  if (!ja::has_dims(k_new, {t, kv.heads_kv, kv.head_dim}) || !ja::has_dims(v_new, {t, kv.heads_kv, kv.head_dim_v}))
    return ja::paged_invalid(
        op, "k_new " + ja::shape_text(k_new) + " and v_new " + ja::shape_text(v_new) +
                " must be [num_tokens, kv_heads, head_dim] with the pools' kv heads and head dims (k_pool " +
                ja::shape_text(k_pool) + ", v_pool " + ja::shape_text(v_pool) + ")");
  const auto st = slots.element_type();
  if ((st != ffi::DataType::S32 && st != ffi::DataType::S64) || !ja::has_dims(slots, {t}))
    return ja::paged_invalid(
        op, "slot_mapping must be int32 or int64 of shape " + ja::dims_text({t}) + ", got " + ja::shape_text(slots));
  const ffi::AnyBuffer* scales[] = {&k_scale, &v_scale};
  const char* names[] = {"k_scale", "v_scale"};
  for (int i = 0; i < 2; ++i)
    if (scales[i]->element_type() != ffi::DataType::F32 ||
        !(ja::has_dims(*scales[i], {1}) || ja::has_dims(*scales[i], {0})))
      return ja::paged_invalid(op, std::string(names[i]) + " must be float32 of shape (1,) (or (0,): absent), got " +
                                       ja::shape_text(*scales[i]));
  auto scale = [](const ffi::AnyBuffer& b) {
    return ja::has_dims(b, {1}) ? static_cast<const float*>(b.untyped_data()) : nullptr;
  };
  *a = JaAppendKvArgs{int32_t(dt),
                      st == ffi::DataType::S32 ? 32 : 64,
                      t,
                      kv.heads_kv,
                      kv.head_dim,
                      kv.head_dim_v,
                      k_new.untyped_data(),
                      v_new.untyped_data(),
                      slots.untyped_data(),
                      scale(k_scale),
                      scale(v_scale),
                      kv.dtype,
                      kv.num_pages,
                      kv.page_size,
                      k_out.untyped_data(),
                      v_out.untyped_data()};
  if (const char* e = ja::append_kv_error(*a)) return ja::invalid(e);
  return ffi::Error::Success();
}

ffi::Error append_kv_cpu(ffi::AnyBuffer k_new, ffi::AnyBuffer v_new, ffi::AnyBuffer slots, ffi::AnyBuffer k_scale,
                         ffi::AnyBuffer v_scale, ffi::AnyBuffer k_pool, ffi::AnyBuffer v_pool,
                         ffi::Result<ffi::AnyBuffer> k_out, ffi::Result<ffi::AnyBuffer> v_out) {
  JaAppendKvArgs a{};
  if (auto e = append_kv_args(k_new, v_new, slots, k_scale, v_scale, k_pool, v_pool, *k_out, *v_out, &a); e.failure())
    return e;
  return ja::from_kernel(ja_append_kv_cpu(&a));
}

}  // namespace

JA_FFI_HANDLER(JaAppendKvCpu);
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaAppendKvCpu, append_kv_cpu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>() /* k_new */
                                  .Arg<ffi::AnyBuffer>() /* v_new */
                                  .Arg<ffi::AnyBuffer>() /* slot_mapping */
                                  .Arg<ffi::AnyBuffer>() /* k_scale */
                                  .Arg<ffi::AnyBuffer>() /* v_scale */
                                  .Arg<ffi::AnyBuffer>() /* k_pool */
                                  .Arg<ffi::AnyBuffer>() /* v_pool */
                                  .Ret<ffi::AnyBuffer>() /* k_pool, aliased */.Ret<ffi::AnyBuffer>() /* v_pool */);
