#!/usr/bin/env bash
# One call on a CUDA host: build every library for CUDA, then run the GPU test set through the
# pr tier runner. Logs and JSON go to OUT (default build/gpu-check). The sanitizers are
# ci/gpu/sanitize.sh; the kernel benchmark is benchmarks/gpu/bench_gpu.py.
#   bash ci/gpu/h200_check.sh [OUT]
set -uo pipefail
out="${1:-build/gpu-check}"; shift || true
mkdir -p "$out"
# GPU_ARCHS unset: the archs of the GPUs present (nvidia-smi), so only what this host runs is compiled.
export JA_BACKEND=cuda PYTHONUNBUFFERED=1
py="${PYTHON:-python3}"
nvidia-smi -L; "$py" -c "import jax; print('jax', jax.__version__, jax.devices())"
t0=$(date +%s)
"$py" -m jatools.native.build --jit build -j "$(nproc)" >"$out/build.log" 2>&1 \
  || { tail -n 40 "$out/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"; tail -n 5 "$out/build.log"
t0=$(date +%s)
# through the tier runner: it fails when JAX sees no GPU or no GPU test runs, and counts them per device
JA_TESTS_PER_GPU=4 "$py" -m jatools.testing.tiers --tier pr --deps-from "$py" --results-dir "$out" -m gpu -q \
  -p no:cacheprovider tests/ops 2>&1 | tee "$out/gpu_tests.log" | tail -n 25
rc=${PIPESTATUS[0]}
echo "gpu tests: exit $rc, $(( $(date +%s) - t0 )) s"
exit "$rc"
