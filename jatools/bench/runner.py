"""`nox -s bench`: run the tooling benchmarks, print the table, write build/bench/results.json.

The command line of python -m jatools.bench (usage in harness.py): the chosen benchmarks of cases.BENCHMARKS,
one after another, then the table and the results JSON.
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
from jatools.bench.cases import BENCHMARKS
from jatools.bench.harness import (
    BENCH_DIR,
    AnchorMissing,
    Context,
    Result,
    machine_facts,
    table,
)


def run_one(name: str, ctx: Context) -> Result:
    case = BENCHMARKS[name]
    try:
        return case.run(ctx)
    except AnchorMissing as e:
        error = str(e)
    except Exception as e:  # noqa: BLE001 (a failing benchmark is reported and the others still run)
        import traceback

        ctx.log(traceback.format_exc())
        error = f"{type(e).__name__}: {e}"
    return Result(name, None, None, case.goal, None, error=error)  # not run


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    root = config.repo_root()
    if argv[:1] == ["gpu"]:  # pass-through to the GPU kernel benchmark
        return subprocess.call([sys.executable, "-m", "benchmarks.gpu.bench_gpu", *argv[1:]], cwd=root)
    p = argparse.ArgumentParser(prog="python -m jatools.bench", description=__doc__.splitlines()[0])
    p.add_argument("--only", action="append", default=[], help=f"benchmark(s) to run: {', '.join(BENCHMARKS)}")
    p.add_argument("--scale", type=float, default=1.0, help="corpus scale (1: production sizes)")
    p.add_argument("--publish-fraction", type=float, default=0.1,
                   help="publish runs on a corpus of scale x this (the zstd -19 anchor is slow; the issue says 1/10)")
    p.add_argument("--publish-level", type=int, default=None,
                   help="zstd level for ours in publish (default: pyproject jit_libs_zstd_level), to weigh another")
    p.add_argument("--runs", type=int, default=3, help="timed runs of each side (the figure is their median)")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    p.add_argument("--out", type=Path, default=None, help="results JSON (default build/bench/results.json)")
    args = p.parse_args(argv)
    known = BENCHMARKS
    names = [n for spec in args.only for n in spec.split(",") if n] or list(known)
    unknown = sorted(set(names) - set(known))
    if unknown:
        print(f"bench: unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(known)}", file=sys.stderr)
        return 2
    bench_dir = root / BENCH_DIR
    ctx = Context(root=root, scale=args.scale, runs=max(1, args.runs), warmup=max(0, args.warmup),
                  work_root=bench_dir / "work", corpus_root=bench_dir / "corpus",
                  publish_fraction=args.publish_fraction, publish_level=args.publish_level,
                  log=lambda m: print(m, flush=True))
    facts = machine_facts()
    start = time.monotonic()
    results = []
    for name in names:
        ctx.log(f"bench: {name} (scale {args.scale:g})")
        results.append(run_one(name, ctx))
    facts["load_average_end"] = list(os.getloadavg())
    report = {"command": "python -m jatools.bench " + " ".join(argv), "scale": args.scale, "runs": ctx.runs,
              "warmup": ctx.warmup, "seconds": round(time.monotonic() - start, 1), "machine": facts,
              "benchmarks": [r.to_json() for r in results]}
    out = args.out or bench_dir / "results.json"
    atomic_write.write_text(out, json.dumps(report, indent=2) + "\n")
    print(table(results))
    print(f"bench: load average {facts['load_average'][0]:.2f} at the start, {facts['load_average_end'][0]:.2f} at "
          f"the end ({facts['cores']} cores); results in {out}")
    return 1 if any(r.met is None for r in results) else 0  # a benchmark that could not run; a miss is not a failure
