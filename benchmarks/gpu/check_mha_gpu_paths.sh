#!/usr/bin/env bash
# Builds and runs benchmarks/gpu/check_mha_gpu_paths.cu: the portable GPU attention kernels (SIMT, mma.sync,
# split-KV decode) with every feature against a float64 host reference. The instances come from the JIT
# build's own templates (csrc/kernels/mha/{fwd,bwd}_gpu.inst.in), compiled in parallel.
#
#   bash benchmarks/gpu/check_mha_gpu_paths.sh [arch] [filter]    arch: 90 (default), 80, ...; filter: a case
#                                                                 name substring
# Outputs go to build/check_mha_gpu_paths/. Needs nvcc and a CUDA GPU of compute capability >= 8.0.
set -euo pipefail
cd "$(dirname "$0")/../.."
arch="${1:-90}"
filter="${2:-}"
out=build/check_mha_gpu_paths
mkdir -p "$out"
flags=(-std=c++17 -O3 --expt-relaxed-constexpr "-gencode=arch=compute_${arch},code=sm_${arch}"
       -Icsrc/include -Icsrc/kernels -Ibenchmarks/gpu -DJA_HAS_GPU=1 -DJA_BACKEND_CUDA=1)
# The instance list: INSTANCES(X) in the .cu (one X(dtype, head_dim, causal) per instance).
instances=$(sed -n '/#define INSTANCES(X)/,/^$/p' benchmarks/gpu/check_mha_gpu_paths.cu |
            grep -o 'X([a-z0-9]*, [0-9]*, [01])' | tr -d 'X( )' | sort -u)
jobs=()
for inst in $instances; do
  IFS=, read -r dt d c <<<"$inst"
  for m in fwd bwd; do
    src="$out/${m}_${dt}_d${d}_c${c}.cu"
    sed -e "s|{{template}}|csrc/kernels/mha/${m}_gpu.inst.in|; s|{{symbol}}|ja_mha_${m}_gpu__${dt}_d${d}_c${c}|" \
        -e "s|{{dtype}}|${dt}|g; s|{{head_dim}}|${d}|g; s|{{causal}}|${c}|g" "csrc/kernels/mha/${m}_gpu.inst.in" \
        > "$src.tmp"
    cmp -s "$src.tmp" "$src" 2>/dev/null && rm "$src.tmp" || mv "$src.tmp" "$src"
    jobs+=("$src")
  done
done
printf '%s\n' "${jobs[@]}" benchmarks/gpu/check_mha_gpu_paths.cu |
  xargs -P "$(nproc)" -I{} sh -c 'o="'"$out"'/$(basename {} .cu).o"; nvcc '"${flags[*]}"' -c {} -o "$o"'
nvcc "${flags[@]}" "$out"/*.o -o "$out/check_mha_gpu_paths"
"$out/check_mha_gpu_paths" "$filter"
