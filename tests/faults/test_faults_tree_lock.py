"""Faults of runs that overlap in one build tree: two `make umbrella`, a make under a run that holds the tree, two
first runs of scripts/run.sh. Real make, real compilers, real bash and venv, on scratch copies
(jatools/native/tree_lock.py, jax_aiter/download/folder_lock.py)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jatools.native import compiler_cache
from jax_aiter.download import folder_lock
from tests.build.scratch import env_for, make_scratch

WAITS = "another run writing into"


def _env(root: Path, **extra: str) -> dict[str, str]:
    """The scratch tree's environment with this interpreter's tools (make's Python, ccache, ninja) first on PATH."""
    tool = compiler_cache.find_tool({"PATH": os.environ.get("PATH", "")})
    dirs = [str(Path(sys.executable).parent), *([str(Path(tool).parent)] if tool else [])]
    return env_for(root, PATH=":".join([*dirs, os.environ.get("PATH", "")]), PYTHONUNBUFFERED="1", **extra)


def _make(root: Path, *goals: str, **env: str) -> subprocess.Popen:
    return subprocess.Popen(["make", *goals, f"PYTHON={sys.executable}"], cwd=root, env=_env(root, **env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _umbrella_is_whole(root: Path) -> None:
    lib = root / "build" / "jax_aiter_build" / "libjax_aiter.so"
    assert lib.read_bytes()[:4] == b"\x7fELF", "no umbrella library was left"
    assert not list(lib.parent.glob("*.tmp*")), list(lib.parent.iterdir())


def test_faults_two_makes_at_once_wait_their_turn_and_name_the_holder(tmp_path):
    """Two `make umbrella` at once in one tree raced on the umbrella's temporary file (4 of 4 failed, no library
    left, nothing named the other build). Now the second waits, naming the first, and both succeed."""
    root = make_scratch(tmp_path / "src")
    # The first compiles (no compiler cache: a cached build can end before a second starts), and the second starts
    # once the first holds the tree: the two overlap whatever the machine's load.
    first = _make(root, "umbrella", JA_COMPILER_CACHE="off")
    build, end = root / "build", time.monotonic() + 120
    while folder_lock.holder(build) is None and first.poll() is None and time.monotonic() < end:
        time.sleep(0.005)
    assert first.poll() is None, ("the first make ended before the second could start", first.communicate())
    second = _make(root, "umbrella")
    outs = [p.communicate(timeout=600) for p in (first, second)]
    assert [p.returncode for p in (first, second)] == [0, 0], outs
    said = outs[1][1]
    assert f"make umbrella: {WAITS} {(root / 'build').resolve()} holds its lock; waiting for it: pid " in said, said
    assert "`make umbrella`, since " in said, said
    _umbrella_is_whole(root)


def test_faults_a_make_waits_while_another_run_holds_the_tree_then_builds(tmp_path):
    """The build tree held by another run (a stand-in for a `nox -s jit` at work): make says which run holds it,
    compiles nothing while it does, and builds once it is let go."""
    root = make_scratch(tmp_path / "src")
    script = ("import sys\nfrom jatools.native import tree_lock\n"
              "lock = tree_lock.hold('nox -s jit'); print('held', flush=True); sys.stdin.read()")
    holder = subprocess.Popen([sys.executable, "-c", script],
                              cwd=root, env=_env(root), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        make = _make(root, "umbrella")
        deadline = time.monotonic() + 60
        note = folder_lock.holder(root / "build")
        assert note and note["pid"] == holder.pid and note["what"] == "nox -s jit", note
        while make.poll() is None and time.monotonic() < deadline and not (root / "build" / "obj").exists():
            time.sleep(0.2)
            if time.monotonic() > deadline - 55:  # five seconds of holding
                break
        assert make.poll() is None and not (root / "build" / "obj").exists(), "make built under another run's lock"
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    out, err = make.communicate(timeout=600)
    assert make.returncode == 0, (out, err)
    assert f"waiting for it: pid {holder.pid}, `nox -s jit`, since " in err, err
    _umbrella_is_whole(root)
    assert not (root / "build" / folder_lock.NOTE).exists(), "the holder's note outlived its lock"


def test_faults_a_make_under_the_holder_goes_on(tmp_path):
    """A make that the holding run starts itself (nox -> make -> the JIT build) must not wait for its own parent:
    it finds its ancestor's pid in the holder's note and builds at once."""
    root = make_scratch(tmp_path / "src")
    script = ("import subprocess, sys\nfrom jatools.native import tree_lock\n"
              "with tree_lock.hold('nox -s tests'):\n"
              f"    sys.exit(subprocess.run(['make', 'umbrella', 'PYTHON={sys.executable}'], "
              "timeout=600).returncode)\n")
    r = subprocess.run([sys.executable, "-c", script], cwd=root, env=_env(root), capture_output=True, text=True,
                       timeout=900, check=False)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert WAITS not in r.stderr, r.stderr
    _umbrella_is_whole(root)


def test_faults_two_first_runs_of_run_sh_make_one_tools_environment(tmp_path):
    """Two first runs of scripts/run.sh at once made one .venv-tools together (one died inside ensurepip). Now the
    second waits for the first one's setup, naming it, and uses the environment it made. (An empty hash-pinned
    requirements file keeps the setup to a venv: no package index is asked.)"""
    if shutil.which("bash") is None:
        pytest.skip("no bash here")
    root = make_scratch(tmp_path / "src")
    (root / "empty-requirements.txt").write_text("")
    env = {**_env(root), "JA_TOOLS_REQUIREMENTS": "empty-requirements.txt"}
    env.pop("VIRTUAL_ENV", None)
    cmd = ["bash", "scripts/run.sh", "python", "-c", "import sys; print(sys.prefix)"]
    runs = [subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)]
    time.sleep(0.3)
    runs.append(subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=600) for p in runs]
    assert [p.returncode for p in runs] == [0, 0], outs
    assert all(out.strip() == str(root / ".venv-tools") for out, _ in outs), outs
    waited = [err for _, err in outs if WAITS in err]
    assert len(waited) == 1 and "`scripts/run.sh: preparing .venv-tools`" in waited[0], outs
    assert sum("preparing" in err and WAITS not in err for _, err in outs) == 1, outs
