"""The CPU libraries built with AddressSanitizer and UndefinedBehaviorSanitizer, and the CPU op tests run against them.

Build: the ordinary targets (umbrella, JIT libraries, FFI shims) into
``build/sanitize`` with ``JA_BACKEND=cpu JA_SANITIZE=address,undefined``;
jatools.native.toolchain adds ``-fsanitize=...`` to the compile and link flags, so
the Makefile and build_jit.py build exactly what they always build.

Run: Python itself is not instrumented, so the ASan runtime must be the first
library in the process: ``LD_PRELOAD`` names the compiler's ``libasan.so`` (and
libstdc++, see :func:`preload`). pytest captures at the Python level only
(``--capture=sys``): a sanitizer report is written to file descriptor 2 by C
code just before the process aborts, and fd-level capture would swallow it.
The loader finds the sanitized libraries through ``JA_BUILD_DIR``. Every
sanitizer report aborts the test process (``halt_on_error``,
``-fno-sanitize-recover=all``), so a report can never pass unnoticed.
Suppressions are inputs kept in the repository (``ci/sanitizers/*.supp``), as
XLA keeps its ignore lists beside its sanitizer wrapper. Leak checking is off
in-process: CPython and jaxlib keep allocations alive until exit by design, and
LSan suppressions match any frame of a stack, so every leak report passes
through Python frames and cannot be told apart from ours.

    python3 -m jatools.native.sanitize [-j N] [-- PYTEST_ARGS...]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from jatools import atomic_write, config
from jatools.native.build import native_build

BUILD_DIR = "build/sanitize"
SANITIZERS = "address,undefined"
SUPPRESSION_DIR = Path("ci/sanitizers")
TEST_PATHS = ("tests/ops",)
MARKERS = "not gpu and not multigpu and not slow"
MHA_MODULES = {"mha_fwd", "mha_bwd"}


class SanitizeError(RuntimeError):
    """A step failed; the message names the step and the command that re-runs it."""


def build_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for the sanitized build: CPU backend, its own build folder, sanitizer flags."""
    env = dict(os.environ if base is None else base)
    env.update({"JA_BACKEND": "cpu", "JA_BUILD_DIR": BUILD_DIR, "JA_SANITIZE": SANITIZERS})
    env.pop("GPU_ARCHS", None)
    return env


def _runtime_library(cxx: str, name: str) -> Path:
    out = subprocess.run([cxx, f"-print-file-name={name}"], check=False, capture_output=True, text=True)
    path = Path(out.stdout.strip())
    if out.returncode != 0 or not path.is_absolute() or not path.exists():
        raise SanitizeError(f"{cxx} does not know its {name} ({out.stdout.strip() or out.stderr.strip()}); "
                            "install the sanitizer runtimes (apt-get install libasan8 libubsan1)")
    return path.resolve()


def preload(cxx: str = "g++") -> list[Path]:
    """Libraries an uninstrumented Python must preload: the ASan runtime first, then libstdc++.

    ASan intercepts ``__cxa_throw`` and resolves the real one when it starts;
    Python does not link libstdc++, so without it preloaded the first C++
    exception (jaxlib throws some while importing) aborts in the interceptor.
    """
    return [_runtime_library(cxx, "libasan.so"), _runtime_library(cxx, "libstdc++.so")]


def runtime_env(root: Path, base: dict[str, str], cxx: str = "g++") -> dict[str, str]:
    """Environment for a Python process that loads sanitized libraries."""
    supp = (root / SUPPRESSION_DIR).resolve()
    common = "halt_on_error=1:print_stacktrace=1"
    env = dict(base)
    env.update({
        "LD_PRELOAD": " ".join([*map(str, preload(cxx)), *filter(None, [base.get("LD_PRELOAD")])]),
        "ASAN_OPTIONS": f"suppressions={supp / 'asan.supp'}:{common}:detect_leaks=0:use_sigaltstack=0:"
                        "detect_stack_use_after_return=1:strict_init_order=1:check_initialization_order=1",
        "UBSAN_OPTIONS": f"suppressions={supp / 'ubsan.supp'}:{common}",
        "LSAN_OPTIONS": f"suppressions={supp / 'lsan.supp'}",
        "JAX_PLATFORMS": "cpu",
    })
    return env


def shim_target(settings: config.Settings) -> str:
    """`ja_mods` when the JIT config builds the MHA libraries, else `ja_mods_nomha` (said aloud, not silent)."""
    modules = set(json.loads(settings.jit_config.read_text())["modules"])
    return "ja_mods" if MHA_MODULES <= modules else "ja_mods_nomha"


def _step(name: str, cmd: list[str], env: dict[str, str], root: Path, times: dict[str, float]) -> None:
    print(f"sanitize: [{name}] $ {' '.join(cmd)}", flush=True)
    start = time.monotonic()
    rc = subprocess.call(cmd, cwd=root, env=env)
    times[name] = round(time.monotonic() - start, 2)
    if rc != 0:
        rerun = "JA_BACKEND=cpu JA_BUILD_DIR=build/sanitize JA_SANITIZE=address,undefined " + " ".join(cmd)
        raise SanitizeError(f"step {name} failed (exit {rc}); re-run it with: {rerun}"
                            + ("; a sanitizer report above names the fault" if name == "tests" else ""))


def run(pytest_args: list[str], jobs: int, python: str = sys.executable) -> dict:
    root = config.repo_root()
    env = build_env()
    settings = config.load(env=env)
    shims = shim_target(settings)
    if shims != "ja_mods":
        print(f"sanitize: {settings.jit_config.name} has no {'/'.join(sorted(MHA_MODULES))} modules; "
              "building the core shims only (make ja_mods_nomha)", flush=True)
    try:  # its own build folder: the sanitizer build is always a producer
        times: dict[str, float] = native_build(jit="build", shims=shims, jobs=jobs, env=env, python=python)
    except subprocess.CalledProcessError as e:
        rerun = "JA_BACKEND=cpu JA_BUILD_DIR=build/sanitize JA_SANITIZE=address,undefined " + " ".join(map(str, e.cmd))
        raise SanitizeError(f"the sanitizer build failed at `{' '.join(map(str, e.cmd))}` (exit {e.returncode}); "
                            f"re-run it with: {rerun}") from None
    test_env = runtime_env(root, env, env.get("CXX", "g++"))
    args = ["--capture=sys", *(pytest_args or [*TEST_PATHS, "-m", MARKERS, "-q"])]
    _step("tests", [python, "-m", "pytest", *args], test_env, root, times)
    summary = {"sanitizers": SANITIZERS, "build_dir": BUILD_DIR, "shims": shims, "pytest_args": args,
               "seconds": times, "total_seconds": round(sum(times.values()), 2)}
    atomic_write.write_text(root / BUILD_DIR / "summary.json", json.dumps(summary, indent=2) + "\n")
    print("sanitize: clean; " + ", ".join(f"{k} {v:.1f} s" for k, v in times.items())
          + f"; total {summary['total_seconds']:.1f} s (build/sanitize/summary.json)", flush=True)
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m jatools.native.sanitize", description=__doc__.splitlines()[0])
    p.add_argument("-j", "--jobs", type=int, default=min(os.cpu_count() or 1, 2), help="parallel compile jobs")
    p.add_argument("pytest_args", nargs=argparse.REMAINDER, help="pytest arguments after -- (default: CPU op tests)")
    args = p.parse_args(argv)
    extra = args.pytest_args[1:] if args.pytest_args[:1] == ["--"] else args.pytest_args
    try:
        run(extra, args.jobs)
    except (SanitizeError, ValueError) as e:
        print(f"sanitize: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
