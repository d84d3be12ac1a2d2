"""`nox -s bench`: run the tooling benchmarks, print the table, write build/bench/results.json.

    python -m jatools.bench [--only NAME[,NAME]] [--scale F] [--runs N] [--warmup N] [--out PATH]
    python -m jatools.bench gpu [bench_gpu.py args]   # the GPU kernel benchmark (a GPU host)

Each benchmark (one function in jatools/bench/cases.py, registered in its BENCHMARKS table) times our
code path and the reference's command (the anchor) on the same data and returns a Result that says
whether the goal was met and, if not, by how much. This module holds what they share: the Result and the
Context, the timing (alternating, docs/benchmarks.md), the anchor tools, the table and the JSON; the
command line is runner.py.
"""
from __future__ import annotations

import hashlib
import os
import platform
import shutil
import ssl
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path

from jatools import config

BENCH_DIR = config.build_path("bench")  # under the repository root unless absolute (JA_BUILD_DIR)
Step = Callable[[], object]


@dataclass
class Result:
    name: str
    ours_s: float | None
    anchor_s: float | None
    goal: str
    met: bool | None  # None: not run
    bytes: int = 0
    ours: str = ""  # what was timed as ours
    anchor: str = ""  # the anchor command
    shortfall: str = ""  # how far from the goal, and what bounds it
    runs: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)
    error: str = ""

    @property
    def ratio(self) -> float | None:
        """anchor / ours: how many times faster ours is."""
        return self.anchor_s / self.ours_s if self.ours_s and self.anchor_s else None

    def to_json(self) -> dict:
        d = asdict(self)
        d["ratio"] = None if self.ratio is None else round(self.ratio, 3)
        for k in ("ours_s", "anchor_s"):
            d[k] = None if d[k] is None else round(d[k], 4)
        return d


@dataclass
class Timings:
    ours: list[float] = field(default_factory=list)
    anchor: list[float] = field(default_factory=list)

    @property
    def ours_s(self) -> float:
        return statistics.median(self.ours)

    @property
    def anchor_s(self) -> float:
        return statistics.median(self.anchor)

    @property
    def runs(self) -> dict[str, list[float]]:
        """Every run's time, as the JSON carries them."""
        return {"ours": self.ours, "anchor": self.anchor}


def timed(fn: Step) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


@dataclass
class Context:
    root: Path
    scale: float
    runs: int
    warmup: int
    work_root: Path
    corpus_root: Path
    publish_fraction: float = 0.1
    publish_level: int | None = None  # None: the project's jit_libs_zstd_level
    log: Callable[[str], None] = print

    def work(self, name: str) -> Path:
        path = self.work_root / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def settings(self, **env: str) -> config.Settings:
        """The project's settings for the CPU backend (the benchmarks' build), `env` over the environment."""
        return config.load(root=self.root, env={**os.environ, "JA_BACKEND": "cpu", **env})

    def alternate(self, label: str, ours: Step, anchor: Step, prepare: Step | None = None, runs: int | None = None
                  ) -> Timings:
        """Time `ours` and `anchor` alternately (a burst of load on this shared machine then slows both), --runs
        (or `runs`) times each after --warmup untimed rounds; `prepare` (untimed) runs before every call."""
        runs = self.runs if runs is None else runs
        t = Timings()
        for i in range(self.warmup + runs):
            for which, fn, out in (("ours", ours, t.ours), ("anchor", anchor, t.anchor)):
                if prepare is not None:
                    prepare()
                took = timed(fn)
                if i >= self.warmup:
                    out.append(took)
                when = "warm-up" if i < self.warmup else f"run {i - self.warmup + 1}/{runs}"
                self.log(f"bench: {label} {which} {when}: {took:.2f} s")
        return t


# The anchor tools (the reference's commands): how to install one, and the versions the JSON records.
INSTALL = {"sha256sum": "apt-get install -y coreutils", "nox": "pip install nox"}  # else apt-get install -y NAME
TOOLS = ("zstd", "curl", "sha256sum", "openssl", "make", "nox", "ninja", "g++", "uv")  # versions in the JSON
PACKAGES = ("zstandard", "numpy", "nox", "invoke", "pip", "setuptools", "wheel", "uv", "auditwheel")


class AnchorMissing(RuntimeError):
    """An anchor tool is not installed; the benchmark is reported as not run, with the install command."""


def require(*names: str) -> None:
    """AnchorMissing naming every tool of `names` that is not installed, and how to install it."""
    missing = [n for n in names if shutil.which(n) is None]
    if missing:
        raise AnchorMissing("; ".join(f"{n} is not installed (install it with "
                                      f"`{INSTALL.get(n, f'apt-get install -y {n}')}`)" for n in missing))


def tool_version(cmd: list[str]) -> str | None:
    """The first line a tool prints for its version, or None when it is not installed."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (out.stdout or out.stderr).strip()
    return text.splitlines()[0] if text else None


def run_command(cmd: list[str] | str, **kwargs) -> subprocess.CompletedProcess:
    """Run an anchor (or setup) command; a failure raises with its output (an anchor that fails is not a time)."""
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, **kwargs)
    if out.returncode != 0:
        shown = cmd if isinstance(cmd, str) else " ".join(map(str, cmd))
        raise RuntimeError(f"`{shown}` failed (exit {out.returncode}): {(out.stderr or out.stdout)[-2000:]}")
    return out


def machine_facts() -> dict:
    return {
        "cores": os.cpu_count(), "python": sys.version.split()[0], "implementation": platform.python_implementation(),
        "platform": platform.platform(), "machine": platform.machine(), "openssl": ssl.OPENSSL_VERSION,
        "hashlib_sha256": "openssl" if "openssl_sha256" in dir(hashlib) else "builtin",
        "load_average": list(os.getloadavg()),
        "tools": {n: tool_version([n, "version" if n == "openssl" else "--version"]) for n in TOOLS},
        "python_packages": {pkg: _package_version(pkg) for pkg in PACKAGES},
    }


def _package_version(pkg: str) -> str | None:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def table(results: list[Result]) -> str:
    """The one-screen summary: benchmark, ours, anchor, ratio, goal, met?; then each miss and why."""
    _fmt_s = lambda v: "-" if v is None else f"{v:.2f} s"
    rows = [("benchmark", "ours", "anchor", "ratio", "goal", "met?")]
    for r in results:
        met = "not run" if r.met is None else ("yes" if r.met else "NO")
        rows.append((r.name, _fmt_s(r.ours_s), _fmt_s(r.anchor_s), "-" if r.ratio is None else f"{r.ratio:.2f}x",
                     r.goal, met))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for r in results:
        if r.error:
            lines.append(f"{r.name}: not run: {r.error}")
        elif r.shortfall:
            lines.append(f"{r.name}: {r.shortfall}")
        for k, v in r.extra.get("notes", {}).items():
            lines.append(f"{r.name}: {k}: {v}")
    return "\n".join(lines)
