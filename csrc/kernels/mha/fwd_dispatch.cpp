// Entry points of libmha_fwd.so: pick the generated instance for (dtype, head_dim, causal).
//
// On the GPU the sm_90a instances (sm90/fwd_kernel.cuh: wgmma + TMA; the gpu_sm90a kind, built
// when GPU_ARCHS has sm_90) are asked first; each says whether it applies (an sm_90 device,
// a dtype and head dim it covers, not a decode shape) and otherwise the regular instances
// (mma.sync, SIMT, split-KV decode) run. A call that names another family (implementation=, JaMhaImpl)
// skips them, one that names 'sm90' runs there or is refused; ja_mha_fwd_sm90_calls() counts the calls they handled.
// Decode shapes take the split-KV kernel, on sm_90 with TMA loads; ja_mha_fwd_decode_tma_calls() counts those
// (JA_MHA_FWD_DECODE_TMA=0, read on every call, sends them to its cp.async loads), and
// ja_mha_fwd_decode_cluster_calls() those whose splits merged in a thread-block cluster (JA_MHA_FWD_DECODE_CLUSTER=0:
// the merge kernel). Among the regular instances a call takes the split-KV decode kernel (decode shapes), else the
// mma.sync kernel (bfloat16/float16 on CUDA), else the SIMT kernel, the first that handles all of its features, or the
// one the call names (fwd_gpu.cuh); ja_mha_fwd_gpu_path_calls(path) counts the calls each ran.
#define JA_MHA_NAME "mha_fwd"
#define JA_MHA_ARGS JaMhaFwdArgs
#define JA_MHA_CPU_TABLE "mha_fwd_cpu_instances.inc"
#define JA_MHA_CPU_ENTRY ja_mha_fwd_cpu
#define JA_MHA_GPU_TABLE "mha_fwd_gpu_instances.inc"
#define JA_MHA_GPU_ENTRY ja_mha_fwd_gpu
#define JA_MHA_SM90_TABLE "mha_fwd_gpu_sm90a_instances.inc"
#define JA_MHA_SM90_CALLS ja_mha_fwd_sm90_calls
#include "mha/dispatch_entries.inc"

#if defined(JA_HAS_GPU)
#include "mha/decode/calls.h"
#include "mha/common/gpu_calls.h"

// Calls the portable GPU kernels ran, by kernel (ja::MhaGpuPath: 0 SIMT, 1 mma.sync, 2 split-KV decode; -1 for
// another number): the tests check that a call they send to one kernel ran there.
JA_API int64_t ja_mha_fwd_gpu_path_calls(int path) { return ja::mha_gpu_path_count(path); }

JA_API int64_t ja_mha_fwd_decode_tma_calls(void) { return ja::mha_decode_tma_calls().load(std::memory_order_relaxed); }
JA_API int64_t ja_mha_fwd_decode_cluster_calls(void) {
  return ja::mha_decode_cluster_calls().load(std::memory_order_relaxed);
}
#endif
