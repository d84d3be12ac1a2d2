// Entry points of libmha_fwd.so: pick the generated instance for (dtype, head_dim, causal).
#define JA_MHA_NAME "mha_fwd"
#define JA_MHA_ARGS JaMhaFwdArgs
#define JA_MHA_CPU_TABLE "mha_fwd_cpu_instances.inc"
#define JA_MHA_CPU_ENTRY ja_mha_fwd_cpu
#define JA_MHA_GPU_TABLE "mha_fwd_gpu_instances.inc"
#define JA_MHA_GPU_ENTRY ja_mha_fwd_gpu
#include "mha/mha_dispatch_entries.inc"
