"""Fixtures for the wheel tests: one real CPU build of the native libraries per session, and wheels built from it.

The native libraries are built with the project's own commands (make, build_jit.py,
make ja_mods / ja_mods_nomha) into build/tests-cpu, so a GPU build in build/ is never
touched. A library whose sources this checkout does not have yet (the attention
libraries before that work is merged) cannot be built; it is dropped from the
layout the tests use, and the session prints which and why.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jatools import config
from jatools.wheel.wheel_build import BuildOptions, BuildResult, build
from jatools.wheel.wheel_layout import Layout

ROOT = Path(__file__).resolve().parents[2]
TEST_BUILD_DIR = "build/tests-cpu"
EPOCH = 1700000000  # SOURCE_DATE_EPOCH for the shared wheels


def cpu_env(build_dir: str | Path = TEST_BUILD_DIR) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("JA_WHEEL_PLAT_NAME", "JA_WHEEL_ARCH", "GPU_ARCHS")}
    env.update(JA_BACKEND="cpu", JA_BUILD_DIR=str(build_dir), JA_ROOT_DIR=str(ROOT), PYTHON=sys.executable)
    return env


def cpu_settings(build_dir: str | Path = TEST_BUILD_DIR) -> config.Settings:
    """CPU-backend settings for `build_dir`."""
    return config.load(root=ROOT, env=cpu_env(build_dir))


def unbuildable(layout: Layout, root: Path = ROOT) -> dict[str, str]:
    """{library: why} for the layout's libraries whose sources this checkout lacks."""
    modules = json.loads((root / "jax_aiter/jit/optCompilerConfig.json").read_text())["modules"]
    out = {}
    for name, spec in layout.libraries.items():
        if spec.kind == "jit" and spec.module not in modules:
            out[name] = f"no {spec.module} module in jax_aiter/jit/optCompilerConfig.json"
        elif spec.kind == "shim" and not (root / "csrc/ffi" / spec.op).is_dir():
            out[name] = f"no csrc/ffi/{spec.op}"
    return out


def _run(cmd: list[str], env: dict[str, str]) -> None:
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        pytest.fail(f"native build step {' '.join(cmd)} failed (exit {out.returncode}):\n{out.stdout[-3000:]}\n"
                    f"{out.stderr[-3000:]}")


@pytest.fixture(scope="session")
def layout(request) -> Layout:
    """The real layout, less the libraries this checkout cannot build (printed, never silent)."""
    full = Layout.load()
    missing = unbuildable(full)
    notes = [f"wheel tests: this checkout cannot build {n} ({why}); the tests use the layout without it"
             for n, why in sorted(missing.items())]
    if notes:
        capture = request.config.pluginmanager.get_plugin("capturemanager")
        with capture.global_and_fixture_disabled():
            print("\n" + "\n".join(notes))
    return full.without(sorted(missing))


@pytest.fixture(scope="session")
def native_build(layout) -> config.Settings:
    """Build the CPU libraries with the project's build (incremental: fast when up to date)."""
    env = cpu_env()
    _run(["make", "-j2", "umbrella"], env)
    _run([sys.executable, "jax_aiter/jit/build_jit.py", "-j", "2"], env)
    _run(["make", "-j2", "ja_mods" if not unbuildable(Layout.load()) else "ja_mods_nomha"], env)
    return cpu_settings()


def copy_build(native: config.Settings, dst: Path) -> config.Settings:
    """Settings for a private copy of the build tree's libraries and record (its own wheel_stage/)."""
    for sub in ("jax_aiter_build", "aiter_build"):
        shutil.copytree(native.build_dir / sub, dst / sub,
                        ignore=shutil.ignore_patterns("obj", "gen", "*.ninja", "rmsnorm_fwd"))
    return cpu_settings(dst)


@pytest.fixture
def build_copy(native_build, tmp_path) -> config.Settings:
    """Settings for a private copy of the build tree that a test may damage."""
    return copy_build(native_build, tmp_path / "build")


@pytest.fixture(scope="session")
def wheels(native_build, layout, tmp_path_factory) -> dict[str, BuildResult]:
    """Both variants, built once per session with a fixed SOURCE_DATE_EPOCH."""
    dist = tmp_path_factory.mktemp("dist")
    return {v: build(native_build, BuildOptions(variant=v, dist_dir=dist, source_date_epoch=EPOCH), layout=layout)
            for v in ("lite", "full")}
