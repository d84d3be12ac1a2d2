#!/usr/bin/env bash
# Fetch this checkout's JIT libraries (release jit-libs-<cache-id>) into build/aiter_build.
# A thin wrapper over `python3 ci/jit_libs_manifest.py fetch` (same as `invoke jit.fetch`);
# it never builds: a miss exits non-zero with the reason.
#
#   bash ci/fetch_jit_libs.sh [--base-url URL] [--strict] [--force]
#   JA_FETCH_BASE_URL=https://... JA_BACKEND=rocm GPU_ARCHS=gfx950 bash ci/fetch_jit_libs.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export JA_ROOT_DIR="${JA_ROOT_DIR:-$root}"
exec "${PYTHON:-python3}" "$root/ci/jit_libs_manifest.py" fetch "$@"
