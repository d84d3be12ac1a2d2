"""Faults of the build tree's disk: a read-only checkout, a full disk. A scratch copy of the build inputs mounted
read-only (a bind mount) and a full 64 KiB tmpfs as JA_BUILD_DIR, built by the real make."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.build.scratch import env_for, make_scratch
from tests.faults.mounts import fill, mounted


def _make(root: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "umbrella"], cwd=root, env=env_for(root, **env), capture_output=True, text=True,
                          timeout=300, check=False)


def test_faults_read_only_checkout_is_one_clear_error(tmp_path):
    """make in a read-only checkout: two chained tracebacks and "No rule to make target build/config.mk". Now one
    line naming the folder, why and the fix (JA_BUILD_DIR), and make's own stop."""
    src = make_scratch(tmp_path / "src")
    with mounted(["--bind", str(src)], tmp_path / "ro", "a bind mount") as ro:
        if subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], check=False).returncode != 0:
            pytest.skip("cannot remount the bind mount read-only here")
        r = _make(ro)
        assert r.returncode == 2, (r.stdout, r.stderr)
        assert (f"error: cannot write {ro / 'build'}: Read-only file system; the build writes its tree inside the "
                "checkout: make the checkout writable, or set JA_BUILD_DIR to a writable folder") in r.stderr, r.stderr
        assert "Traceback" not in r.stderr and "No rule to make target" not in r.stderr, r.stderr
        writable = tmp_path / "elsewhere"
        ok = _make(ro, JA_BUILD_DIR=str(writable))  # the fix it names works
        assert ok.returncode == 0 and (writable / "jax_aiter_build" / "libjax_aiter.so").is_file(), ok.stderr


def test_faults_full_disk_names_the_path(tmp_path):
    """JA_BUILD_DIR on a full disk: the first write (build/config.mk) failed with "No space left on device" and no
    path. Now the error names the file and the fix."""
    src = make_scratch(tmp_path / "src")
    with mounted(["-t", "tmpfs", "-o", "size=64k", "tmpfs"], tmp_path / "disk", "a small tmpfs") as disk:
        (disk / "aiter_build").mkdir()  # a build tree already (JA_BUILD_DIR outside the checkout must be one)
        fill(disk / "aiter_build" / "filler")
        r = _make(src, JA_BUILD_DIR=str(disk))
        assert r.returncode == 2, (r.stdout, r.stderr)
        assert f"error: cannot write {disk / 'config.mk'}: No space left on device; free some space there, or set " \
               "JA_BUILD_DIR to a folder on another disk" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
