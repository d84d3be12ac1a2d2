"""Makefile behaviour: no-op builds, clean safety, missing JIT libraries, FFI-version refusal."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from jax_aiter import remedies
from tests.build.scratch import env_for, make_scratch, run


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    root = make_scratch(tmp_path_factory.mktemp("make"))
    run(["make", "-j2"], root)
    return root


def test_up_to_date_make_runs_no_python_but_the_trees_lock(scratch, tmp_path):
    # A PYTHON that logs what it runs, and fails for anything but the build tree's lock (jatools/native/tree_lock.py),
    # proves the config step is skipped.
    log = tmp_path / "ran"
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\necho \"$*\" >> {log}\n[ \"$2\" = jatools.native.tree_lock ] || exit 1\n"
                      f"exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    out = run(["make", f"PYTHON={python}"], scratch)
    assert "Nothing to be done" in out.stdout, out.stdout + out.stderr
    assert [line.split()[:2] for line in log.read_text().splitlines()] == [["-m", "jatools.native.tree_lock"]]
    # `make -q` (the release asks it whether the umbrella is up to date) answers for the goal itself, without a lock
    log.unlink()
    assert run(["make", "-q", "umbrella", f"PYTHON={python}"], scratch, check=False).returncode == 0
    assert not log.exists(), log.read_text()


def test_changed_backend_regenerates_config(scratch, tmp_path):
    cfg = scratch / "build/config.mk"
    before = cfg.read_text()
    out = run(["make", "-n"], scratch, env_for(scratch, GPU_ARCHS="sm_80"))
    assert "jax-aiter: backend cpu" in out.stderr
    assert cfg.read_text() != before  # key recorded the new GPU_ARCHS
    run(["make"], scratch)  # and back


def test_ja_mods_without_jit_libraries_names_the_fix(scratch):
    out = run(["make", "ja_mods_nomha"], scratch, check=False)
    assert out.returncode != 0
    assert "librmsnorm_fwd.so is missing" in out.stderr
    assert remedies.build_or_fetch(["rmsnorm_fwd"]) in out.stderr  # the one home of the remedy's words


def test_clean_stage_and_clean_keep_jit_outputs(scratch):
    jit = scratch / "build/aiter_build"
    jit.mkdir(parents=True, exist_ok=True)
    (jit / "libexpensive.so").write_bytes(b"hours of work")
    stage = scratch / "build/wheel_stage"
    stage.mkdir(parents=True, exist_ok=True)
    run(["make", "clean-stage"], scratch)
    assert not stage.exists() and (jit / "libexpensive.so").exists()
    assert (scratch / "build/jax_aiter_build/libjax_aiter.so").exists()
    out = run(["make", "clean"], scratch)
    assert (jit / "libexpensive.so").exists()
    assert "kept build/aiter_build" in out.stderr and "JA_CLEAN_JIT=yes" in out.stderr
    assert not (scratch / "build/jax_aiter_build").exists()
    run(["make", "clean", "JA_CLEAN_JIT=yes"], scratch)
    assert not jit.exists()
    run(["make", "-j2"], scratch)  # leave the module fixture usable


def test_shim_built_against_newer_ffi_api_is_refused(scratch, tmp_path):
    """A shim whose headers claim a newer FFI API than jaxlib's is refused before registration."""
    inc = tmp_path / "ffi-next"
    subprocess.run(["cp", "-r", str(scratch / "third_party/xla_ffi/include"), str(inc)], check=True)
    c_api = inc / "xla/ffi/api/c_api.h"
    c_api.write_text(c_api.read_text().replace("#define XLA_FFI_API_MINOR 3", "#define XLA_FFI_API_MINOR 99"))
    build = tmp_path / "build-next"
    env = env_for(scratch, JA_BUILD_DIR=str(build), JA_FFI_INCLUDE_DIR=str(inc))
    run(["make", "-j2", "umbrella", str(build / "jax_aiter_build/silu_and_mul_ja.so")], scratch, env)
    code = ("import jax.numpy as jnp, jax_aiter as ja\n"
            "try:\n    ja.silu_and_mul(jnp.ones((2, 4)))\n"
            "except ImportError as e:\n    print(type(e).__name__, e)\n")
    out = subprocess.run([sys.executable, "-c", code], check=False, cwd=scratch, env=env, capture_output=True,
                         text=True)
    assert "FfiVersionError" in out.stdout, out.stdout + out.stderr
    assert "built against XLA FFI API 0.99" in out.stdout
    assert "Rebuild the shims against jaxlib 0.11.0's headers" in out.stdout


def test_missing_library_names_the_command(tmp_path):
    env = env_for(Path(__file__).resolve().parents[2], JA_BUILD_DIR=str(tmp_path / "empty"))
    code = ("import jax.numpy as jnp, jax_aiter as ja\n"
            "try:\n    ja.rms_norm(jnp.ones((2, 4)), jnp.ones(4))\n"
            "except ImportError as e:\n    print(type(e).__name__, e)\n")
    out = subprocess.run([sys.executable, "-c", code], check=False, env=env, capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert "LibraryNotFoundError" in out.stdout and "run `make`" in out.stdout, out.stdout + out.stderr
