"""incremental: editing one kernel template recompiles only the instances generated from it.

In a scratch copy of the repository (tests/build/scratch.py, JA_BACKEND=cpu):
a cold `build_jit.py` (the anchor, timed once: it costs minutes), then, per
run, one edit to the CPU template of `MODULE` and a rebuild (ours). Rebuilt
instances are counted from the object files whose mtime changed.

Goal: rebuilt == the instances of the edited template (and nothing else).
"""
from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

from jatools.bench import tools
from jatools.bench.harness import Context, Result
from jatools.bench.timing import timed

GOAL = "rebuild only the touched template's instances"
MODULE = "rmsnorm_fwd"


def objects(build: Path) -> dict[str, int]:
    """{instance object: mtime_ns} of every generated instance (dispatch objects are not instances)."""
    return {str(p.relative_to(build)): p.stat().st_mtime_ns for p in build.glob("*/obj/ja_*.o")}


def run(ctx: Context) -> Result:
    sys.path.insert(0, str(ctx.root))
    from tests.build.scratch import env_for, make_scratch

    tools.require("make", "g++")
    work = ctx.work("incremental")
    scratch = work / "repo"
    shutil.rmtree(scratch, ignore_errors=True)
    make_scratch(scratch)
    env = env_for(scratch)
    build_jit = [sys.executable, "jax_aiter/jit/build_jit.py", "-j", "2"]
    tools.run(["make", "-j2", "umbrella"], cwd=scratch, env=env)
    cold = timed(lambda: tools.run(build_jit, cwd=scratch, env=env))
    build = scratch / "build" / "aiter_build"
    total = len(objects(build))
    spec = json.loads((scratch / "jax_aiter/jit/optCompilerConfig.json").read_text())["modules"][MODULE]
    template = scratch / spec["templates"]["cpu"]
    expected = sorted(k for k in objects(build) if k.startswith(f"{MODULE}/"))
    times, rebuilt_sets = [], []
    for i in range(ctx.warmup + ctx.runs):
        before = objects(build)
        time.sleep(0.01)  # distinct mtimes
        with open(template, "a") as fh:
            fh.write(f"// bench edit {i}\n")
        took = timed(lambda: tools.run(build_jit, cwd=scratch, env=env))
        after = objects(build)
        rebuilt = sorted(k for k in after if after[k] != before.get(k))
        ctx.log(f"bench: incremental {'warm-up' if i < ctx.warmup else 'run'} {i + 1}: {took:.2f} s, "
                f"{len(rebuilt)}/{total} instances rebuilt")
        if i >= ctx.warmup:
            times.append(took)
            rebuilt_sets.append(rebuilt)
    ours = sorted(times)[len(times) // 2]
    exact = all(r == expected for r in rebuilt_sets)
    short = "" if exact else (f"rebuilt {[len(r) for r in rebuilt_sets]} instances, expected exactly the "
                              f"{len(expected)} of {MODULE}: {rebuilt_sets[0]}")
    return Result("incremental", ours, cold, GOAL, exact, 0,
                  ours=f"edit {spec['templates']['cpu']}, build_jit.py -j 2", anchor="cold build_jit.py -j 2",
                  shortfall=short, runs={"ours": times, "anchor": [cold]},
                  extra={"instances_rebuilt": len(rebuilt_sets[-1]), "instances_total": total,
                         "rebuilt": rebuilt_sets[-1],
                         "notes": {"instances": f"{len(rebuilt_sets[-1])}/{total} rebuilt after one template edit"}})
