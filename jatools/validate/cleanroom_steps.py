"""The steps of one wheel in a clean room, as data (`plan`), with paths as the room's processes see them (a
`Layout`), so one plan runs both locally, in the room's scrubbed environment, and through `<engine> exec`;
and their run (`run_plan`, through jatools/steps.py, a log per step in the room), each step a check of the
report (the smoke step one per smoke test).
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from jatools import steps
from jatools.validate import cleanroom_env as cenv
from jatools.validate.cleanroom_report import Check, WheelResult
from jax_aiter import remedies

Log = Callable[[str], None]
SMOKE_SCRIPT = "cleanroom_smoke.py"
SMOKE_SOURCE = Path(__file__).with_name(SMOKE_SCRIPT)
SMOKE_RESULTS = "smoke.json"
REFERENCE_SOURCE = Path("tests/ops/reference.py")
RECORD_COPY = "wheel-RECORD"

STEP_TIMEOUT_S = 900
HOST_DEPS_PTH = "ja-host-deps.pth"  # cleanroom_smoke.py names it too (it imports no jatools)
# Appends the given folders to the venv's sys.path (after its own site-packages, so the wheel's
# jax_aiter still comes first) through a .pth file in its site-packages.
_HOST_DEPS_CODE = ("import sys, sysconfig, pathlib; pathlib.Path(sysconfig.get_paths()['purelib'], "
                   f"{HOST_DEPS_PTH!r}).write_text(''.join(p + chr(10) for p in sys.argv[1:]))")

STEP_PHASES = {"venv": "environment", "host-deps": "environment", "install": "install", "smoke": "smoke"}


@dataclass(frozen=True)
class Layout:
    """Where things are, as seen from inside the clean room."""

    python: str       # the base interpreter the venv is made from
    venv: str
    work: str         # working directory of every step (outside the checkout)
    smoke: str        # folder with the smoke script, reference.py and the wheel's RECORD
    out: str          # folder the smoke step writes its results to
    wheel: str
    wheelhouse: str
    release: str | None  # folder the lite wheel's smoke step serves and fetches from
    checkout: str     # the source tree that must stay unreachable
    pycache: str | None = None  # -X pycache_prefix for the smoke step (dependencies' bytecode kept between rooms)
    gpu: str | None = None      # cuda | rocm: the host has such a GPU and the wheel is built for it
    host_deps: tuple[str, ...] = ()  # site-packages folders whose installed packages serve as the dependencies


def plan(layout: Layout, installer: cenv.Installer, variant: str, pins: list[str]) -> list[steps.Step]:
    """Every step for one wheel. `pins` (e.g. jax==0.11.0) keep the resolver at the versions under test.
    With `layout.host_deps` the venv sees those folders' installed packages (an offline GPU host's JAX and
    plugin), and the installer adds only the wheel and what they lack."""
    py = f"{layout.venv}/bin/python"
    todo = [("venv", installer.create(layout.python, layout.venv))]
    if layout.host_deps:
        todo.append(("host-deps", [py, "-I", "-c", _HOST_DEPS_CODE, *layout.host_deps]))
    todo.append(("install", installer.install(layout.venv, layout.wheelhouse, [f"{layout.wheel}[fetch]", *pins])))
    extra: list[str] = []
    if variant == "lite":
        if layout.release is None:
            raise ValueError("a lite wheel needs a release folder to fetch the attention libraries from")
        extra = ["--release", layout.release]
    prefix = ["-X", f"pycache_prefix={layout.pycache}"] if layout.pycache else []
    extra += ["--expect-gpu", layout.gpu] if layout.gpu else []
    todo.append(("smoke", [py, "-I", *prefix, f"{layout.smoke}/{SMOKE_SCRIPT}", "--variant", variant, "--checkout",
                           layout.checkout, "--record", f"{layout.smoke}/{RECORD_COPY}", *extra,
                           "--out", f"{layout.out}/{SMOKE_RESULTS}"]))
    return [steps.Step(name, argv, timeout=STEP_TIMEOUT_S) for name, argv in todo]


def _tail(rec: steps.Record, n: int = 12) -> str:
    return " | ".join(rec.tail[-n:])


def _step_failure(rec: steps.Record) -> str:
    why = f"{rec.note}: {_tail(rec) or rec.command}"
    if rec.name == "install":
        return (f"offline install failed ({why}). If a dependency is missing from the wheelhouse, refill it with "
                f"`{remedies.door('wheelhouse')}`")
    if rec.name == "venv":
        return f"could not create the environment ({why})"
    return why


def _smoke_checks(rec: steps.Record, results: Path) -> list[Check]:
    try:
        rows = json.loads(results.read_text())
    except (OSError, ValueError):
        return [Check(rec.name, "smoke", False, rec.seconds,
                      f"the smoke script wrote no results ({rec.note or 'exit 0'}): {_tail(rec)}")]
    checks = [Check(r["check"], "smoke", bool(r["ok"]), float(r["seconds"]), r["message"]) for r in rows]
    # Time outside the checks themselves (interpreter start, importing JAX) is the step's own.
    overhead = max(0.0, rec.seconds - sum(c.seconds for c in checks))
    checks.insert(0, Check("smoke-start", "smoke", True, round(overhead, 3), "interpreter start, importing JAX"))
    if rec.result != "ok" and all(c.ok for c in checks):
        checks.append(Check(rec.name, "smoke", False, 0.0, f"{rec.note}: {_tail(rec)}"))
    return checks


def run_plan(todo: list[steps.Step], variant: str, room: cenv.Room, result: WheelResult, log: Log) -> None:
    """Run the steps in order, a log each in the room; the first failing one stops the rest. Each is a check."""
    todo = [dataclasses.replace(s, log=room.root / "logs" / f"{s.name}.log") for s in todo]
    try:
        records = steps.run(todo, f"cleanroom {variant}", echo=False, progress=log)
    except steps.StepFailed as e:
        records = e.records
    for rec in records:
        if rec.result == "not run":
            break
        if rec.name == "smoke":
            result.checks += _smoke_checks(rec, room.tmp / SMOKE_RESULTS)
        else:
            ok = rec.result == "ok"
            result.checks.append(Check(rec.name, STEP_PHASES[rec.name], ok, rec.seconds,
                                       _tail(rec, 2) if ok else _step_failure(rec)))
