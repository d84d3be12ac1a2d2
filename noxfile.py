"""nox sessions: the build targets, tests, tooling checks and release as named sessions.

Sessions only wire jatools modules, make and pytest together; the logic lives
in those modules. `nox -l` lists them with these docstrings.
"""
from __future__ import annotations

import os

import nox

nox.needs_version = ">=2024.4.15"
nox.options.default_venv_backend = "uv|venv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["tests", "ci_tooling", "lint"]

PY = "3.12"  # JAX 0.11+ needs Python 3.12
TEST_DEPS = ["-e", ".[test]"]
TOOLING_DEPS = ["-e", ".[tooling]"]


def _make(session: nox.Session, *targets: str) -> None:
    session.run("make", *targets, *session.posargs, external=True)


@nox.session(venv_backend="none", tags=["build"])
def umbrella(session: nox.Session) -> None:
    """Build the umbrella library build/jax_aiter_build/libjax_aiter.so (same as `make`)."""
    _make(session, "umbrella")


@nox.session(python=PY, tags=["build"])
def jit(session: nox.Session) -> None:
    """Build the JIT libraries into build/aiter_build (build_jit.py; pass --module a,b after --)."""
    session.install("ninja")
    session.run("make", "umbrella", external=True)
    session.run("python", "jax_aiter/jit/build_jit.py", *session.posargs)


@nox.session(venv_backend="none", tags=["build"])
def ja_mods(session: nox.Session) -> None:
    """Build the FFI shims, core and MHA, into build/jax_aiter_build (same as `make ja_mods`)."""
    _make(session, "ja_mods")


@nox.session(venv_backend="none", tags=["build"])
def ja_mods_nomha(session: nox.Session) -> None:
    """Build the core FFI shims only (rmsnorm_fwd, silu_and_mul) (same as `make ja_mods_nomha`)."""
    _make(session, "ja_mods_nomha")


@nox.session(python=PY, tags=["test"])
def tests(session: nox.Session) -> None:
    """Build what is out of date, then run the test suite (pytest args after --)."""
    session.install(*TEST_DEPS, "ninja")
    session.run("make", "umbrella", external=True)
    session.run("python", "jax_aiter/jit/build_jit.py")
    session.run("make", "ja_mods", external=True)
    session.run("pytest", *session.posargs)


@nox.session(python=PY, tags=["test"])
def ci_tooling(session: nox.Session) -> None:
    """CPU-only tooling tests (manifest, tiers, CI driver, perf logs): no GPU, no native build."""
    session.install(*TOOLING_DEPS)
    session.run("pytest", "tests/tooling", *session.posargs)


@nox.session(python=PY, tags=["lint"])
def lint(session: nox.Session) -> None:
    """Static checks: ruff on the Python sources."""
    session.install("ruff")
    session.run("ruff", "check", "jax_aiter", "jatools", "ci", "tests", "noxfile.py", "tasks.py")


@nox.session(venv_backend="none", tags=["build"], default=False)
def compile_only(session: nox.Session) -> None:
    """Compile every library for CUDA (nvcc, sm_90) and ROCm (hipcc, gfx90a) without a GPU."""
    session.run("python3", "-m", "jatools.compile_only", *session.posargs, external=True)


# --- wheels (jatools/wheel_build.py; checks: jatools/wheel_floor.py, jatools/wheel_contents.py) ---
WHEEL_DEPS = nox.project.load_toml("pyproject.toml")["project"]["optional-dependencies"]["wheel"]


def _wheel(session: nox.Session, variant: str) -> None:
    session.install(*WHEEL_DEPS)
    session.run("python", "-m", "jatools.wheel_build", "--variant", variant, "--check", *session.posargs)


@nox.session(python=PY, tags=["wheel"], default=False)
def wheel_lite(session: nox.Session) -> None:
    """Build the lite wheel (public version, MHA JIT libraries fetched later) into dist/, then check floor and contents."""
    _wheel(session, "lite")


@nox.session(python=PY, tags=["wheel"], default=False)
def wheel_full(session: nox.Session) -> None:
    """Build the full wheel (version +full, with the MHA JIT libraries) into dist/, then check floor and contents."""
    _wheel(session, "full")
