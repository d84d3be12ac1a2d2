#!/usr/bin/env bash
# Build a wheel from the build tree into dist/:
#
#   bash scripts/build_wheel.sh --variant lite|full [--check] [--dist DIR] [--plat-name TAG]
#
# Environment: JA_WHEEL_PLAT_NAME (platform tag; default: the measured symbol floor),
# JA_WHEEL_ARCH (GPU arch, recorded in the build identity), SOURCE_DATE_EPOCH.
# Never runs build_jit.py: missing JIT libraries fail at once with the command that makes them.
# Thin wrapper: the logic is jatools/wheel/wheel_build.py, run with the project's tools (scripts/run.sh).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
exec bash "$root/scripts/run.sh" python -m jatools.wheel.wheel_build "$@"
