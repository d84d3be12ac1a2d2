// Entry points of libpaged_attn.so: the paged attention kernels (the generated CPU instance whose padded head dim
// holds the call's) and append_kv, each after the call's checks (ja/kernels/paged_check.h).
#include <algorithm>
#include <string>

#include "ja/kernels/paged.h"
#include "ja/kernels/paged_check.h"
#include "mha/cpu/append_kv.h"

#define JA_INSTANCE(symbol, hd) extern "C" const char* symbol(const JaPagedAttnArgs*);
#include "paged_attn_cpu_instances.inc"
#undef JA_INSTANCE

namespace {
struct PagedInstance {
  int head_dim;
  const char* (*fn)(const JaPagedAttnArgs*);
};
const PagedInstance kCpuInstances[] = {
#define JA_INSTANCE(symbol, hd) {hd, symbol},
#include "paged_attn_cpu_instances.inc"
#undef JA_INSTANCE
};
}  // namespace

JA_API const char* ja_paged_attn_cpu(const JaPagedAttnArgs* a) {
  if (const char* e = ja::paged_attn_error(*a)) return e;
  const int64_t need = std::max(a->kv.head_dim, a->kv.head_dim_v);
  const PagedInstance* best = nullptr;
  std::string dims;
  for (const auto& e : kCpuInstances) {
    dims += (dims.empty() ? "" : ", ") + std::to_string(e.head_dim);
    if (e.head_dim >= need && (!best || e.head_dim < best->head_dim)) best = &e;
  }
  if (!best)
    return ja_error(
        "paged attention: no CPU instance holds head_dim %lld and head_dim_v %lld in this build; "
        "compiled (padded) head dims: %s",
        (long long)a->kv.head_dim, (long long)a->kv.head_dim_v, dims.c_str());
  return best->fn(a);
}

JA_API const char* ja_append_kv_cpu(const JaAppendKvArgs* a) {
  if (const char* e = ja::append_kv_error(*a)) return e;
  return ja::append_kv_cpu(*a);
}
