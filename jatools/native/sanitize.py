"""The CPU libraries built with a sanitizer, and checked under it: ASan + UBSan (`nox -s sanitize`) or
ThreadSanitizer (`nox -s tsan`); docs/ci.md ("Sanitizers") says why each choice below is made.

The ordinary targets are built through the one native build (jatools.native.build) into the sanitizer's own
folder with ``JA_BACKEND=cpu JA_SANITIZE=...``; jatools.native.toolchain adds ``-fsanitize=...`` to the
compile and link flags. ASan + UBSan then run the CPU op tests in an uninstrumented Python: the runtime is
preloaded (:func:`preload`), pytest captures at the Python level only (``--capture=sys``, so a report on
fd 2 just before the abort is not swallowed), leak checking is off in-process. ThreadSanitizer runs
ci/sanitizers/tsan_driver.cpp instead (jaxlib is not instrumented, so TSan inside Python reports jaxlib's
races): every threaded CPU kernel from four threads at once with four inner threads each. Every report
aborts; suppressions are kept in ci/sanitizers/*.supp.

    python3 -m jatools.native.sanitize [--sanitizer address|thread] [-j N] [-- PYTEST_ARGS...]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from jatools import atomic_write, config, steps
from jatools.native import jit_build, toolchain
from jatools.native.build import native_steps

SUPPRESSION_DIR = Path("ci/sanitizers")
TSAN_DRIVER = SUPPRESSION_DIR / "tsan_driver.cpp"
TSAN_THREADS = "4"  # the driver's inner threads (JA_NUM_THREADS); it sets them itself


@dataclass(frozen=True)
class Sanitizer:
    """One sanitizer build: its JA_SANITIZE value and its build tree (config.BUILD_TREE's `tree`)."""

    name: str
    flags: str
    tree: str

    @property
    def build_dir(self) -> str:
        """The tree as JA_BUILD_DIR names it for the build, relative to the checkout (build/sanitize)."""
        return config.build_path(self.tree).as_posix()


SANITIZER_KINDS = {s.name: s for s in (Sanitizer("address", "address,undefined", "sanitize"),
                                       Sanitizer("thread", "thread", "sanitize_thread"))}
ASAN = SANITIZER_KINDS["address"]
SANITIZERS = ASAN.flags
TEST_PATHS = ("tests/ops",)
MARKERS = "not gpu and not multigpu and not slow"


class SanitizeError(RuntimeError):
    """The sanitizer run cannot go on; the message names the step or the missing piece and the fix."""


def build_env(base: dict[str, str] | None = None, kind: Sanitizer = ASAN) -> dict[str, str]:
    """Environment for the sanitized build: CPU backend, its own build folder, sanitizer flags."""
    env = dict(os.environ if base is None else base)
    env.update({"JA_BACKEND": "cpu", "JA_BUILD_DIR": kind.build_dir, "JA_SANITIZE": kind.flags})
    env.pop("GPU_ARCHS", None)
    return env


def preload(cxx: str = "g++") -> list[Path]:
    """Libraries an uninstrumented Python must preload: the ASan runtime first, then libstdc++.

    ASan intercepts ``__cxa_throw`` and resolves the real one when it starts; Python does not link
    libstdc++, so without it preloaded the first C++ exception (jaxlib throws some while importing)
    aborts in the interceptor.
    """
    found = []
    for name in ("libasan.so", "libstdc++.so"):
        out = subprocess.run([cxx, f"-print-file-name={name}"], check=False, capture_output=True, text=True)
        path = Path(out.stdout.strip())
        if out.returncode != 0 or not path.is_absolute() or not path.exists():
            raise SanitizeError(f"{cxx} does not know its {name} ({out.stdout.strip() or out.stderr.strip()}); "
                                "install the sanitizer runtimes (apt-get install libasan8 libubsan1)")
        found.append(path.resolve())
    return found


def runtime_env(root: Path, base: dict[str, str], cxx: str = "g++") -> dict[str, str]:
    """Environment for a Python process that loads sanitized libraries."""
    supp = (root / SUPPRESSION_DIR).resolve()
    common = "halt_on_error=1:print_stacktrace=1"
    return {**base, "LD_PRELOAD": " ".join([*map(str, preload(cxx)), *filter(None, [base.get("LD_PRELOAD")])]),
            "ASAN_OPTIONS": f"suppressions={supp / 'asan.supp'}:{common}:detect_leaks=0:use_sigaltstack=0:"
                            "detect_stack_use_after_return=1:strict_init_order=1:check_initialization_order=1",
            "UBSAN_OPTIONS": f"suppressions={supp / 'ubsan.supp'}:{common}",
            "LSAN_OPTIONS": f"suppressions={supp / 'lsan.supp'}", "JAX_PLATFORMS": "cpu"}


def tsan_env(root: Path, base: dict[str, str]) -> dict[str, str]:
    """Environment for the ThreadSanitizer driver: every report aborts, suppressions from the repository."""
    supp = (root / SUPPRESSION_DIR / "tsan.supp").resolve()
    return {**base, "TSAN_OPTIONS": f"suppressions={supp}:halt_on_error=1:abort_on_error=0:exitcode=66:"
                                    "second_deadlock_stack=1:history_size=4"}


def tsan_driver_command(settings: config.Settings, out: Path) -> list[str]:
    """Compile and link ci/sanitizers/tsan_driver.cpp with the build's own flags against its libraries."""
    tc = toolchain.detect(settings)
    libs = [settings.jit_dir, settings.umbrella_dir]
    return [tc.cxx, *toolchain.compile_flags(tc, settings)["cxx"], str(TSAN_DRIVER), "-o", str(out),
            *(f"-L{d}" for d in libs), *(f"-l{module}" for module in jit_build.libraries(settings)), "-ljax_aiter",
            "-fsanitize=thread", "-lpthread", *(f"-Wl,-rpath,{d.resolve()}" for d in libs)]


def run(pytest_args: list[str], jobs: int, kind: Sanitizer = ASAN) -> dict:
    root = config.repo_root()
    env = build_env(kind=kind)
    settings = config.load(env=env)
    # Its own build folder: the sanitizer build is always a producer (of every op: the JIT build refuses a
    # JIT config that leaves out a module the op table names).
    shims = "ja_mods"
    todo = native_steps(jit="build", shims=shims, jobs=jobs, env=env)
    if kind.name == "thread":
        driver = root / kind.build_dir / "tsan_driver"
        todo += [steps.Step("driver build", lambda: tsan_driver_command(settings, driver), env, root),
                 steps.Step("driver", [str(driver)], tsan_env(root, env), root)]
        checked = {"driver": str(TSAN_DRIVER), "inner_threads": TSAN_THREADS}
    else:
        args = ["--capture=sys", *(pytest_args or [*TEST_PATHS, "-m", MARKERS, "-q"])]
        todo.append(steps.Step("tests", [sys.executable, "-m", "pytest", *args],
                               runtime_env(root, env, env.get("CXX", "g++")), root))
        checked = {"pytest_args": args}
    try:
        records = steps.run(todo, "sanitize")
    except steps.StepFailed as e:
        found = e.record.name in ("tests", "driver")
        raise SanitizeError(f"{e}" + ("\n  a sanitizer report above names the fault" if found else "")) from None
    times = steps.seconds(records)
    summary = {"sanitizers": kind.flags, "build_dir": kind.build_dir, "shims": shims, **checked,
               "seconds": times, "total_seconds": round(sum(times.values()), 2)}
    atomic_write.write_text(root / kind.build_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    print(f"sanitize: clean; {steps.timing_line(records)} ({kind.build_dir}/summary.json)", flush=True)
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m jatools.native.sanitize", description=__doc__.splitlines()[0])
    p.add_argument("-j", "--jobs", type=int, default=min(os.cpu_count() or 1, 2), help="parallel compile jobs")
    p.add_argument("--sanitizer", choices=tuple(SANITIZER_KINDS), default="address",
                   help="address: ASan+UBSan, CPU op tests in Python (nox -s sanitize); thread: ThreadSanitizer, "
                        "the threaded kernels' driver (nox -s tsan)")
    p.add_argument("pytest_args", nargs=argparse.REMAINDER, help="pytest arguments after -- (default: CPU op tests)")
    args = p.parse_args(argv)
    extra = args.pytest_args[1:] if args.pytest_args[:1] == ["--"] else args.pytest_args
    try:
        run(extra, args.jobs, kind=SANITIZER_KINDS[args.sanitizer])
    except (SanitizeError, ValueError) as e:
        print(f"sanitize: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
