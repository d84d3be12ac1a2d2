#!/usr/bin/env bash
# The H200 job of CI, run as CI runs it, on an offline GPU host (the lent H200): the GPU tier against the CUDA
# lane's validated wheel, installed into a fresh environment, never against a build tree.
#   1. a local package index (python3 -m ci.gpu.offline_index index: the carried wheels, the CUDA lane's among them,
#      plus the host's jax, jaxlib and jax-cuda13 plugin repacked), which pip and uv use offline;
#   2. the tier against the lane's wheel: python3 -m jatools.lane_tier, what CI's pr_gpu_cuda_h200 runs after
#      `nox -s release` (nox -s tests_lane): the full wheel the carried release report vouches for
#      (jax_aiter-<version>+cuda13.full-*.whl, built and validated by `nox -s release`) into a fresh venv with JAX's
#      CUDA plugin at the test pin and the tier group, `python -m jax_aiter info` from it, and the pr tier on the
#      CUDA platform against it (the tier says where jax_aiter came from and which lane, and refuses the checkout's).
# BUILD arguments also run those ci/build.py builds afterwards, as build_gpu runs them (env-report, jit.fetch,
# each session's --install-only and -R passes), after the producer (`nox -s jit`, `invoke jit.publish`).
# Results (tier JSON with the GPU tests per device and the installed wheel, ci/build.py's records) go to OUT.
#   bash ci/gpu/h200_ci_jobs.sh WHEELS OUT [BUILD...]
# WHEELS: made on a machine with an index by
#   python3 -m ci.gpu.offline_index download WHEELS --groups tier
#   cp dist/release-report.json dist/jax_aiter-*+cuda13.full-*.whl WHEELS/
# For a run without a GPU (tests/wheel/test_h200_ci_job.py): LANE=cpu TIER_PLATFORM=cpu, TIER_ARGS for pytest.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
wheels=$(realpath "$1") out=$(realpath -m "$2")
shift 2
builds=("$@")
mkdir -p "$out"
py=$(command -v "${PYTHON:-python3}")
# shellcheck source=ci/gpu/steps.sh
. ci/gpu/steps.sh

bin=$(mktemp -d)  # python<X.Y> (the project's Python) on PATH for scripts/run.sh and nox: the host's interpreter
pyv=$("$py" -c 'from jatools.config import python_version; print(python_version())') || exit 1
ln -s "$py" "$bin/python$pyv"
export PATH="$bin:$PATH" PYTHONUNBUFFERED=1 CI=true JA_BACKEND="${JA_BACKEND:-cuda}"
groups=(tier)
[ "${#builds[@]}" -eq 0 ] || groups=(test build run bench wheel tier)
idx=$(mktemp -d)
"$py" -m ci.gpu.offline_index index "$idx" --carried "$wheels" --groups "${groups[@]}" || exit 1
export PIP_NO_INDEX=1 PIP_FIND_LINKS="$idx" PIP_CONSTRAINT="" UV_OFFLINE=1 UV_NO_INDEX=1 UV_FIND_LINKS="$idx"
# The CUDA libraries the host's JAX loads from its pip-installed nvidia packages, for the fresh venvs too.
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

# The GPU tier against the CUDA lane's validated wheel, in a fresh venv (outside OUT: only the results travel back).
read -r -a tier_args <<<"${TIER_ARGS:-}"
step lane-tier 3600 "$py" -m jatools.lane_tier --lane "${LANE:-cuda13}" --dist "$wheels" --platform "${TIER_PLATFORM:-cuda}" \
  --tier pr --results-dir "$out" "${tier_args[@]}"

if [ "${#builds[@]}" -gt 0 ]; then
  # the producer builds for CI's archs (pyproject gpu_archs_cuda, which ci/build.py's builds set), not the GPU here
  GPU_ARCHS="${GPU_ARCHS-$("$py" -c 'from jatools.native.build import default_archs; print(default_archs("cuda"))')}"
  export GPU_ARCHS
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
fi
"$py" - "$out" <<'PY'
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + "/tier-*.json")):
    gpu = json.load(open(f)).get("gpu") or {}
    wheel = gpu.get("installed") or {}
    print(f"{f.rsplit('/', 1)[1]}: GPU tests per device {gpu.get('tests_per_device')}; jax_aiter "
          f"{wheel.get('version')} (lane {wheel.get('lane')}) from {wheel.get('file')}")
PY
finish
