"""Convergence gate: a change that can alter numerics must carry an explicit convergence decision.

Changed paths (``git diff base...HEAD``) are classified by the table in
``ci/convergence_paths.toml`` (data, first matching rule wins). When any path
is numerics, some commit in ``base..HEAD`` must carry a trailer:

    Convergence: run <id>                   a convergence run was made (its run id or URL)
    Convergence: not-needed (<reason>)      the change cannot alter results, and why

The check fails naming the files that triggered it and the command that adds a
trailer. Trailers are read by git itself (``%(trailers:key=Convergence)``), so
the usual trailer rules (last paragraph, ``Key: value``) apply.
"""
from __future__ import annotations

import fnmatch
import json
import re
import subprocess
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path

from jatools import atomic_write

TABLE = Path("ci/convergence_paths.toml")
TRAILER = "Convergence"
NUMERICS, EXEMPT = "numerics", "exempt"
_RUN = re.compile(r"^run\s+(\S+)\s*$")
_NOT_NEEDED = re.compile(r"^not-needed\s*\(\s*(\S.*?)\s*\)\s*$")
FIX_HINT = (
    "record a decision in a commit message trailer, e.g.\n"
    "  git commit --amend --trailer 'Convergence: not-needed (refactor, no numeric effect)'\n"
    "  git commit --amend --trailer 'Convergence: run <weekly-convergence run id or URL>'\n"
    "(a convergence run: the weekly-convergence workflow, or `python3 ci/build.py --build weekly_convergence`)"
)


class ConvergenceError(RuntimeError):
    """The check could not run (bad table, unknown revision); exit code 2."""


@dataclass(frozen=True)
class Table:
    rules: tuple[tuple[str, str, str], ...]  # (pattern, class, why), first match wins
    default: str

    def classify(self, path: str) -> tuple[str, str]:
        """(class, why) of a repository-relative path."""
        for pattern, cls, why in self.rules:
            if fnmatch.fnmatchcase(path, pattern):
                return cls, f"{why} [{pattern}]"
        return self.default, f"no rule in {TABLE} matches; default is {self.default}"


@dataclass(frozen=True)
class Decision:
    commit: str
    kind: str  # run | not-needed
    detail: str  # run id, or the reason


@dataclass
class Verdict:
    base: str
    head: str
    changed: list[dict] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    invalid: list[dict] = field(default_factory=list)

    @property
    def triggering(self) -> list[dict]:
        return [c for c in self.changed if c["class"] == NUMERICS]

    @property
    def ok(self) -> bool:
        return not self.invalid and (not self.triggering or bool(self.decisions))

    def to_json(self) -> dict:
        return {"base": self.base, "head": self.head, "ok": self.ok, "changed": self.changed,
                "triggering": self.triggering, "decisions": [asdict(d) for d in self.decisions],
                "invalid_trailers": self.invalid}


def load_table(root: Path) -> Table:
    try:
        data = tomllib.loads((root / TABLE).read_text())
    except FileNotFoundError:
        raise ConvergenceError(f"{TABLE} is missing; restore it with `git checkout -- {TABLE}`") from None
    except tomllib.TOMLDecodeError as e:
        raise ConvergenceError(f"{TABLE} is not valid TOML: {e}") from None
    classes = {NUMERICS, EXEMPT}
    for i, r in enumerate(data.get("rule", []), 1):
        if r.get("class") not in classes or not r.get("pattern") or not r.get("why"):
            raise ConvergenceError(f"{TABLE} rule {i} ({r}) needs pattern, why and class one of {sorted(classes)}")
    default = data.get("default", NUMERICS)
    if default not in classes:
        raise ConvergenceError(f"{TABLE} default {default!r} is not one of {sorted(classes)}")
    return Table(tuple((r["pattern"], r["class"], r["why"]) for r in data.get("rule", [])), default)


def _git(root: Path, *args: str) -> str:
    out = subprocess.run(["git", "-C", str(root), *args], check=False, capture_output=True, text=True)
    if out.returncode != 0:
        raise ConvergenceError(f"`git {' '.join(args)}` failed in {root}: {out.stderr.strip()}")
    return out.stdout


def resolve(root: Path, rev: str) -> str:
    try:
        return _git(root, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}").strip()
    except ConvergenceError:
        raise ConvergenceError(
            f"base revision {rev!r} is not a commit in {root}; fetch it first "
            f"(`git fetch origin {rev}`, or actions/checkout with fetch-depth: 0)") from None


def decisions(root: Path, base: str, head: str = "HEAD") -> tuple[list[Decision], list[dict]]:
    """Valid decisions and malformed trailers in base..head."""
    fmt = f"%H%x00%(trailers:key={TRAILER},valueonly,separator=%x1f)%x1e"
    found, invalid = [], []
    for record in _git(root, "log", f"--format={fmt}", f"{base}..{head}").split("\x1e"):
        commit, _, values = record.strip("\n").partition("\0")
        for value in filter(None, (v.strip() for v in values.split("\x1f"))):
            normal = " ".join(value.split())
            m = _RUN.match(normal) or _NOT_NEEDED.match(normal)
            if m:
                found.append(Decision(commit, "run" if m.re is _RUN else "not-needed", m.group(1)))
            else:
                invalid.append({"commit": commit, "value": value})
    return found, invalid


def check(root: Path, base: str, head: str = "HEAD") -> Verdict:
    """Classify the paths changed on head's side since the merge base (renames as delete + add) and read the
    decisions in base..head."""
    table = load_table(root)
    verdict = Verdict(resolve(root, base), resolve(root, head))
    out = _git(root, "diff", "--name-only", "--no-renames", "-z", f"{verdict.base}...{verdict.head}")
    for path in sorted(p for p in out.split("\0") if p):
        cls, why = table.classify(path)
        verdict.changed.append({"path": path, "class": cls, "why": why})
    verdict.decisions, verdict.invalid = decisions(root, verdict.base, verdict.head)
    return verdict


def report(v: Verdict) -> str:
    """The one-screen text the task prints."""
    lines = [(f"convergence-check: {v.base[:12]}...{v.head[:12]}: {len(v.changed)} changed file(s), "
              f"{len(v.triggering)} touch numerics"),
             *(f"  numerics: {c['path']}  ({c['why']})" for c in v.triggering),
             *(f"  decision in {d.commit[:12]}: {d.kind} ({d.detail})" for d in v.decisions),
             *(f"  malformed trailer in {bad['commit'][:12]}: 'Convergence: {bad['value']}' "
               "(expected 'run <id>' or 'not-needed (<reason>)')" for bad in v.invalid)]
    if v.ok:
        lines.append("convergence-check: passed" + ("" if v.triggering else " (no numerics change)"))
    else:
        why = ("malformed Convergence trailer(s)" if v.invalid else
               "numerics changed and no commit records a convergence decision")
        lines.append(f"convergence-check: FAILED: {why}; {FIX_HINT}")
    return "\n".join(lines)


def write_json(v: Verdict, path: Path) -> None:
    atomic_write.write_text(path, json.dumps(v.to_json(), indent=2) + "\n")
