#!/usr/bin/env bash
# The H200 jobs of CI, run as CI runs them, on an offline GPU host (the lent H200):
#   1. a local package index (ci/gpu/offline_index.py index: the carried wheels plus the host's jax, jaxlib and
#      jax-cuda13 plugin repacked), which pip and uv use offline, so every install pass is CI's own;
#   2. the producer, as ci.yml runs it for a kernel change: `nox -s jit` (install pass, then -R), then
#      `invoke jit.publish --to <the run's JIT store>` (the merge build's step), and the JIT libraries emptied;
#   3. each BUILD through `ci/build.py --build BUILD` with JA_FETCH_BASE_URL=<that store>, as build_gpu
#      runs it after the producer: env-report, jit.fetch, then each session's --install-only and -R passes.
# The copy is made a git checkout first when it is none (CI's is; the JIT identity needs one).
# Results (tier JSON with the GPU tests per device, ci/build.py's records, the bench gate's JSON) go to OUT,
# with the producer's store as OUT/jit-store.tar: a later call given it as JIT_STORE_TAR skips the producer.
#   bash ci/gpu/h200_ci_jobs.sh WHEELS OUT [BUILD...]   (default: pr_gpu_cuda_h200 nightly_cuda_h200_bench)
# WHEELS: made on a machine with an index by `python3 ci/gpu/offline_index.py download WHEELS [--on-host NAME ...]`
# (--on-host: what the GPU image already has, left behind to keep the carried folder under the 64 MiB limit).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
wheels=$(realpath "$1") out=$(realpath -m "$2")
shift 2
builds=("$@")
[ "${#builds[@]}" -gt 0 ] || builds=(pr_gpu_cuda_h200 nightly_cuda_h200_bench)
mkdir -p "$out"
py=$(command -v "${PYTHON:-python3}")
# shellcheck source=ci/gpu/steps.sh
. ci/gpu/steps.sh

bin=$(mktemp -d)  # python<X.Y> (the project's Python) on PATH for scripts/run.sh and nox: the host's interpreter
pyv=$("$py" -c 'from jatools.config import python_version; print(python_version())') || exit 1
ln -s "$py" "$bin/python$pyv"
export PATH="$bin:$PATH" PYTHONUNBUFFERED=1 CI=true JA_BACKEND="${JA_BACKEND:-cuda}"
GPU_ARCHS="${GPU_ARCHS-$("$py" -c 'from jatools.native.build import default_archs; print(default_archs("cuda"))')}" && export GPU_ARCHS
idx=$(mktemp -d)
"$py" ci/gpu/offline_index.py index "$idx" --carried "$wheels" || exit 1
export PIP_NO_INDEX=1 PIP_FIND_LINKS="$idx" PIP_CONSTRAINT="" UV_OFFLINE=1 UV_NO_INDEX=1 UV_FIND_LINKS="$idx"
# The CUDA libraries the host's JAX loads from its pip-installed nvidia packages, for the sessions' venvs too.
nvlibs=$("$py" -c 'import glob, site; print(":".join(sorted(d for p in site.getsitepackages() for d in glob.glob(p + "/nvidia/*/lib"))))' \
  2>/dev/null || true)
export LD_LIBRARY_PATH="${nvlibs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [ "$(git rev-parse --show-toplevel 2>/dev/null)" != "$PWD" ]; then
  git init -q || exit 1
  case "$wheels/" in "$PWD"/*) echo "/${wheels#"$PWD"/}/" >>.git/info/exclude ;; esac
  if ! { git add -A && git -c user.name=ci -c user.email=ci@localhost commit -qm "device copy"; }; then
    echo "h200_ci_jobs: cannot make the copy a git checkout"; exit 1
  fi
fi
nvidia-smi -L
# The build folders from their one home (jatools/config.py BUILD_TREE, under JA_BUILD_DIR): the run's JIT store,
# the JIT libraries, the tiers' results, the benchmarks' JSON, ci/build.py's records.
IFS=$'\t' read -r store jit results bench records < <("$py" -c 'from jatools import config
print(*(config.build_path(n) for n in ("jit_store", "jit", "test_results", "bench", "ci_records")), sep="\t")') &&
  [ -n "$records" ] || exit 1

if [ -n "${JIT_STORE_TAR:-}" ]; then
  step producer-store 60 tar -xf "$JIT_STORE_TAR"  # $store/jit-libs-<cache id>/, from an earlier call
else
  step producer-install 300 bash scripts/run.sh nox -s jit --install-only
  step producer 420 bash scripts/run.sh nox -R -s jit
  step producer-publish 120 bash scripts/run.sh invoke jit.publish --to "$store"
  tar -cf "$out/jit-store.tar" "$store"
fi
rm -rf "$jit"  # the jobs fetch what the producer published, as on a fresh runner
export JA_FETCH_BASE_URL=$store
for b in "${builds[@]}"; do
  step "$b" 1200 bash scripts/run.sh python3 ci/build.py --build "$b"
done
cp "$results"/tier-*.json "$records"/*.json "$bench"/gpu.json "$out"/ 2>/dev/null
"$py" - "$out" <<'PY'
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + "/tier-*.json")):
    gpu = json.load(open(f)).get("gpu") or {}
    print(f"{f.rsplit('/', 1)[1]}: GPU tests per device {gpu.get('tests_per_device')}")
PY
finish
