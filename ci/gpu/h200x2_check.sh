#!/usr/bin/env bash
# One call on a host with two CUDA GPUs: build for CUDA, then (each step time-boxed)
# the pr tier's GPU tests with 2 pinned workers vs 1 (slot speed-up), the multigpu
# tier across both GPUs, compute-sanitizer on a reduced set, and the GPU benchmark.
#   bash ci/gpu/h200x2_check.sh OUT
set -uo pipefail
out="${1:-build/gpu-check}"; mkdir -p "$out"
# GPU_ARCHS unset: the archs of the GPUs present (nvidia-smi), so only what this host runs is compiled.
export JA_BACKEND=cuda PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
py="${PYTHON:-python3}"
nvidia-smi -L
t0=$(date +%s)
"$py" -m jatools.native.build --jit build -j "$(nproc)" >"$out/build.log" 2>&1 \
  || { tail -n 40 "$out/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
# shellcheck source=ci/gpu/steps.sh
. "$(dirname "${BASH_SOURCE[0]}")/steps.sh"
step slot-speedup 200 "$py" -m jatools.testing.speedup --workers 2 --out "$out/slot_speedup.json"
step multigpu 90 env JA_TEST_TIER=multigpu PYTHON="$py" bash ci/test.sh
step sanitize 110 bash ci/gpu/sanitize.sh "$out/san"
step bench 200 "$py" -m benchmarks.gpu.bench_gpu --reps 15 --out "$out/bench.json"
finish
