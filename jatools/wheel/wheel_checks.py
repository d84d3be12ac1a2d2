"""The one door to the checks on built wheels: the symbol floor (wheel_floor.py), the content policy
(wheel_contents.py) and the clients users run (wheel_clients.py).

    python -m jatools.wheel.wheel_checks [--floor] [--contents] [--clients] DIST...   (none given: floor + contents)

`invoke floor|contents` and `wheel_build --check` call `run`. Floor and contents run on one wheel_scan.scan, so
one command inflates a wheel once.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from jatools.wheel.wheel_clients import client_problems
from jatools.wheel.wheel_contents import check_contents
from jatools.wheel.wheel_floor import FloorError, check_floor
from jatools.wheel.wheel_scan import WheelReadError, WheelScan, scan

CHECKS = ("floor", "contents", "clients")


def run(checks: list[str], dists: list[Path | WheelScan]) -> tuple[list[str], list[str]]:
    """Run `checks` (CHECKS) on `dists`, each wheel scanned once for floor and contents together (a scan given
    is used as it is); return the lines `<check>: ok ...` and the lines `<check>: FAIL ...`."""
    ok: list[str] = []
    failed: list[str] = []

    def say(check: str, good: bool, message: str) -> None:
        (ok if good else failed).append(f"{check}: {'ok' if good else 'FAIL'} {message}")

    paths = [d.wheel if isinstance(d, WheelScan) else d for d in dists]
    scanned_checks = [c for c in ("floor", "contents") if c in checks]
    for dist in dists if scanned_checks else []:
        try:
            if not isinstance(dist, WheelScan) and dist.suffix != ".whl":
                raise WheelReadError(f"{dist.name} is not a wheel; only the clients check an sdist (--clients)")
            scanned = dist if isinstance(dist, WheelScan) else scan(dist)
        except WheelReadError as e:
            for check in scanned_checks:
                say(check, False, str(e))
            continue
        for check in scanned_checks:
            try:
                report = check_floor(scanned) if check == "floor" else check_contents(scanned)
                say(check, report.ok, report.message)
            except FloorError as e:
                say(check, False, str(e))
    if "clients" in checks:
        for problem in (problems := client_problems(paths)):
            say("clients", False, problem)
        if not problems:
            say("clients", True, "twine check --strict, check-wheel-contents, wheel unpack + pack accept "
                                 + ", ".join(p.name for p in paths))
    return ok, failed


def run_and_print(checks: list[str], dists: list[Path | WheelScan]) -> int:
    """`run`: the ok lines on stdout, the failures on stderr; the exit code (1: a check failed)."""
    ok, failed = run(checks, dists)
    for line in ok:
        print(line, flush=True)
    for line in failed:
        print(line, file=sys.stderr)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m jatools.wheel.wheel_checks", description=__doc__.splitlines()[0])
    p.add_argument("dists", nargs="+", type=Path, help="wheels (and, with --clients, sdists)")
    p.add_argument("--floor", action="store_true", help="the platform tag against the symbol floor (invoke floor)")
    p.add_argument("--contents", action="store_true", help="the content policy and RECORD (invoke contents)")
    p.add_argument("--clients", action="store_true", help="the clients users run: twine check --strict, "
                   "check-wheel-contents, wheel unpack + pack")
    args = p.parse_args(argv)
    return run_and_print([c for c in CHECKS if getattr(args, c)] or ["floor", "contents"], args.dists)


if __name__ == "__main__":
    sys.exit(main())
