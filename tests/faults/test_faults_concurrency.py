"""Faults of runs that overlap or die: two JIT builds in one build tree, a publish killed halfway. Real processes:
build_jit.py waiting on the build tree's lock, `invoke jit.publish` killed with SIGKILL and run again."""
from __future__ import annotations

import fcntl
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.tooling.jit_libs_support import (  # noqa: F401  (pytest fixtures)
    MODULES,
    REPO,
    checkout_fixture,
    checkout_identity,
    write_build,
)

ROOT = Path(__file__).resolve().parents[2]


def _lines_until(proc: subprocess.Popen, wanted: str, timeout: float) -> list[str]:
    """The lines `proc` prints until one contains `wanted` (or `timeout` passes)."""
    lines, end = [], time.monotonic() + timeout
    while time.monotonic() < end:
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, end - time.monotonic()))
        if not ready:
            break
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if wanted in line:
            break
    return lines


def test_faults_jit_build_waits_for_the_build_trees_lock(tmp_path):
    """Two `nox -s release` runs of one checkout ran two ninja JIT builds in one build/aiter_build at once. The
    build tree's lock (the same one a fetch into it takes): a second build_jit.py says it waits, writes nothing
    while the first holds it, and goes on when it is released."""
    build = tmp_path / "build"
    (build / "jax_aiter_build").mkdir(parents=True)
    shutil.copyfile(ROOT / "build" / "jax_aiter_build" / "libjax_aiter.so",
                    build / "jax_aiter_build" / "libjax_aiter.so")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("JA_")}, "JA_BACKEND": "cpu",
           "JA_BUILD_DIR": str(build), "JA_ROOT_DIR": str(ROOT), "PYTHONUNBUFFERED": "1"}
    fd = os.open(build, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # the first build, holding its lock
    proc = subprocess.Popen([sys.executable, "jax_aiter/jit/build_jit.py", "--module", "rmsnorm_fwd", "-j", "1"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        said = _lines_until(proc, "holds its lock; waiting for it", 120)
        # build_jit.py is `make jit`: make's own turn at the build tree's lock says it (a note-less holder here)
        assert said and f"another run writing into {build} holds its lock; waiting for it: a run that left no note" \
            in said[-1], said
        time.sleep(1.0)
        assert not (build / "aiter_build").exists(), "it built while the other build held the lock"
        fcntl.flock(fd, fcntl.LOCK_UN)
        went_on = _lines_until(proc, "build_jit: backend cpu", 120)
        assert went_on and "build_jit: backend cpu" in went_on[-1], went_on
    finally:
        os.close(fd)
        os.killpg(proc.pid, signal.SIGKILL)  # the build itself is not what this tests
        proc.wait()


def _publish(checkout: Path, to: Path) -> subprocess.Popen:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("JA_")}, "JA_ROOT_DIR": str(checkout),
           "JA_BACKEND": "cpu", "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "invoke", "-r", str(REPO), "jit.publish", "--to", str(to),
                             "--level", "19"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def test_faults_publish_removes_what_a_killed_publish_left(checkout, tmp_path):
    """`invoke jit.publish` killed (SIGKILL) while it compresses leaves its dot-temporary staging folder; a re-publish
    never removed it. Now a publish, holding the staging folder's lock, removes it (saying so) and publishes."""
    ident = checkout_identity(checkout)
    # every configured module's library (a small one each), rmsnorm's large enough that compressing it takes a while
    sizes = {**dict.fromkeys(MODULES.values(), 200_000), "librmsnorm_fwd.so": 40_000_000}
    write_build(checkout / "build" / "aiter_build", ident, sizes=sizes)
    stage_root = checkout / "build" / "jit-libs-publish"
    store = tmp_path / "store"
    first = _publish(checkout, store)
    try:
        end = time.monotonic() + 120
        while time.monotonic() < end and not list(stage_root.glob(".jit-libs-*.tmp-*")):
            time.sleep(0.02)
        left = list(stage_root.glob(".jit-libs-*.tmp-*"))
        assert left, "the publish never started staging"
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    assert all(p.exists() for p in left)  # what the killed run left
    second = _publish(checkout, store)
    out, _ = second.communicate(timeout=600)
    assert second.returncode == 0, out
    for p in left:
        assert f"publish: removing {p}, left by process {first.pid}, which is no longer running" in out, out
        assert not p.exists()
    assert not list(stage_root.glob(".*.tmp-*")) and not list(store.rglob(".*.tmp-*"))
    assert (store / f"jit-libs-{ident['cache_id']}" / "jit-libs-manifest.json").is_file()
