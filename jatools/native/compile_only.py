"""Compile every library for the GPU backends on a machine without a GPU.

    python3 -m jatools.native.compile_only [--backend cuda,rocm] [-j N]

CUDA builds for sm_90 with nvcc; ROCm builds for gfx90a with the HIP compiler
(Debian's ROCm 5.2 `hipcc` knows gfx90a and gfx940, not gfx950). Each backend
builds into build/compile_only/<backend> through the same make targets and
build_jit.py as a real build, so the compile-only session proves the exact
sources and flags users build. Prints a summary and writes
build/compile_only/summary.json.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from jatools import config
from jatools.native.build import native_build

TARGETS = {
    "cuda": {"GPU_ARCHS": "sm_90", "tool": "nvcc", "install": "install the CUDA toolkit (nvcc) or set CUDA_HOME"},
    "rocm": {"GPU_ARCHS": "gfx90a", "tool": "hipcc", "install": "apt-get install hipcc (or install ROCm/TheRock)"},
}


def build_backend(backend: str, root: Path, jobs: int) -> dict:
    spec = TARGETS[backend]
    if not shutil.which(spec["tool"]) and not (backend == "rocm" and os.environ.get("ROCM_PATH")):
        raise SystemExit(f"compile_only: {spec['tool']} not found for the {backend} backend; {spec['install']}")
    out_dir = f"build/compile_only/{backend}"
    env = {**os.environ, "JA_BACKEND": backend, "GPU_ARCHS": spec["GPU_ARCHS"], "JA_BUILD_DIR": out_dir,
           "JA_ROOT_DIR": str(root)}
    if backend == "rocm":
        env.setdefault("HIP_PLATFORM", "amd")
    times = native_build(jit="build", jobs=jobs, env=env)  # a compile-only build is its own producer
    libs = sorted((root / out_dir).glob("*/*.so"))
    return {"backend": backend, "archs": spec["GPU_ARCHS"], "seconds": {k: round(v, 1) for k, v in times.items()},
            "libraries": {p.name: p.stat().st_size for p in libs}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="cuda,rocm", help="comma-separated: cuda, rocm")
    p.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 2)
    args = p.parse_args(argv)
    root = config.repo_root()
    results = []
    for backend in [b.strip() for b in args.backend.split(",") if b.strip()]:
        if backend not in TARGETS:
            raise SystemExit(f"compile_only: unknown backend {backend!r}; use cuda and/or rocm")
        try:
            results.append(build_backend(backend, root, args.jobs))
        except subprocess.CalledProcessError as e:
            print(f"compile_only: the {backend} build failed at `{' '.join(e.cmd)}` (exit {e.returncode})",
                  file=sys.stderr)
            return 1
    summary = root / "build/compile_only/summary.json"
    summary.parent.mkdir(parents=True, exist_ok=True)
    summary.write_text(json.dumps(results, indent=2) + "\n")
    print("\ncompile_only summary")
    for r in results:
        total = sum(r["seconds"].values())
        sizes = ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in r["libraries"].items())
        print(f"  {r['backend']:<5} {r['archs']:<7} {total:7.1f} s  ({', '.join(f'{k} {v} s' for k, v in r['seconds'].items())})")
        print(f"        {sizes}")
    print(f"  JSON: {summary.relative_to(root)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
