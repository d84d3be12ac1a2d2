#!/usr/bin/env bash
# Two-GPU host, tests only: build for CUDA; the pr tier's GPU tests (tests/ops) with 2 pinned
# workers vs 1; the full GPU op set (slow sweeps included) on 2 workers; the multigpu tier
# across both GPUs. Collection is limited to tests/ops and tests/multigpu, which need only
# JAX and pytest (a bare GPU image lacks the tooling tests' packages).
#   bash ci/gpu/h200x2_tests.sh OUT
set -uo pipefail
out="${1:-build/gpu-check}"; mkdir -p "$out"
# GPU_ARCHS unset: the archs of the GPUs present (nvidia-smi), so only what this host runs is compiled.
export JA_BACKEND=cuda PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
py="${PYTHON:-python3}"
"$py" -m jatools.native.build --jit build -j "$(nproc)" >"$out/build.log" 2>&1 \
  || { tail -n 40 "$out/build.log"; exit 1; }
# shellcheck source=ci/gpu/steps.sh
. "$(dirname "${BASH_SOURCE[0]}")/steps.sh"
step slot-speedup 150 "$py" -m jatools.testing.speedup --workers 2 --out "$out/slot_speedup.json" tests/ops
step gpu-full 150 env JA_TESTS_PER_GPU=1 "$py" -m pytest tests/ops -m gpu -n 2 -q -p no:cacheprovider
step multigpu 90 env JA_TEST_TIER=multigpu PYTHON="$py" bash ci/test.sh tests/multigpu
finish
