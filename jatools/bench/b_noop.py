"""noop: `nox -s ja_mods` when everything is up to date, reported next to `make ja_mods` alone.

Goal: at most 1.5 s median (what is over `make` is nox's own start-up).
"""
from __future__ import annotations

import os
import shutil

from jatools.bench import tools
from jatools.bench.harness import Context, Result
from jatools.bench.timing import alternate

GOAL = "<=1.5 s median"
LIMIT_S = 1.5


def nox_command() -> list[str]:
    """nox from PATH (the bench session's venv has it), else the one beside this interpreter."""
    import sys
    from pathlib import Path

    beside = Path(sys.executable).with_name("nox")
    if shutil.which("nox"):
        return ["nox"]
    if beside.is_file():
        return [str(beside)]
    raise tools.AnchorMissing("nox is not installed (install it with `pip install nox`)")


def run(ctx: Context) -> Result:
    tools.require("make")
    nox = nox_command()
    env = {**os.environ, "JA_BACKEND": os.environ.get("JA_BACKEND", "cpu")}
    tools.run(["make", "-j2", "ja_mods"], cwd=ctx.root, env=env)  # up to date before timing (not timed)
    t = alternate(lambda: tools.run([*nox, "-s", "ja_mods"], cwd=ctx.root, env=env),
                  lambda: tools.run(["make", "ja_mods"], cwd=ctx.root, env=env),
                  max(ctx.runs, 5), ctx.warmup, log=ctx.log, label="noop")
    met = t.ours_s <= LIMIT_S
    short = "" if met else (f"{t.ours_s:.2f} s, {t.ours_s - LIMIT_S:.2f} s over the 1.5 s goal; `make ja_mods` alone "
                            f"takes {t.anchor_s:.2f} s, the rest is nox's start-up (Python, plugins, noxfile import)")
    return Result("noop", t.ours_s, t.anchor_s, GOAL, met, 0, ours="nox -s ja_mods (up to date)",
                  anchor="make ja_mods (alone, for reference)", shortfall=short,
                  runs={"ours": t.ours, "anchor": t.anchor}, extra={"nox": " ".join(nox)})
