"""Faults of the checkout's path: a space, a byte that is not UTF-8. Real copies of the build inputs under such
paths, built by the real make, build_jit.py and compilers; scripts/run.sh run from such a path."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.build.scratch import env_for, make_scratch

ROOT = Path(__file__).resolve().parents[2]
NOT_UTF8 = os.fsdecode(b"caf\xe9")  # Latin-1 'café': a valid Linux file name, not valid UTF-8


def _run(cmd: list[str], root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=root, env=env_for(root), capture_output=True, text=True, errors="replace",
                          timeout=600, check=False)


def test_faults_checkout_path_with_a_space_builds_and_runs_an_op(tmp_path):
    """make, build_jit.py and make ja_mods_nomha under '<tmp>/with space/', then rms_norm from that build
    (it was `cc1plus: invalid argument '<dir>/with' to -ffile-prefix-map`)."""
    root = make_scratch(tmp_path / "with space" / "jax aiter")
    for cmd in (["make", "-j2", "umbrella"], [sys.executable, "jax_aiter/jit/build_jit.py", "--module", "rmsnorm_fwd"],
                ["make", "-j2", "ja_mods_nomha"]):
        r = _run(cmd, root)
        assert r.returncode == 0, f"{cmd}: {r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    assert f"-ffile-prefix-map={root}/=" in (root / "build" / "config.mk").read_text()  # quoted as one word
    code = ("import jax.numpy as jnp, jax_aiter as ja\n"
            "print(float(ja.rms_norm(jnp.ones((2, 64), jnp.float32), jnp.ones(64, jnp.float32), 1e-6).sum()))")
    env = {**env_for(root), "PYTHONPATH": str(root), "JAX_PLATFORMS": "cpu"}
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300, check=False)
    assert r.returncode == 0 and abs(float(r.stdout.strip().splitlines()[-1]) - 128.0) < 1e-3, r.stderr[-2000:]


def test_faults_checkout_path_not_utf8_builds_the_umbrella(tmp_path):
    """make under a path with byte 0xe9: config.mk keeps the path's bytes (surrogateescape), the compilers get
    them as one argument each."""
    root = make_scratch(tmp_path / NOT_UTF8)
    r = _run(["make", "-j2", "umbrella"], root)
    assert r.returncode == 0, f"{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    assert (root / "build" / "jax_aiter_build" / "libjax_aiter.so").is_file()
    assert os.fsencode(str(root)) in (root / "build" / "config.mk").read_bytes()


def test_faults_run_sh_names_a_checkout_path_that_is_not_utf8(tmp_path):
    """scripts/run.sh from a checkout whose path is not UTF-8: one message naming the path and the cause (pip and
    venv write paths as UTF-8), exit 2, before any venv is made (it was "'utf-8' codec can't encode '\\udce9'")."""
    if shutil.which("iconv") is None:
        pytest.skip("iconv is not installed: scripts/run.sh checks the path with it")
    root = tmp_path / NOT_UTF8
    (root / "scripts").mkdir(parents=True)
    shutil.copy2(ROOT / "scripts" / "run.sh", root / "scripts" / "run.sh")
    r = subprocess.run(["bash", str(root / "scripts" / "run.sh"), "true"], capture_output=True, timeout=60,
                       check=False)
    err = r.stderr.decode(errors="replace")
    assert r.returncode == 2, err
    assert "is not valid UTF-8" in err and "\\351" in err and "Move or rename the checkout" in err, err
    assert not (root / ".venv-tools").exists()
