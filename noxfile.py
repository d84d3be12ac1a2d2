"""nox sessions: the build targets, tests, tooling checks and release as named sessions.

Sessions only wire jatools modules, make and pytest together; the logic lives
in those modules. `nox -l` lists them with these docstrings.
"""
from __future__ import annotations

import nox

nox.needs_version = ">=2024.4.15"
nox.options.default_venv_backend = "uv|venv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["tests", "ci_tooling", "lint"]

PY = "3.12"  # JAX 0.11+ needs Python 3.12
PYPROJECT = nox.project.load_toml("pyproject.toml")
# Development dependencies are PEP 735 groups in pyproject.toml, never extras of the wheel.
TEST_DEPS = ["-e", ".", *nox.project.dependency_groups(PYPROJECT, "test")]
TOOLING_DEPS = ["-e", ".", *nox.project.dependency_groups(PYPROJECT, "tooling")]
# What building the JIT libraries needs: ninja, and the pinned nvidia-cutlass headers of the sm_90a instances.
BUILD_DEPS = nox.project.dependency_groups(PYPROJECT, "build")


def _make(session: nox.Session, *targets: str) -> None:
    session.run("make", *targets, *session.posargs, external=True)


@nox.session(venv_backend="none", tags=["build"])
def umbrella(session: nox.Session) -> None:
    """Build the umbrella library build/jax_aiter_build/libjax_aiter.so (same as `make`)."""
    _make(session, "umbrella")


@nox.session(python=PY, tags=["build"])
def jit(session: nox.Session) -> None:
    """The JIT producer: build the JIT libraries into build/aiter_build (umbrella first; --module a,b after --)."""
    session.install(*BUILD_DEPS)
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
    """Native build (a consumer under CI=true: takes the JIT libraries, never builds them), then a test tier:
    `-- --tier pr|nightly|multigpu` or $JA_TEST_TIER (pr)."""
    _build_and_run_tier(session)


@nox.session(python=PY, tags=["test"])
def ci_tooling(session: nox.Session) -> None:
    """CPU-only tooling tests (manifest, tiers, CI driver, perf logs): no GPU, no native build."""
    session.install(*TOOLING_DEPS)
    session.run("pytest", "tests/tooling", "ci", *session.posargs)


@nox.session(python=PY, tags=["lint"])
def lint(session: nox.Session) -> None:
    """Static checks: ruff (pinned: a newer ruff brings new default rules) on the Python sources."""
    session.install("ruff==0.17.6")
    session.run("ruff", "check", "jax_aiter", "jatools", "ci", "tests", "noxfile.py", "tasks.py")


@nox.session(python=PY, tags=["build"], default=False)
def compile_only(session: nox.Session) -> None:
    """Compile every library for CUDA (nvcc, sm_90) and ROCm (hipcc, gfx90a) without a GPU."""
    session.install(*BUILD_DEPS)
    session.run("python", "-m", "jatools.native.build", "--compile-only", *session.posargs)


# --- test tiers (docs/testing.md): the tiers, their marker expressions and the runner live in
# jatools/testing/tiers.py ------------------------------------------------------------------------


def _build_and_run_tier(session: nox.Session, *tier: str) -> None:
    session.install(*TEST_DEPS, *BUILD_DEPS)
    # The JAX GPU plugin of the platform the tier runs on, at the tests' jax (none on the CPU or with --deps-from).
    plugins = session.run("python", "-m", "jatools.testing.tiers", "--plugin-requirements", *tier,
                          *session.posargs, silent=True)
    if plugins and plugins.split():
        session.install(*plugins.split())
    session.run("python", "-m", "jatools.native.build")
    session.run("python", "-m", "jatools.testing.tiers", *tier, *session.posargs)


@nox.session(python=PY, tags=["tiers"], default=False)
def tests_pr(session: nox.Session) -> None:
    """The pr tier: fast single-device tests (not slow, not multigpu); one xdist worker per GPU slot on a GPU host."""
    _build_and_run_tier(session, "--tier", "pr")


@nox.session(python=PY, tags=["tiers"], default=False)
def tests_nightly(session: nox.Session) -> None:
    """The nightly tier: the full suite, single-device run then the multi-device run."""
    _build_and_run_tier(session, "--tier", "nightly")


@nox.session(python=PY, tags=["tiers"], default=False)
def tests_multigpu(session: nox.Session) -> None:
    """The multigpu tier: sharded tests, unpinned and exclusive (CPU: 4 forced host devices)."""
    _build_and_run_tier(session, "--tier", "multigpu")


# --- CI: sanitizers (logic in jatools/native/sanitize.py; see docs/ci.md) -------------------------------
@nox.session(python=PY, tags=["test"], default=False)
def sanitize(session: nox.Session) -> None:
    """CPU libraries built with ASan+UBSan into build/sanitize, then the CPU op tests run against them (pytest args after --)."""
    session.install(*TEST_DEPS, *BUILD_DEPS)
    session.run("python", "-m", "jatools.native.sanitize", "--", *session.posargs)


@nox.session(python=PY, tags=["test"], default=False)
def tsan(session: nox.Session) -> None:
    """CPU libraries built with ThreadSanitizer into build/sanitize-thread, then every threaded CPU kernel driven from several threads (ci/sanitizers/tsan_driver.cpp)."""
    session.install(*TEST_DEPS, *BUILD_DEPS)
    session.run("python", "-m", "jatools.native.sanitize", "--sanitizer", "thread", *session.posargs)


# --- CI: convergence recipe (logic in ci/convergence/train_tiny.py; see docs/ci.md) ---------------
@nox.session(python=PY, tags=["test"], default=False)
def convergence(session: nox.Session) -> None:
    """Train a small LM with jax_aiter's kernels and with plain JAX; fail unless both reach the same loss (args after --)."""
    session.install(*TEST_DEPS)
    session.run("python", "ci/convergence/train_tiny.py", "--compare", *session.posargs)


# --- wheels (jatools/wheel/wheel_build.py; checks: jatools/wheel/wheel_checks.py) ---
WHEEL_DEPS = nox.project.dependency_groups(PYPROJECT, "wheel")


def _wheel(session: nox.Session, variant: str) -> None:
    """wheel_build.build(): the function the PEP 517 hook build_wheel (python -m build -C variant=...) calls."""
    session.install(*WHEEL_DEPS)
    session.run("python", "-m", "jatools.wheel.wheel_build", "--variant", variant, "--check", *session.posargs)


@nox.session(python=PY, tags=["wheel"], default=False)
def wheel_lite(session: nox.Session) -> None:
    """Build the lite wheel (public version, MHA JIT libraries fetched later) into dist/, then check floor and contents."""
    _wheel(session, "lite")


@nox.session(python=PY, tags=["wheel"], default=False)
def wheel_full(session: nox.Session) -> None:
    """Build the full wheel (version +full, with the MHA JIT libraries) into dist/, then check floor and contents."""
    _wheel(session, "full")


# --- the main job (jatools/release.py; upload: invoke release.upload) -------------------------
@nox.session(python=PY, tags=["release"], default=False)
def release(session: nox.Session) -> None:
    """Build, wheels, verify/floor/contents and clean-room validation of both wheels, then a summary and
    dist/release-report.json (-- --fetch-jit URL fetches the JIT libraries; -- --dry-run prints the plan)."""
    session.install(*TEST_DEPS, *BUILD_DEPS)
    session.run("python", "-m", "jatools.release", *session.posargs)


# --- benchmarks (jatools/bench; docs/benchmarks.md) --------------------------------------------
@nox.session(python=PY, tags=["bench"], default=False)
def bench(session: nox.Session) -> None:
    """Tooling benchmarks against the reference's tools: table + build/bench/results.json (-- --only NAME, --scale F; -- gpu: GPU kernels)."""
    gpu = session.posargs[:1] == ["gpu"]
    session.install("-e", ".", *nox.project.dependency_groups(PYPROJECT, *(("bench", "test") if gpu else ("bench",))))
    session.run("python", "-m", "jatools.bench", *session.posargs)
