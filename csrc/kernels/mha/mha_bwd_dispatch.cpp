// Entry points of libmha_bwd.so: pick the generated instance for (dtype, head_dim, causal).
#define JA_MHA_NAME "mha_bwd"
#define JA_MHA_ARGS JaMhaBwdArgs
#define JA_MHA_CPU_TABLE "mha_bwd_cpu_instances.inc"
#define JA_MHA_CPU_ENTRY ja_mha_bwd_cpu
#define JA_MHA_GPU_TABLE "mha_bwd_gpu_instances.inc"
#define JA_MHA_GPU_ENTRY ja_mha_bwd_gpu
#include "mha/mha_dispatch_entries.inc"
