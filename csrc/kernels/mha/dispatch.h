// Instance lookup shared by fwd_dispatch.cpp and bwd_dispatch.cpp.
//
// The JIT build generates instances and an instance table per kind (<module>_<kind>_instances.inc,
// JA_INSTANCE rows); the entry points check the call (mha_problem_error, ja/kernels/mha_check.h) and look it up:
//   GPU kinds  one instance per (dtype, padded head dim, causal): JA_INSTANCE(symbol, dtype, head_dim, causal);
//              the smallest whose head dim holds both head_dim and head_dim_v runs (mha_dispatch<true>);
//   CPU        one instance per (dtype, padded head dim): JA_INSTANCE(symbol, dtype, head_dim); the smallest
//              whose head dim holds both head_dim and head_dim_v runs (mha_dispatch<false>), every other
//              feature is read at run time.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ja/api.h"
#include "ja/dtype.h"
#include "ja/kernels/mha_check.h"
#include "ja/kernels/mha_features.h"
#include "mha/sm90/dims.h"

namespace ja {

template <typename Fn>
struct MhaInstance {
  DType dtype;
  int head_dim;
  bool causal;
  Fn fn;
};

// The head dims compiled for dtype, as "64, 128".
template <typename Fn, size_t N>
std::string mha_head_dims(const MhaInstance<Fn> (&table)[N], DType dtype) {
  std::vector<int> dims;
  for (const auto& e : table)
    if (e.dtype == dtype) dims.push_back(e.head_dim);
  std::sort(dims.begin(), dims.end());
  dims.erase(std::unique(dims.begin(), dims.end()), dims.end());
  std::string out;
  for (int d : dims) out += (out.empty() ? "" : ", ") + std::to_string(d);
  return out.empty() ? "none" : out;
}

// Calls the instance of args' dtype with the smallest head dim that holds both head_dim and head_dim_v (the
// kernels zero-pad the columns past the call's on load and never store them) with (&args, extra...). ByMask: the
// GPU kinds, whose instances are per causal flag: the CAUSAL mask takes the causal ones, NONE and ROWS the others
// (a kernel that does not handle ROWS or head_dim_v != head_dim sends the call to one that does, or refuses it
// naming the feature: ja/kernels/mha_features.h). The CPU instances read the mask at run time.
template <bool ByMask, typename Fn, size_t N, typename Args, typename... Extra>
const char* mha_dispatch(const char* op, const char* backend, const MhaInstance<Fn> (&table)[N], const Args& a,
                         Extra... extra) {
  const int64_t need = std::max(a.p.head_dim, a.p.head_dim_v);
  const MhaInstance<Fn>* best = nullptr;
  for (const auto& e : table)
    if (e.fn && int(e.dtype) == a.p.dtype && e.head_dim >= need && (!ByMask || e.causal == (a.p.mask == kMaskCausal)) &&
        (!best || e.head_dim < best->head_dim))
      best = &e;
  if (best) return best->fn(&a, extra...);
  const DType dt = DType(a.p.dtype);
  const bool known = a.p.dtype >= 0 && a.p.dtype <= int(DType::kF16);
  const std::string mask = ByMask ? " (mask " + std::to_string(a.p.mask) + ")" : "";
  return ja_error(
      "%s: no %s instance for dtype %s holds head_dim %lld and head_dim_v %lld%s in this build; "
      "compiled (padded) head dims: %s",
      op, backend, known ? dtype_name(dt) : "unknown", (long long)a.p.head_dim, (long long)a.p.head_dim_v, mask.c_str(),
      mha_head_dims(table, dt).c_str());
}

// Whether sm_90a table entry e is the instance for args: its dtype and causal flag as mha_dispatch<true> takes
// them, and the instance that holds the sm_90a kernel for the call's head dims (sm90/dims.h: the kernel of
// the next head dim up, TMA filling the columns past the call's with zeros), which need not be its head_dim.
template <typename Fn, typename Args>
bool mha_sm90_matches(const MhaInstance<Fn>& e, const Args& a) {
  return e.fn && int(e.dtype) == a.p.dtype &&
         e.head_dim == mha_sm90::sm90_instance_head_dim(a.p.head_dim, a.p.head_dim_v) &&
         e.causal == (a.p.mask == kMaskCausal);
}

// The error of a call that asked for the Hopper kernels (implementation 'sm90') where they do not take it: `why`.
inline const char* mha_sm90_refused(const char* op, const char* why) {
  return ja_error(
      "%s: implementation 'sm90' does not take this call: %s. The Hopper kernels run bfloat16 and "
      "float16 on an sm_90 device (H100, H200), head dims up to 256 in multiples of 8, without bias or "
      "dropout; the forward leaves decode shapes to 'decode'. Use implementation=None to choose "
      "automatically",
      op, why);
}

// Asks the instance for args in a table of instances that may decline (the sm_90a kernels:
// fn(&args, stream, &handled); mha_sm90_matches) first, unless the call names another family (impl). True, with
// the instance's status in *err, when it handled the call (counted in calls), or when the call asked for 'sm90' and
// none took it (*err says why); false when the regular instances run it.
template <typename Fn, size_t N, typename Args>
bool mha_try_first(const char* op, const MhaInstance<Fn> (&table)[N], int32_t impl, std::atomic<int64_t>& calls,
                   const Args& a, void* stream, const char** err) {
  if (impl != JA_MHA_IMPL_AUTO && impl != JA_MHA_IMPL_SM90) return false;
  for (const auto& e : table) {
    if (!mha_sm90_matches(e, a)) continue;
    int handled = 0;
    *err = e.fn(&a, stream, &handled);
    if (handled) calls.fetch_add(1, std::memory_order_relaxed);
    if (handled || impl == JA_MHA_IMPL_AUTO) return handled != 0;
    *err = mha_sm90_refused(op, "its dtype, head dims, features, layout or device are outside the kernels'");
    return true;
  }
  if (impl == JA_MHA_IMPL_SM90) {
    *err = mha_sm90_refused(op, "no sm_90a instance of this dtype holds its head dims in this build");
    return true;
  }
  return false;
}

}  // namespace ja
