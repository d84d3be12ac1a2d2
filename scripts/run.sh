#!/usr/bin/env bash
# Run a jax-aiter command (nox, invoke, pytest ...) with the project's tools
# installed: makes .venv-tools (the project's Python, the `run` dependency group
# of pyproject.toml: nox, invoke, uv, the wheel writer's needs) once, then runs
# the command with it first on PATH.
#
#   bash scripts/run.sh nox -s release
#   bash scripts/run.sh nox -s tests
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
# pip and venv write the checkout's path into every script they install (#! lines, RECORD) as UTF-8 and stop
# with "'utf-8' codec can't encode" on a path whose bytes are not UTF-8: say so first, naming the path.
if command -v iconv >/dev/null 2>&1 && ! printf '%s' "$root" | iconv -f UTF-8 -t UTF-8 >/dev/null 2>&1; then
  printf 'run.sh: the checkout path %q is not valid UTF-8; pip and venv cannot install tools under it (they\n' \
    "$root" >&2
  echo "  write every path as UTF-8). Move or rename the checkout to a UTF-8 path and run again." >&2
  exit 2
fi
export JA_ROOT_DIR="${JA_ROOT_DIR:-$root}"

# The project's Python: the floor of pyproject's requires-python, its one home (jatools.config.python_version
# reads the same field; tests/tooling/test_version.py runs this line against it), e.g. ">=3.12" gives 3.12.
pyv="$(sed -n 's/^requires-python *= *">= *\([0-9][0-9]*\.[0-9][0-9]*\)".*/\1/p' pyproject.toml)"
if [ -z "$pyv" ]; then
  echo "run.sh: pyproject.toml's requires-python is not of the form '>=X.Y'; write the Python floor the builds use" >&2
  exit 2
fi
py="python$pyv"
# On PATH, else a manylinux container's own (/opt/python/cp312-cp312 for 3.12: the release job uses the
# container's Python, not actions/setup-python), else a pyenv-installed one made visible through PYENV_VERSION
# (exported, so nox finds it for its sessions too).
manylinux_py="/opt/python/cp${pyv/./}-cp${pyv/./}/bin"
if ! (command -v "$py" >/dev/null 2>&1 && "$py" -c '' 2>/dev/null) && [ -x "$manylinux_py/$py" ]; then
  export PATH="$manylinux_py:$PATH"
  echo "run.sh: using the container's Python $pyv ($manylinux_py)" >&2
fi
if ! (command -v "$py" >/dev/null 2>&1 && "$py" -c '' 2>/dev/null); then
  v=""
  if command -v pyenv >/dev/null 2>&1; then
    v="$(pyenv versions --bare 2>/dev/null | grep -E "^${pyv//./\\.}(\.[0-9]+)?\$" | tail -n 1 || true)"
  fi
  if [ -z "$v" ]; then
    echo "run.sh: Python $pyv is required (pyproject.toml's requires-python). Install it (e.g. 'pyenv install $pyv'" \
         "or 'apt-get install $py') and run again." >&2
    exit 2
  fi
  current="$(pyenv version-name 2>/dev/null | tr -d ' ' || true)"
  export PYENV_VERSION="${current:+$current:}$v"
  echo "run.sh: using Python $v from pyenv (PYENV_VERSION=$PYENV_VERSION)" >&2
fi
venv="$root/.venv-tools"
# JA_TOOLS_REQUIREMENTS: a hash-pinned requirements file of the same group (ci/requirements/run.txt), installed
# with --require-hashes instead; the CI jobs that hold a write token set it.
reqs="${JA_TOOLS_REQUIREMENTS:-}"
stamp="$venv/.installed-$(sha256sum pyproject.toml scripts/run.sh ${reqs:+"$reqs"} | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  # The build tree's lock (jatools/native/tree_lock.py), held by this shell through descriptor 9 while it prepares
  # the tools: two first runs at once made one environment together (one died inside ensurepip). A second run says
  # which run it waits for, then finds the environment made.
  lockdir="$("$py" -m jatools.native.tree_lock --print-folder)" || exit 2
  exec 9<"$lockdir"
  "$py" -m jatools.native.tree_lock --what "scripts/run.sh: preparing .venv-tools" --fd 9 || exit 2
fi
if [ ! -f "$stamp" ]; then
  echo "run.sh: preparing $venv (pyproject's dependency group 'run': nox, invoke, uv, the wheel writer's needs)" >&2
  rm -rf "$venv"
  "$py" -m venv "$venv"
  if [ -n "$reqs" ]; then
    "$venv/bin/python" -m pip install -q --require-hashes --no-deps -r "$reqs"
  else
    "$venv/bin/python" -m pip install -q --upgrade "pip>=25.1"  # 25.1: the first pip that reads --group (PEP 735)
    "$venv/bin/python" -m pip install -q --group run
  fi
  touch "$stamp"
fi
exec 9<&-  # the lock goes with the descriptor (nox, make and the JIT build take it again for themselves)
export PATH="$venv/bin:$PATH"
exec "$@"
