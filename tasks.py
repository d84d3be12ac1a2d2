"""invoke tasks: hash verification, wheel checks, clean-room validation, JIT-library transport, release.

Tasks are thin: each parses its arguments, calls one jatools module, and turns
its errors into `Exit` with a message and a code. `invoke --list` shows them.
"""
from __future__ import annotations

from pathlib import Path

from invoke import Collection, Exit, task

ns = Collection()


# --- wheels: build, symbol floor, content policy (logic in jatools/wheel_*.py) ---------------
_WHEEL_ARG = {"wheel": "wheel path, glob or comma-separated list (default: every wheel in dist/)"}


def _wheel_paths(wheel: str | None) -> list[Path]:
    from jatools import config, wheel_members

    try:
        return wheel_members.find_wheels(wheel or "", config.repo_root() / "dist")
    except wheel_members.WheelReadError as e:
        raise Exit(f"error: {e}", code=2) from None


@task(help=_WHEEL_ARG, positional=["wheel"])
def floor(c, wheel=None):
    """auditwheel symbol floor: fail when a wheel's platform tag claims an older glibc than its symbols allow."""
    from jatools import wheel_floor

    failures = []
    for path in _wheel_paths(wheel):
        try:
            report = wheel_floor.check_wheel(path)
        except wheel_floor.FloorError as e:
            failures.append(str(e))
            continue
        (print(f"floor: ok {report.message}") if report.ok else failures.append(report.message))
    if failures:
        raise Exit("floor: FAIL " + "\nfloor: FAIL ".join(failures), code=1)


@task(help=_WHEEL_ARG, positional=["wheel"])
def contents(c, wheel=None):
    """Wheel content policy: variant files, allowed external libraries, RUNPATHs, RECORD and metadata."""
    from jatools import wheel_contents

    reports = wheel_contents.check_wheels(_wheel_paths(wheel))
    for r in reports:
        if r.ok:
            print(f"contents: ok {r.message()}")
    failed = [r.message() for r in reports if not r.ok]
    if failed:
        raise Exit("contents: FAIL " + "\ncontents: FAIL ".join(failed), code=1)


@task(help={"variant": "lite or full", "dist": "output folder (default: dist/)",
            "plat_name": "platform tag (default: JA_WHEEL_PLAT_NAME, else the measured floor)",
            "check": "run the floor and contents checks on the new wheel"})
def wheel_build(c, variant, dist="", plat_name="", check=False):
    """Build the lite or full wheel from the build tree (never runs build_jit.py)."""
    from jatools import wheel_build as wb

    argv = ["--variant", variant] + (["--dist", dist] if dist else []) + (["--plat-name", plat_name] if plat_name else [])
    code = wb.main(argv + (["--check"] if check else []))
    if code:
        raise Exit(f"wheel.build: the {variant} wheel failed (exit {code}); see the messages above", code=code)


_wheel_ns = Collection("wheel")
_wheel_ns.add_task(floor)
_wheel_ns.add_task(contents)
_wheel_ns.add_task(wheel_build, name="build")
ns.add_collection(_wheel_ns)
ns.add_task(floor)
ns.add_task(contents)
