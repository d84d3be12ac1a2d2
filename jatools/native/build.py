"""The native build, written once: umbrella library -> JIT libraries -> FFI shims.

    python -m jatools.native.build [--jit auto|build|take] [--shims ja_mods|ja_mods_nomha] [-j N]

Every caller (the nox test and release sessions, compile-only, the sanitizer
build, the GPU host scripts) runs this sequence through `native_build`; only
the environment differs (JA_BACKEND, GPU_ARCHS, JA_BUILD_DIR, JA_SANITIZE).

The JIT step either builds (the producer, or a local run: printed) or takes
the libraries already in build/aiter_build (a consumer: `invoke jit.fetch`
put them there). A consumer never builds: when the libraries there do not
match this checkout's identity it fails at once, naming the cache id and the
producer. `--jit auto` (the default, JA_JIT_LIBS / pyproject jit_libs) takes
under CI=true and builds otherwise.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from jatools import config
from jatools.jitlibs import jit_cache

JIT_MODES = ("auto", "build", "take")


def jit_mode(requested: str | None, env: dict[str, str]) -> str:
    """build or take: the flag, else JA_JIT_LIBS, else pyproject's jit_libs; auto means take under CI=true."""
    mode = (requested or env.get("JA_JIT_LIBS") or str(config.defaults()["jit_libs"])).strip().lower()
    if mode not in JIT_MODES:
        raise SystemExit(f"native build: JA_JIT_LIBS={mode!r} is not one of {', '.join(JIT_MODES)}")
    if mode == "auto":
        return "take" if config.truthy(env.get("CI", "")) else "build"
    return mode


def _step(name: str, cmd: list[str], env: dict[str, str], root: Path, times: dict[str, float]) -> None:
    print(f"native build: {name}: $ {' '.join(cmd)}", flush=True)
    start = time.monotonic()
    subprocess.run(cmd, cwd=root, env=env, check=True)
    times[name] = round(time.monotonic() - start, 1)


def native_build(*, jit: str | None = None, shims: str = "ja_mods", jobs: int | None = None,
                 env: dict[str, str] | None = None, python: str = sys.executable) -> dict[str, float]:
    """Build the umbrella, then build or take the JIT libraries, then the FFI shims; seconds per step."""
    env = dict(os.environ if env is None else env)
    root = config.repo_root()
    env.setdefault("JA_ROOT_DIR", str(root))
    mode = jit_mode(jit, env)
    jflag = [f"-j{jobs}"] if jobs else []
    times: dict[str, float] = {}
    if mode == "take":  # before anything compiles: a miss costs seconds, not a build
        settings = config.load(env=env)
        start = time.monotonic()
        jit_cache.require_built(settings)
        times["jit (taken)"] = round(time.monotonic() - start, 1)
    _step("umbrella", ["make", *jflag, "umbrella"], env, root, times)
    if mode == "build":
        print("native build: building the JIT libraries here (JA_JIT_LIBS=take makes a consumer of this run)",
              flush=True)
        _step("jit", [python, "-m", "jatools.native.jit_build", *(["-j", str(jobs)] if jobs else [])], env, root,
              times)
    _step(shims, ["make", *jflag, shims], env, root, times)
    return times


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m jatools.native.build", description=__doc__.splitlines()[0])
    p.add_argument("--jit", choices=JIT_MODES, help="build or take the JIT libraries (default: JA_JIT_LIBS, "
                   "else pyproject jit_libs: auto = take under CI=true)")
    p.add_argument("--shims", default="ja_mods", choices=("ja_mods", "ja_mods_nomha"))
    p.add_argument("-j", "--jobs", type=int)
    p.add_argument("--check-taken", action="store_true",
                   help="only check that build/aiter_build holds this checkout's JIT libraries (a consumer's step)")
    a = p.parse_args(argv)
    try:
        if a.check_taken:
            jit_cache.require_built(config.load())
            return 0
        times = native_build(jit=a.jit, shims=a.shims, jobs=a.jobs)
    except jit_cache.JitCacheError as e:
        print(f"native build: error: {e}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as e:
        print(f"native build: `{' '.join(map(str, e.cmd))}` failed (exit {e.returncode})", file=sys.stderr)
        return 1
    print("native build: " + ", ".join(f"{k} {v} s" for k, v in times.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
