"""The native build, written once: umbrella library -> JIT libraries -> FFI shims.

    python -m jatools.native.build [--jit auto|build|take] [--shims ja_mods|ja_mods_nomha] [-j N]
    python -m jatools.native.build --compile-only [--backend cuda,rocm] [-j N]      (nox -s compile_only)

Every caller (the nox test and release sessions, compile-only, the sanitizer build, the GPU host
scripts) runs this sequence through `native_steps`; only the environment differs. The JIT step builds
(the producer, or a local run) or takes the libraries `invoke jit.fetch` put in build/aiter_build (a
consumer, which never builds: a mismatch with this checkout's identity fails at once, naming the cache
id and the producer); `--jit auto` takes under CI=true. `--compile-only` builds every library for the
GPU backends without a GPU (each backend's archs, pyproject gpu_archs_<backend>: CUDA with nvcc; ROCm with the HIP
compiler, or gfx90a where it knows no gfx950, as Debian's ROCm 5.2 `hipcc`) into build/compile_only/<backend>, each
its own JIT producer, reads CUDA's sm_90a backward for integer divisions in its main loops (sass_check.py), and
writes
build/compile_only/summary.json (docs/build.md, "Compile-only").
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

from jatools import atomic_write, config, steps
from jatools.jitlibs import decide, record
from jatools.native import compiler_cache, jit_modules, sass_check, toolchain

# Each backend's archs are its default ones (pyproject gpu_archs_<backend>, the lanes' archs); ROCm falls back to
# gfx90a where the HIP compiler knows no gfx950 (Debian's ROCm 5.x hipcc; rocm_compile_arch asks the compiler).
COMPILE_ONLY = {
    "cuda": {"tool": "nvcc", "install": "install the CUDA toolkit (nvcc) or set CUDA_HOME"},
    "rocm": {"fallback": "gfx90a", "tool": "hipcc", "install": "apt-get install hipcc (or install ROCm/TheRock)"},
}


def default_archs(backend: str) -> str:
    """The backend's archs from their one home (pyproject gpu_archs_<backend>), `;` separated."""
    return ";".join(config.load(env={}).default_archs(backend))


def jit_mode(requested: str | None, env: dict[str, str]) -> str:
    """build or take: the flag, else JA_JIT_LIBS, else pyproject's jit_libs; auto means take under CI=true."""
    mode = (requested or env.get("JA_JIT_LIBS") or str(config.defaults()["jit_libs"])).strip().lower()
    if mode not in config.JIT_MODES:
        raise SystemExit(f"native build: JA_JIT_LIBS={mode!r} is not one of {', '.join(config.JIT_MODES)}")
    if mode == "auto":
        return "take" if config.truthy(env.get("CI", "")) else "build"
    return mode


def resolved_backend(env: dict[str, str]) -> dict[str, str]:
    """JA_BACKEND (and GPU_ARCHS, unless set) as `auto` resolves now, for every step of one run: each step resolving
    it again let a toolchain that appeared mid-run make the JIT step CUDA and ja_mods ROCm. {} when the backend is
    named already."""
    settings = config.load(env=env)
    if settings.backend != "auto":
        return {}
    tc = toolchain.detect(settings, env=env)
    print(f"native build: {tc.how[-1]}; every step of this run builds for it", flush=True)
    return {"JA_BACKEND": tc.backend, **({"GPU_ARCHS": ";".join(tc.archs)} if tc.archs and not settings.gpu_archs
                                        else {})}


def native_steps(*, jit: str | None = None, shims: str = "ja_mods", jobs: int | None = None,
                 env: dict[str, str] | None = None) -> list[steps.Step]:
    """The umbrella, then the JIT libraries built or taken, then the FFI shims, as steps for jatools.steps.run."""
    env = dict(os.environ if env is None else env)
    root = config.repo_root()
    env.setdefault("JA_ROOT_DIR", str(root))
    env.update(resolved_backend(env))
    mode = jit_mode(jit, env)
    jflag = [f"-j{jobs}"] if jobs else []
    step = lambda name, argv: steps.Step(name, argv, env, root)
    out = []
    if mode == "take":  # before anything compiles: a miss costs seconds, not a build
        out.append(step("jit (taken)", [sys.executable, "-m", "jatools.native.build", "--check-taken"]))
    out.append(step("umbrella", ["make", *jflag, "umbrella"]))
    if mode == "build":
        print("native build: building the JIT libraries here (JA_JIT_LIBS=take makes a consumer of this run)",
              flush=True)
        out.append(step("jit", [sys.executable, "-m", "jatools.native.jit_build",
                                *(["-j", str(jobs)] if jobs else [])]))
    return [*out, step(shims, ["make", *jflag, shims])]


def rocm_compile_arch(hipcc: str) -> str:
    """COMPILE_ONLY's ROCm arch if `hipcc` compiles for it (toolchain.rocm_arch_refusal, the probe the build's own
    arch check runs), else the fallback (said so)."""
    spec, archs = COMPILE_ONLY["rocm"], default_archs("rocm")
    refused = [r for a in config.split_archs(archs) if (r := toolchain.rocm_arch_refusal(hipcc, a, {})) is not None]
    if not refused:
        return archs
    print(f"compile_only: {hipcc} does not compile for {archs} ({refused[0]}); compiling for "
          f"{spec['fallback']} instead", flush=True)
    return spec["fallback"]


def compile_only(backend: str, jobs: int) -> dict:
    """One GPU backend's libraries built into build/compile_only/<backend>; its summary entry."""
    spec = COMPILE_ONLY[backend]
    if not shutil.which(spec["tool"]) and not (backend == "rocm" and os.environ.get("ROCM_PATH")):
        raise SystemExit(f"compile_only: {spec['tool']} not found for the {backend} backend; {spec['install']}")
    root = config.repo_root()
    out_dir = (config.build_path("compile_only") / backend).as_posix()
    hipcc = shutil.which("hipcc") or str(Path(os.environ.get("ROCM_PATH", ""), "bin", "hipcc"))
    archs = rocm_compile_arch(hipcc) if backend == "rocm" else default_archs(backend)
    env = {**os.environ, "JA_BACKEND": backend, "GPU_ARCHS": archs, "JA_BUILD_DIR": out_dir,
           "JA_ROOT_DIR": str(root)}
    if backend == "rocm":
        env.setdefault("HIP_PLATFORM", "amd")
    records = steps.run(native_steps(jit="build", jobs=jobs, env=env), f"compile_only {backend}")
    return {"backend": backend, "archs": archs, "seconds": steps.seconds(records),
            "libraries": {p.name: p.stat().st_size for p in sorted((root / out_dir).glob("*/*.so"))},
            **({"sass_check": backward_sass(env)} if backend == "cuda" else {})}


def backward_sass(env: dict[str, str]) -> dict:
    """The CUDA build's sm_90a backward read for integer divisions in its main loops (sass_check); exit 1 naming
    each where one is."""
    settings = config.load(env=env)
    lib = settings.jit_dir / jit_modules.module_table(settings)["mha_bwd"]["library"]
    try:
        loops = sass_check.check([lib])
    except sass_check.SassError as e:
        raise SystemExit(str(e)) from None
    text, ok = sass_check.report(loops)
    print(text, flush=True)
    if not ok:
        raise SystemExit(1)
    return {"kernels": len(loops), "longest_loop": max(loop.instructions for loop in loops)}


def compile_only_main(backends: str, jobs: int) -> int:
    results = []
    for backend in [b.strip() for b in backends.split(",") if b.strip()]:
        if backend not in COMPILE_ONLY:
            raise SystemExit(f"compile_only: unknown backend {backend!r}; use cuda and/or rocm")
        results.append(compile_only(backend, jobs))
    summary = config.build_path("compile_only") / "summary.json"
    atomic_write.write_text(config.repo_root() / summary,
                            json.dumps(results, indent=2) + "\n")
    print("\ncompile_only summary")
    for r in results:
        sizes = ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in r["libraries"].items())
        print(f"  {r['backend']:<5} {r['archs']:<7} {sum(r['seconds'].values()):7.1f} s  "
              f"({', '.join(f'{k} {v} s' for k, v in r['seconds'].items())})\n        {sizes}")
    print(f"  JSON: {summary}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m jatools.native.build", description=__doc__.splitlines()[0])
    p.add_argument("--jit", choices=config.JIT_MODES, help="build or take the JIT libraries (default: JA_JIT_LIBS, "
                   "else pyproject jit_libs: auto = take under CI=true)")
    p.add_argument("--shims", default="ja_mods", choices=("ja_mods", "ja_mods_nomha"))
    p.add_argument("-j", "--jobs", type=int, help="parallel jobs (default: make's own; --compile-only: every CPU)")
    p.add_argument("--check-taken", action="store_true",
                   help="only check that build/aiter_build holds this checkout's JIT libraries (a consumer's step)")
    p.add_argument("--compile-only", action="store_true",
                   help="compile every library for the GPU backends (--backend) without a GPU")
    p.add_argument("--backend", default="cuda,rocm", help="with --compile-only: comma-separated, cuda and/or rocm")
    a = p.parse_args(argv)
    try:
        if a.check_taken:
            decide.require_built(config.load())
            return 0
        if a.compile_only:
            return compile_only_main(a.backend, a.jobs or os.cpu_count() or 2)
        since = compiler_cache.log_offset(config.load())
        records = steps.run(native_steps(jit=a.jit, shims=a.shims, jobs=a.jobs), "native build")
    except record.JitCacheError as e:
        print(f"native build: error: {e}", file=sys.stderr)
        return 2
    except steps.StepFailed as e:
        print(e, file=sys.stderr)
        return e.record.exit or 1
    print(f"native build: {steps.timing_line(records)}", flush=True)
    print(compiler_cache.summary(config.load(), since, "native build"), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
