// Included by the generated sm_90a instances (sm90/fwd.inst.in) after they define
// JA_SM90_DT_<dtype> and JA_SM90_HD_<head_dim>: the Hopper kernels (and the CUTLASS
// headers) are compiled only for the dtypes and the instances that hold a kernel
// (sm90/dims.h: 64; 96, which also holds the 80 kernel; 128; and 256, which also holds
// the 160 and 192 kernels); the other instances say "not handled" and cost a trivial compile.
#pragma once
#include "ja/kernels/mha.h"

#if (defined(JA_SM90_DT_bf16) || defined(JA_SM90_DT_f16)) && \
    (defined(JA_SM90_HD_64) || defined(JA_SM90_HD_96) || defined(JA_SM90_HD_128) || defined(JA_SM90_HD_256))
#define JA_SM90_BUILT 1
#include "mha/sm90/fwd_launch.cuh"
#else
#define JA_SM90_BUILT 0
#endif
