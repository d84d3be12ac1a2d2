"""What a clean-room validation found: a check per step (and per smoke test), grouped by wheel, with the time of
each phase; the closing screen (`Report.summary`) and the JSON report, which names each wheel by file name and
sha256, so a wheel changed after validation no longer matches its report (`covers`, which the release job
reads).
"""
from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from jatools import atomic_write, config
from jax_aiter.integrity import sha256_files

SCHEMA = 1
PHASES = ("wheel", "environment", "install", "smoke")


@dataclass
class Check:
    name: str
    phase: str          # one of PHASES
    ok: bool
    seconds: float
    message: str = ""


@dataclass
class WheelResult:
    wheel: str
    sha256: str
    variant: str
    version: str
    backend: str
    route: str                                  # "engine-free (uv)", "container docker (pulled)", ...
    checks: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    kept: str | None = None                     # the room, when kept for inspection

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    def phase_seconds(self) -> dict[str, float]:
        out = {p: sum(c.seconds for c in self.checks if c.phase == p) for p in PHASES}
        return {k: round(v, 2) for k, v in {**out, "total": sum(out.values())}.items()}


@dataclass
class Report:
    route_note: str
    wheelhouse: str
    results: list[WheelResult] = field(default_factory=list)
    started: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return bool(self.results) and all(r.ok for r in self.results)

    def to_json(self) -> dict:
        return {
            "schema": SCHEMA, "kind": "jax-aiter-validation", "ok": self.ok, "started": self.started,
            "seconds": round(self.seconds, 2), "route": self.route_note, "wheelhouse": self.wheelhouse,
            "host": {"machine": platform.machine(), "python": platform.python_version(),
                     "cpus": os.cpu_count(), "system": platform.platform()},
            "wheels": [{**{k: v for k, v in asdict(r).items() if k != "checks"}, "ok": r.ok,
                        "phases": r.phase_seconds(), "checks": [asdict(c) for c in r.checks]}
                       for r in self.results],
        }

    def write(self, path: Path) -> None:
        atomic_write.write_text(path, json.dumps(self.to_json(), indent=2) + "\n")

    def summary(self, width: int = 100) -> str:
        """The closing screen: one line per check, phase times per wheel, the verdict."""
        lines = [f"clean-room validation ({self.route_note})"]
        for r in self.results:
            ph = r.phase_seconds()
            lines += ["", f"{r.variant:<5} {r.wheel}  [{r.route}]"]
            for c in r.checks:
                text = f"  {'pass' if c.ok else 'FAIL'}  {c.name:<24} {c.seconds:7.2f} s  {c.message}"
                lines.append(text[:width] if c.ok else text)  # a failure is shown whole
            lines += [f"  note  {n}"[:width] for n in r.notes]
            lines.append(f"  {'PASS' if r.ok else 'FAIL'}  {r.variant}: environment {ph['environment']:.1f} s, "
                         f"install {ph['install']:.1f} s, smoke {ph['smoke']:.1f} s, total {ph['total']:.1f} s")
        lines += ["", (f"{'PASS' if self.ok else 'FAIL'}: {sum(r.ok for r in self.results)} of "
                       f"{len(self.results)} wheel(s) validated in {self.seconds:.1f} s")]
        return "\n".join(lines)


def covers(path: Path, wheels: list[Path]) -> bool:
    """Whether the report at `path` shows every one of `wheels` (same name and sha256) validated and passing:
    the release job skips an up-to-date validation, and a wheel changed since has another sha256."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return False
    if data.get("kind") != "jax-aiter-validation" or data.get("schema") != SCHEMA:
        return False
    passed = {(w["wheel"], w["sha256"]) for w in data.get("wheels", []) if w.get("ok")}
    digests = sha256_files(wheels)
    return bool(wheels) and all((w.name, digests[str(w)]) in passed for w in wheels)


def report_path(root: Path) -> Path:
    """Where the report goes: pyproject's `validation_report` (default build/validate/report.json)."""
    return root / str(config.defaults(root)["validation_report"])
