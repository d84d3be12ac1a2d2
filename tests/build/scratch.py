"""A scratch copy of the native build inputs in a temporary git repository.

Tests that edit templates, run `make clean` or plant bad headers work on this
copy, never on the checkout under test.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
COPY = ["csrc", "jatools", "jax_aiter", "third_party", "scripts", "Makefile", "pyproject.toml"]


def make_scratch(dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for name in COPY:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__", "_lib"))
        elif src.exists():
            shutil.copy2(src, dest / name)
    git = ["git", "-C", str(dest), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "scratch"], check=True)
    return dest


def env_for(root: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("JA_BUILD_DIR", "GPU_ARCHS", "JA_FFI_INCLUDE_DIR")}
    env.update(JA_ROOT_DIR=str(root), JA_BACKEND="cpu", **extra)
    return env


def run(cmd: list[str], root: Path, env: dict[str, str] | None = None,
        check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, check=False, cwd=root, env=env or env_for(root), capture_output=True, text=True)
    if check and out.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    return out


def build_jit(root: Path, *args: str, env: dict[str, str] | None = None, check: bool = True):
    return run([sys.executable, "jax_aiter/jit/build_jit.py", *args], root, env, check)
