"""validate: `invoke validate --variant lite` (jatools.validate.cleanroom, engine-free, default installer)
with a warm wheelhouse, against the plain route (`--installer pip`: `python -m venv` + `pip install`
of the same wheels from the same wheelhouse, same smoke tests).

Setup, untimed: the lite wheel is built from this checkout's CPU build, and the
wheelhouse is filled once if it is cold (that needs the package index).

Goal: at most 20 s, and at least 3x faster than the plain route.
"""
from __future__ import annotations

import os
import shutil
import sys

from jatools import config
from jatools.bench import tools
from jatools.bench.harness import Context, Result
from jatools.bench.timing import alternate
from jatools.validate import cleanroom_env, wheelhouse
from jatools.wheel import wheel_build

GOAL = "<=20 s, >=3x venv+pip route"
LIMIT_S = 20.0


def run(ctx: Context) -> Result:
    work = ctx.work("validate")
    settings = ctx.settings(JA_BACKEND="cpu")
    dist = work / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    try:
        wheel = wheel_build.build(settings, wheel_build.BuildOptions(variant="lite", dist_dir=dist)).wheel
    except (wheel_build.WheelBuildError, OSError) as e:
        raise tools.AnchorMissing(f"cannot build the lite wheel ({e}); build the CPU libraries first") from None
    wh = wheelhouse.location(ctx.root)
    python = cleanroom_env.find_python(str(config.defaults(ctx.root)["validation_python"]))
    wheelhouse.ensure(wh, wheelhouse.requirements(ctx.root), python, allow_fill=True, log=ctx.log)
    env = {**os.environ, "JA_BACKEND": "cpu"}

    def route(installer: str):
        cmd = [sys.executable, "-m", "jatools.validate.cleanroom", "--engine", "none", "--installer", installer,
               "--variant", "lite", "--wheel", str(wheel), "--no-fill", "--report", str(work / f"{installer}.json")]
        return lambda: tools.run(cmd, cwd=ctx.root, env=env)

    t = alternate(route("auto"), route("pip"), ctx.runs, ctx.warmup, log=ctx.log, label="validate")
    speedup = t.anchor_s / t.ours_s
    met = t.ours_s <= LIMIT_S and speedup >= 3
    short = []
    if t.ours_s > LIMIT_S:
        short.append(f"{t.ours_s:.1f} s, {t.ours_s - LIMIT_S:.1f} s over the 20 s goal")
    if speedup < 3:
        short.append(f"{speedup:.2f}x of the 3x goal over the venv+pip route")
    uv = shutil.which("uv")
    return Result("validate", t.ours_s, t.anchor_s, GOAL, met, wheel.stat().st_size,
                  ours=f"invoke validate --variant lite (engine none, installer auto: {'uv' if uv else 'pip, no uv'})",
                  anchor="invoke validate --variant lite --installer pip (python -m venv + pip install)",
                  shortfall="; ".join(short), runs={"ours": t.ours, "anchor": t.anchor},
                  extra={"wheelhouse": str(wh), "uv": uv})
