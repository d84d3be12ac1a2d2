// Entry points of libmha_bwd.so: pick the generated instance for (dtype, head_dim, causal).
//
// On the GPU the sm_90a instances (mha_bwd_sm90.cuh: wgmma + TMA; the gpu_sm90a kind, built
// when GPU_ARCHS has sm_90) are asked first; each says whether it applies (an sm_90 device,
// a dtype and head dim it covers) and otherwise the regular instances (mma.sync, SIMT) run.
// JA_MHA_BWD_SM90=0 in the environment skips them (read on every call, so a test can compare
// both paths in one process); ja_mha_bwd_sm90_calls() counts the calls they handled.
#include <atomic>
#include <cstdlib>
#include <cstring>

#define JA_MHA_NAME "mha_bwd"
#define JA_MHA_ARGS JaMhaBwdArgs
#define JA_MHA_CPU_TABLE "mha_bwd_cpu_instances.inc"
#define JA_MHA_CPU_ENTRY ja_mha_bwd_cpu
#define JA_MHA_GPU_TABLE "mha_bwd_gpu_instances.inc"
#define JA_MHA_GPU_ENTRY mha_bwd_gpu_regular
#define JA_MHA_GPU_LINKAGE static
#include "mha/mha_dispatch_entries.inc"

#if defined(JA_HAS_GPU)
#define JA_INSTANCE(symbol, dt, hd, c) extern "C" const char* symbol(const JaMhaBwdArgs*, void*, int*);
#include "mha_bwd_gpu_sm90a_instances.inc"
#undef JA_INSTANCE

static const ja::MhaInstance<const char* (*)(const JaMhaBwdArgs*, void*, int*)> kSm90Instances[] = {
#define JA_INSTANCE(symbol, dt, hd, c) {ja::dt_##dt, hd, bool(c), symbol},
#include "mha_bwd_gpu_sm90a_instances.inc"
#undef JA_INSTANCE
    {ja::DType::kF32, -1, false, nullptr},  // keeps the table non-empty where no sm_90a instance is built
};

static std::atomic<int64_t> g_sm90_calls{0};

JA_API int64_t ja_mha_bwd_sm90_calls(void) { return g_sm90_calls.load(std::memory_order_relaxed); }

JA_API const char* ja_mha_bwd_gpu(const JaMhaBwdArgs* a, void* stream) {
  const char* env = std::getenv("JA_MHA_BWD_SM90");
  if (!(env && std::strcmp(env, "0") == 0)) {
    for (const auto& e : kSm90Instances) {
      if (e.fn && int(e.dtype) == a->dtype && e.head_dim == a->head_dim && e.causal == (a->causal != 0)) {
        int handled = 0;
        const char* err = e.fn(a, stream, &handled);
        if (handled) {
          g_sm90_calls.fetch_add(1, std::memory_order_relaxed);
          return err;
        }
        break;
      }
    }
  }
  return mha_bwd_gpu_regular(a, stream);
}
#endif
