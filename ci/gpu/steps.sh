#!/usr/bin/env bash
# Sourced by the ci/gpu/*.sh scripts: time-boxed steps whose failures are remembered, so a script runs every
# step and still exits non-zero when any failed.
#   step NAME SECONDS CMD...   run CMD under `timeout`, print its exit status and time
#   finish                     print the failed steps and exit 1 if any, else exit 0
failed=()
step() {
  local name=$1 limit=$2 s rc
  shift 2
  echo "=== $name"
  s=$(date +%s)
  timeout "$limit" "$@"
  rc=$?
  echo "--- $name: exit $rc, $(( $(date +%s) - s )) s"
  [ "$rc" -eq 0 ] || failed+=("$name (exit $rc)")
  return 0
}
finish() {
  if [ "${#failed[@]}" -gt 0 ]; then
    echo "FAILED steps: ${failed[*]}"
    exit 1
  fi
  echo "all steps passed"
  exit 0
}
