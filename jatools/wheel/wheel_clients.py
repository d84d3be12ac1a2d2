"""The clients users run on what we publish, each of which must accept every wheel and sdist: `twine check
--strict`, `check-wheel-contents`, and `wheel unpack` + `wheel pack` (which must give the same wheel back).
`invoke contents --clients` runs them (wheel_checks.py).
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

# check-wheel-contents codes we configure off, each for a reason (docs/wheels.md):
CHECK_WHEEL_CONTENTS_IGNORE: dict[str, str] = {}


def _client(argv: list[str], what: str) -> str | None:
    """Run a client as users do (this interpreter's module); None when it accepts, else what it said."""
    out = subprocess.run([sys.executable, *argv], capture_output=True, text=True, check=False,
                         env={**os.environ, "NO_COLOR": "1"})
    if out.returncode == 0:
        return None
    if "No module named" in out.stderr:
        return (f"{what}: the client is not installed ({out.stderr.strip().splitlines()[-1]}); install the "
                "`clients` dependency group: pip install --group clients")
    return f"{what} rejects it (exit {out.returncode}): {(out.stdout + out.stderr).strip()[-1500:]}"


def repack_problems(wheel: Path) -> list[str]:
    """`wheel unpack` then `wheel pack`: the same file name, members and bytes (RECORD rows as a set)."""
    with tempfile.TemporaryDirectory(prefix="ja-repack-") as tmp:
        said = _client(["-m", "wheel", "unpack", "-d", f"{tmp}/u", str(wheel)], "wheel unpack")
        unpacked = next(Path(tmp, "u").glob("*"), None) if said is None else None
        Path(tmp, "p").mkdir()
        if said := said or _client(["-m", "wheel", "pack", "-d", f"{tmp}/p", str(unpacked)], "wheel pack"):
            return [f"{wheel.name}: {said}"]
        again = next(Path(tmp, "p").glob("*.whl"))
        problems = [f"{wheel.name}: `wheel pack` names it {again.name}"] if again.name != wheel.name else []
        with zipfile.ZipFile(wheel) as a, zipfile.ZipFile(again) as b:
            ours, theirs = sorted(a.namelist()), sorted(b.namelist())
            if ours != theirs:
                problems.append(f"{wheel.name}: `wheel pack` gives other members: only ours "
                                f"{sorted(set(ours) - set(theirs))}, only theirs {sorted(set(theirs) - set(ours))}")
            for n in sorted(set(ours) & set(theirs)):
                same = (set(a.read(n).splitlines()) == set(b.read(n).splitlines()) if n.endswith("/RECORD")
                        else a.read(n) == b.read(n))
                if not same:
                    problems.append(f"{wheel.name}: {n} differs after `wheel unpack` + `wheel pack`")
    return problems


def client_problems(dists: list[Path]) -> list[str]:
    """What the clients users run say about these wheels/sdists: `twine check --strict` (all),
    `check-wheel-contents` and `wheel unpack` + `wheel pack` (wheels). Empty: every client accepts them."""
    wheels = [d for d in dists if d.suffix == ".whl"]
    said = [_client(["-m", "twine", "check", "--strict", *map(str, dists)], "twine check --strict")]
    if wheels:
        ignore = ["--ignore", ",".join(CHECK_WHEEL_CONTENTS_IGNORE)] if CHECK_WHEEL_CONTENTS_IGNORE else []
        said.append(_client(["-m", "check_wheel_contents", *ignore, *map(str, wheels)], "check-wheel-contents"))
    return [s for s in said if s] + [p for w in wheels for p in repack_problems(w)]
