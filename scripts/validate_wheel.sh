#!/usr/bin/env bash
# Clean-room validation of one or more wheels (all of dist/ when none is given):
#   bash scripts/validate_wheel.sh dist/jax_aiter-0.1.0-py3-none-manylinux_2_39_x86_64.whl
#   bash scripts/validate_wheel.sh --variant full --engine none
# A container from the validation image when an engine answers, else a fresh venv
# outside the checkout; see docs/validation.md. The logic is jatools/validate/cleanroom.py;
# this wrapper only finds the checkout and turns bare paths into --wheel flags.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    *.whl) args+=(--wheel "$(realpath -m -- "$1")") ;;
    *) args+=("$1") ;;
  esac
  shift
done
cd "$root"
exec "${PYTHON:-python3}" -m jatools.validate.cleanroom "${args[@]}"
