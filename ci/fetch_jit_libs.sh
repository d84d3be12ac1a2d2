#!/usr/bin/env bash
# Fetch this checkout's JIT libraries (release jit-libs-<cache-id>) into build/aiter_build.
# An alias of `invoke jit.fetch` (the one door; run with the project's tools): it never
# builds: a miss exits non-zero with the reason.
#
#   bash ci/fetch_jit_libs.sh [--base-url URL] [--strict] [--force]
#   JA_FETCH_BASE_URL=https://... JA_BACKEND=rocm GPU_ARCHS=gfx950 bash ci/fetch_jit_libs.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
exec bash "$root/scripts/run.sh" invoke -r "$root" jit.fetch "$@"
