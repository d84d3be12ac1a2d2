"""nox sessions: the build targets, tests, tooling checks and release as named sessions.

Sessions only wire jatools modules, make and pytest together; the logic lives
in those modules. `nox -l` lists them with these docstrings.
"""
from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import nox

# The checkout's tooling is not installed where nox runs: read it from here, so the sessions' Python and the test
# tiers come from their one home each.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from jatools.config import SettingError, build_path, python_version, read_pyproject
from jatools.native import tree_lock
from jatools.native.jit_packages import is_headers_only
from jatools.testing.jax_versions import ENDS as JAX_ENDS
from jatools.testing.jax_versions import JaxRangeError
from jatools.testing.jax_versions import declared as declared_jax
from jatools.testing.tag_filters import DEFAULT_TIER, TIER_ENV, TIERS
from jax_aiter.download.folder_lock import FolderLockError

nox.needs_version = ">=2024.4.15"
nox.options.default_venv_backend = "uv|venv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["tests", "ci_tooling", "lint"]

try:  # a pyproject.toml that cannot be read stops nox with one line naming it, not a traceback
    PY = python_version()  # the floor of pyproject's requires-python (JAX 0.11 needs 3.12)
    PYPROJECT = read_pyproject()
    # The build tree's lock for this whole nox run, its virtualenvs included (jatools/native/tree_lock.py): a second
    # nox, make or JIT build in this tree says which run it waits for, then waits; what this run starts goes on.
    if not {"-l", "--list", "--list-sessions", "--json", "-h", "--help", "--version"} & set(sys.argv[1:]):
        TREE_LOCK = tree_lock.hold("nox " + " ".join(sys.argv[1:]))
except (SettingError, FolderLockError) as e:
    sys.exit(f"nox: error: {e}")
# Development dependencies are PEP 735 groups in pyproject.toml, never extras of the wheel.
TEST_DEPS = ["-e", ".", *nox.project.dependency_groups(PYPROJECT, "test")]
TOOLING_DEPS = ["-e", ".", *nox.project.dependency_groups(PYPROJECT, "tooling")]
# What building the JIT libraries needs: ninja, and the pinned nvidia-cutlass headers of the sm_90a instances.
BUILD_DEPS = nox.project.dependency_groups(PYPROJECT, "build")
WHEEL_DEPS = nox.project.dependency_groups(PYPROJECT, "wheel")
SASS_DEPS = nox.project.dependency_groups(PYPROJECT, "sass")  # cuobjdump, for compile_only's check of the backward


def _install(session: nox.Session, *deps: str) -> None:
    """session.install(deps), the header-only packages among them (jit_packages.HEADERS_ONLY) with --no-deps."""
    rest = [d for d in deps if not is_headers_only(d)]
    session.install(*rest)
    if len(rest) < len(deps):
        session.install("--no-deps", *[d for d in deps if is_headers_only(d)])


def _session(name: str, tag: str, *argv: str, doc: str, deps: list[str] | None = None) -> None:
    """Register session `name`: install `deps`, then run `argv` and the arguments after `--`. Without `deps`,
    `argv` is an external command run with no virtualenv (make)."""
    def run(session: nox.Session) -> None:
        if deps is not None:
            _install(session, *deps)
        session.run(*argv, *session.posargs, external=True if deps is None else None)  # None: nox's default
    run.__doc__ = doc
    nox.session(run, name=name, python=None if deps is None else PY, venv_backend="none" if deps is None else None,
                tags=[tag])


def _install_gpu_plugin(session: nox.Session, *args: str) -> None:
    """Install the JAX GPU plugin of the platform the session runs on (JA_BACKEND, else the GPUs seen) at the test
    group's jax; none on the CPU or with --deps-from. run_install, not run: CI installs in a pass of its own
    (`--install-only`, where session.run does nothing) and then runs with `-R` (where installs are skipped)."""
    plugins = session.run_install("python", "-m", "jatools.testing.tiers", "--plugin-requirements", *args,
                                  silent=True)
    if plugins and plugins.split():
        session.install(*plugins.split())


def _tier_session(name: str, *tier: str, doc: str) -> None:
    """Register session `name`: the native build, then a test tier (docs/testing.md; the tiers, their marker
    expressions and the runner live in jatools/testing/tiers.py)."""
    def run(session: nox.Session) -> None:
        _install(session, *TEST_DEPS, *BUILD_DEPS)
        _install_gpu_plugin(session, *tier, *session.posargs)
        session.run("python", "-m", "jatools.native.build")
        session.run("python", "-m", "jatools.testing.tiers", *tier, *session.posargs)
    run.__doc__ = doc
    nox.session(run, name=name, python=PY, tags=["tiers" if tier else "test"])


_session("umbrella", "build", "make", "umbrella",
         doc="Build the umbrella library build/jax_aiter_build/libjax_aiter.so (same as `make`).")


@nox.session(python=PY, tags=["build"])
def jit(session: nox.Session) -> None:
    """The JIT producer: build the JIT libraries into build/aiter_build (umbrella first; --module a,b after --)."""
    _install(session, *BUILD_DEPS)
    # `make jit` (the umbrella, then jatools.native.jit_build) with this session's Python and the args after --.
    session.run("make", "--no-print-directory", "jit", "PYTHON=python", f"JIT_ARGS={shlex.join(session.posargs)}",
                external=True)


_session("ja_mods", "build", "make", "ja_mods",
         doc="Build the FFI shims, core and MHA, into build/jax_aiter_build (same as `make ja_mods`).")
_session("ja_mods_nomha", "build", "make", "ja_mods_nomha",
         doc="Build the core FFI shims only (rmsnorm_fwd, silu_and_mul) (same as `make ja_mods_nomha`).")
_tier_session("tests",
              doc="Native build (a consumer under CI=true: takes the JIT libraries, never builds them), "
                  f"then a test tier:\n    `-- --tier {'|'.join(TIERS)}` or ${TIER_ENV} ({DEFAULT_TIER}).")
_session("tests_lane", "test", "python", "-m", "jatools.lane_tier",
         doc="A test tier against a lane's validated wheel (`nox -s release` made it), installed into a fresh venv, "
             "never the build tree:\n    -- --lane cuda13 [--dist dist] [--tier pr] [pytest args].")


@nox.session(python=PY, tags=["test"])
@nox.parametrize("end", list(JAX_ENDS))
def jax_range(session: nox.Session, end: str) -> None:
    """The export round trip (tests/ops/test_export.py, and the sharded programs on 4 CPU devices) on each end of the
    JAX range pyproject declares, each in its own venv: `floor` (its lowest JAX) and `newest` (the newest release
    below its upper bound); docs/ci.md "JAX versions". Args after -- go to pytest."""
    try:
        jax = declared_jax().requirements(end)
    except JaxRangeError as e:
        session.error(str(e))
    _install(session, "-e", ".", *nox.project.dependency_groups(PYPROJECT, "tier"), *BUILD_DEPS, *jax)
    session.run("python", "-m", "jatools.native.build")
    results = ("--results-dir", str(build_path("test_results") / f"jax-{end}"))
    session.run("python", "-m", "jatools.testing.tiers", "--tier", "pr", *results, "tests/ops/test_export.py",
                *session.posargs)
    session.run("python", "-m", "jatools.testing.tiers", "--tier", "multigpu", *results,
                "tests/multigpu/test_export_sharded.py", *session.posargs)


_session("ci_local", "test", "python", "-m", "jatools.ci.act_local",
         deps=nox.project.dependency_groups(PYPROJECT, "ci-local"),
         doc="Every job of every workflow on this machine with act (host mode, the stand-ins in ci/act/): succeeded, "
             "failed or not runnable here (why); -- JOB... picks builds, WORKFLOW.yml:JOB or WORKFLOW.yml.")
_session("ci_tooling", "test", "pytest", "tests/tooling", "ci", deps=TOOLING_DEPS,
         doc="CPU-only tooling tests (manifest, tiers, CI driver, perf logs): no GPU, no native build.")


# The C++ and CUDA sources clang-format holds to .clang-format (git pathspecs; the JIT templates, *.inst.in, are not
# C++ until generated).
CXX_SOURCES = ["csrc/*.h", "csrc/*.cuh", "csrc/*.cu", "csrc/*.cpp", "csrc/*.inc", "benchmarks/gpu/*.cu",
               "benchmarks/gpu/*.cuh", "benchmarks/gpu/*.h"]


@nox.session(python=PY, tags=["lint"])
def lint(session: nox.Session) -> None:
    """Static checks (pinned: a newer tool brings new rules): ruff on the Python sources, clang-format's layout
    (.clang-format) on the C++ and CUDA sources."""
    session.install(*nox.project.dependency_groups(PYPROJECT, "lint"))
    session.run("ruff", "check", "jax_aiter", "jatools", "ci", "tests", "noxfile.py", "tasks.py", "benchmarks")
    cxx = subprocess.run(["git", "ls-files", "--", *CXX_SOURCES], capture_output=True, text=True, check=True).stdout
    session.run("clang-format", "--dry-run", "--Werror", *cxx.split())


_session("compile_only", "build", "python", "-m", "jatools.native.build", "--compile-only",
         deps=[*BUILD_DEPS, *SASS_DEPS],
         doc="Compile every library for CUDA (nvcc) and ROCm (hipcc; gfx90a for an old hipcc), each for its default "
             "archs (pyproject gpu_archs_cuda, gpu_archs_rocm), without a GPU; CUDA's sm_90a backward is then read "
             "for integer divisions in its main loop.")
for _tier in TIERS.values():  # jatools/testing/tag_filters.py: the tiers, their selections and what each is
    _tier_session(f"tests_{_tier.name}", "--tier", _tier.name, doc=f"The {_tier.name} tier ({_tier.doc}).")
# Sanitizers: jatools/native/sanitize.py; the convergence recipe: ci/convergence/train_tiny.py (docs/ci.md).
_session("sanitize", "test", "python", "-m", "jatools.native.sanitize", "--", deps=[*TEST_DEPS, *BUILD_DEPS],
         doc="CPU libraries built with ASan+UBSan into build/sanitize, then the CPU op tests run against them "
             "(pytest args after --).")
_session("tsan", "test", "python", "-m", "jatools.native.sanitize", "--sanitizer", "thread",
         deps=[*TEST_DEPS, *BUILD_DEPS],
         doc="CPU libraries built with ThreadSanitizer into build/sanitize-thread, then every threaded CPU kernel "
             "driven from several threads (ci/sanitizers/tsan_driver.cpp).")


@nox.session(python=PY, tags=["test"])
def convergence(session: nox.Session) -> None:
    """Train a small LM with jax_aiter's kernels and with plain JAX; fail unless both reach the same loss
    (args after --)."""
    session.install(*TEST_DEPS)
    _install_gpu_plugin(session)
    session.run("python", "-m", "ci.convergence.train_tiny", "--compare", *session.posargs)


# Wheels: wheel_build.build(), the function the PEP 517 hook build_wheel (python -m build -C variant=...) calls;
# the checks: jatools/wheel/wheel_checks.py.
for _variant, _what in (("lite", "public version, MHA JIT libraries fetched later"),
                        ("full", "version +full, with the MHA JIT libraries")):
    _session(f"wheel_{_variant}", "wheel", "python", "-m", "jatools.wheel.wheel_build", "--variant", _variant,
             "--check", deps=WHEEL_DEPS,
             doc=f"Build the {_variant} wheel ({_what}) into dist/, then check floor and contents.")
# The main job (jatools/release.py); upload: invoke release.upload.
_session("release", "release", "python", "-m", "jatools.release", deps=[*TEST_DEPS, *BUILD_DEPS],
         doc="Build, wheels, verify/floor/contents and clean-room validation of both wheels, then a summary and\n"
             "    dist/release-report.json (-- --fetch-jit URL fetches the JIT libraries; "
             "-- --dry-run prints the plan).")


@nox.session(python=PY, tags=["bench"])
def bench(session: nox.Session) -> None:
    """Tooling benchmarks against the reference's tools: table + build/bench/results.json
    (-- --only NAME, --scale F; -- gpu: GPU kernels)."""
    gpu = session.posargs[:1] == ["gpu"]
    session.install("-e", ".", *nox.project.dependency_groups(PYPROJECT, *(("bench", "test") if gpu else ("bench",))))
    if gpu:
        _install_gpu_plugin(session)
    session.run("python", "-m", "jatools.bench", *session.posargs)
