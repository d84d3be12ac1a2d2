// Entry points of libmha_bwd.so: pick the generated instance for (dtype, head_dim, causal).
//
// On the GPU the sm_90a instances (sm90/bwd_kernel.cuh: wgmma + TMA; the gpu_sm90a kind, built
// when GPU_ARCHS has sm_90) are asked first; each says whether it applies (an sm_90 device,
// a dtype and head dim it covers) and otherwise the regular instances (mma.sync, SIMT) run.
// A call that names another family (implementation=, JaMhaImpl) skips them, one that names 'sm90' runs there or
// is refused; ja_mha_bwd_sm90_calls() counts the calls they handled. Among the regular instances a call takes
// the mma.sync kernels (bfloat16/float16 on CUDA) where they handle its features, else the SIMT ones, or the one it
// names (bwd_gpu.cuh); ja_mha_bwd_gpu_path_calls(path) counts the calls each ran (0 SIMT, 1 mma.sync).
#define JA_MHA_NAME "mha_bwd"
#define JA_MHA_ARGS JaMhaBwdArgs
#define JA_MHA_CPU_TABLE "mha_bwd_cpu_instances.inc"
#define JA_MHA_CPU_ENTRY ja_mha_bwd_cpu
#define JA_MHA_GPU_TABLE "mha_bwd_gpu_instances.inc"
#define JA_MHA_GPU_ENTRY ja_mha_bwd_gpu
#define JA_MHA_SM90_TABLE "mha_bwd_gpu_sm90a_instances.inc"
#define JA_MHA_SM90_CALLS ja_mha_bwd_sm90_calls
#include "mha/dispatch_entries.inc"

#if defined(JA_HAS_GPU)
#include "mha/common/gpu_calls.h"

JA_API int64_t ja_mha_bwd_gpu_path_calls(int path) { return ja::mha_gpu_path_count(path); }
#endif
