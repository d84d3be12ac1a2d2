#!/usr/bin/env bash
# compute-sanitizer on a reduced GPU test set: memcheck for every op, racecheck
# for RMSNorm (its block reduction) and the attention kernels. Only our kernels
# are instrumented (kernel-name filters); XLA's platform allocator gives every
# buffer its own cudaMalloc so an out-of-bounds access is not hidden inside a
# pooled allocation.
#   bash ci/gpu/sanitize.sh [OUT_DIR]
set -uo pipefail
out="${1:-build/sanitize-gpu}"
mkdir -p "$out"
export XLA_PYTHON_CLIENT_ALLOCATOR=platform XLA_PYTHON_CLIENT_PREALLOCATE=false
py="${PYTHON:-python3}"
status=0
run() {  # name tool kernel-substring pytest-args...
  local name=$1 tool=$2 kns=$3; shift 3
  echo "== $name: compute-sanitizer --tool $tool (kernels matching '$kns')"
  local rc=0
  compute-sanitizer --tool "$tool" --kernel-name "kns=$kns" --error-exitcode 99 \
    "$py" -m pytest -q -p no:cacheprovider -m gpu "$@" >"$out/$name.log" 2>&1 || rc=$?
  if [ "$rc" -eq 0 ]; then
    echo "   clean ($(grep -E '^[0-9]+ passed' "$out/$name.log" | tail -n 1))"
  else
    status=1
    echo "   FAILED (exit $rc): see $out/$name.log"; tail -n 25 "$out/$name.log"
  fi
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$out/$name.log" | tail -n 2 | sed 's/^/   /'
}
run memcheck-rmsnorm memcheck rmsnorm tests/ops/test_rmsnorm.py -k "matches_reference and (100 or 4096 or 1000)"
run racecheck-rmsnorm racecheck rmsnorm tests/ops/test_rmsnorm.py -k "matches_reference and (100 or 4096 or 1000)"
run memcheck-silu memcheck silu tests/ops/test_activation.py -k "matches_reference and (200 or 1001 or 14)"
run memcheck-mha memcheck mha tests/ops/test_attention.py -k "test_sequence_lengths"
run racecheck-mha racecheck mha tests/ops/test_attention.py -k "test_sequence_lengths"
# the decode kernel's splits merging through distributed shared memory (clusters on sm_90)
run memcheck-mha-decode memcheck mha_decode tests/ops/test_attention.py -k "decode_cluster and bfloat16 and sq1"
run racecheck-mha-decode racecheck mha_decode tests/ops/test_attention.py -k "decode_cluster and bfloat16 and sk2048"
exit $status
