"""Run a test tier: pr, nightly or multigpu, as one or more pytest processes.

    python3 -m jatools.testing.test_tiers --tier pr [--platform cuda] [--workers N] [--reruns N] [pytest args]
    JA_TEST_TIER=nightly bash ci/test.sh

The marker expression of every run comes from jatools.testing.tag_filters (the same
table ``python3 ci/tag_filters.py`` prints). Single-device runs on a GPU host
use pytest-xdist, one worker per GPU slot (jatools.testing.pytest_gpu_slot pins each
worker before JAX starts). Multi-device runs are a separate pytest process:
unpinned and holding every GPU slot (exclusive) on a GPU host; on the CPU with
XLA_FLAGS=--xla_force_host_platform_device_count=4 set before JAX starts.
Each run writes its flaky-retry JSON; the tier writes build/test-results/tier-<tier>.json.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from jatools import atomic_write
from jatools.testing import gpu_slots, tag_filters

TIER_ENV = "JA_TEST_TIER"
PLATFORM_ENV = "JA_TEST_PLATFORM"
WORKERS_ENV = "JA_TEST_WORKERS"
RERUNS_ENV = "JA_TEST_RERUNS"
AUTOLOAD_ENV = "JA_PYTEST_AUTOLOAD"  # 1: let pytest load every installed plugin (default: only ours + named)
RESULTS_DIR = Path("build") / "test-results"
LONGEST_FIRST_PLUGIN = "jatools.testing.pytest_longest_first"
CPU_MULTI_DEVICES = 4
DEFAULT_RERUNS = {"cpu": 0, "cuda": 2, "rocm": 2}  # XLA's single-GPU CI: 3 attempts


class TierError(RuntimeError):
    """A tier cannot run as asked; the message says why and what to do."""


@dataclass(frozen=True)
class PytestRun:
    kind: str  # single | multi
    config: str
    expression: str
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)  # overrides on top of os.environ
    exclusive: bool = False  # hold every GPU slot while it runs

    def command_line(self) -> str:
        return " ".join([*(f"{k}={shlex.quote(v)}" for k, v in self.env.items()), shlex.join(self.argv)])


def choose_platform(flag: str | None, env: dict[str, str], gpus: gpu_slots.Gpus) -> tuple[str, str]:
    """(platform, why): --platform > JA_TEST_PLATFORM > JA_BACKEND (cpu/cuda/rocm) > detected GPUs."""
    for value, why in ((flag, "--platform"), (env.get(PLATFORM_ENV), PLATFORM_ENV),
                       (env.get("JA_BACKEND"), "JA_BACKEND")):
        if value and value != "auto":
            if value not in tag_filters.PLATFORMS:
                raise TierError(f"{why}={value!r} is not a platform; use one of {', '.join(tag_filters.PLATFORMS)}")
            return value, f"{why}={value}"
    return gpus.platform, f"detected: {gpus.how}"


def _with_cpu_devices(xla_flags: str, n: int) -> str:
    if "--xla_force_host_platform_device_count" in xla_flags:
        return xla_flags
    return f"{xla_flags} --xla_force_host_platform_device_count={n}".strip()


def plan(tier: str, platform: str, gpus: gpu_slots.Gpus, pytest_args: list[str], workers: int | None = None,
         reruns: int = 0, have_rerun_plugin: bool = True, env: dict[str, str] | None = None,
         python: str = sys.executable, results_dir: Path = RESULTS_DIR) -> list[PytestRun]:
    """The pytest processes a tier runs on a platform, in order."""
    env = dict(os.environ if env is None else env)
    runs = []
    slots = gpus.count * gpu_slots.tests_per_gpu(env)
    for kind, config, flt in tag_filters.tier_runs(tier, platform):
        if flt.contradiction():
            raise TierError(f"tier {tier} on {platform}: {config} selects nothing ({flt.contradiction()})")
        expr = flt.expression()
        argv = [python, "-m", "pytest", *(["-m", expr] if expr else [])]
        over: dict[str, str] = {"JA_FLAKY_JSON": str(results_dir / f"flaky-{tier}-{kind}.json")}
        # Only the plugins a tier uses are loaded (-p below; ours come from tests/conftest.py). An
        # image's other plugins (hypothesis, cov, jaxtyping, ...) cost each process about a second
        # at start and end, and some import JAX before the worker has taken its GPU slot.
        # A PYTEST_DISABLE_PLUGIN_AUTOLOAD the caller set is kept (pytest reads any non-empty value as on).
        if "PYTEST_DISABLE_PLUGIN_AUTOLOAD" in env:
            autoload = not env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"]
        else:
            autoload = env.get(AUTOLOAD_ENV) == "1"
            if not autoload:
                over["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        if reruns and have_rerun_plugin:
            argv += [*([] if autoload else ["-p", "pytest_rerunfailures"]), "--reruns", str(reruns)]
        if kind == "multi":
            over["JA_GPU_SLOT"] = "0"
            if platform == "cpu":
                over["XLA_FLAGS"] = _with_cpu_devices(env.get("XLA_FLAGS", ""), CPU_MULTI_DEVICES)
        else:
            n = workers if workers is not None else (slots if platform != "cpu" else 0)
            if platform != "cpu" and slots and n > slots:
                raise TierError(f"{n} workers but only {slots} GPU slots ({gpus.how}, "
                                f"{gpu_slots.PER_GPU_ENV}={gpu_slots.tests_per_gpu(env)}); the extra workers would "
                                f"wait for a slot until timeout. Use --workers {slots} or raise {gpu_slots.PER_GPU_ENV}")
            if n:
                # worksteal: a worker that runs out takes queued tests from the others; longest first
                # (by earlier runs' durations): no long test starts last while the other workers idle.
                # The plugin is named here too, so the flag is known whatever paths the run is given.
                argv += [*([] if autoload else ["-p", "xdist.plugin"]), "-n", str(n), "--dist", "worksteal",
                         "-p", LONGEST_FIRST_PLUGIN, "--longest-first"]
            elif platform != "cpu":
                over["JA_GPU_SLOT"] = "1"  # no xdist: pin this one process
        runs.append(PytestRun(kind, config, expr, (*argv, *pytest_args), over,
                              exclusive=kind == "multi" and gpus.count > 0))
    return runs


def _flaky(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def execute(runs: list[PytestRun], gpus: gpu_slots.Gpus, root: Path) -> list[dict]:
    """Run each pytest process (all of them, even after a failure) and return their results."""
    results = []
    for run in runs:
        print(f"test_tiers: {run.kind} run ({run.config}): {run.command_line()}", flush=True)
        held = []
        if run.exclusive:
            held = gpu_slots.acquire_all(gpus, gpu_slots.tests_per_gpu(), timeout=gpu_slots.timeout_from_env(),
                                         note=f"pid {os.getpid()}: multigpu tier (exclusive)")
        start = time.monotonic()
        try:
            rc = subprocess.run(list(run.argv), cwd=root, env={**os.environ, **run.env}, check=False).returncode
        finally:
            for s in held:
                s.release()
        seconds = time.monotonic() - start
        flaky = _flaky(Path(run.env["JA_FLAKY_JSON"]))
        results.append({**asdict(run), "rc": rc, "seconds": round(seconds, 2), "flaky": flaky})
    return results


def summarize(tier: str, platform: str, why: str, results: list[dict], results_dir: Path, notes: list[str]) -> int:
    rc = 0
    print(f"\n== tier {tier} on {platform} ({why}) ==")
    for note in notes:
        print(f"note: {note}")
    for r in results:
        flaky = r["flaky"] or {}
        state = "ok" if r["rc"] == 0 else ("NO TESTS SELECTED" if r["rc"] == 5 else f"FAILED (exit {r['rc']})")
        print(f"{r['kind']:<6} {r['config']:<10} {state:<18} {r['seconds']:>8.1f} s  "
              f"flaky={flaky.get('flaky', '?')}  -m {r['expression'] or '<all>'!r}")
        rc = rc or r["rc"]
    out = results_dir / f"tier-{tier}.json"
    atomic_write.write_text(out, json.dumps({"tier": tier, "platform": platform, "platform_how": why, "notes": notes,
                                             "rc": rc, "runs": results}, indent=1) + "\n")
    print(f"results: {out}")
    return rc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m jatools.testing.test_tiers", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    p.add_argument("--tier", default=None, help=f"{' | '.join(tag_filters.TIERS)} (default: ${TIER_ENV} or pr)")
    p.add_argument("--platform", default=None, help="cpu | cuda | rocm (default: detected)")
    p.add_argument("--workers", type=int, default=None, help=f"xdist workers for single-device runs (${WORKERS_ENV}; "
                   "default: one per GPU slot on a GPU host, none on the CPU)")
    p.add_argument("--reruns", type=int, default=None, help=f"retries of a failing test (${RERUNS_ENV}; default "
                   "2 on GPU hosts, 0 on the CPU); every retry is reported")
    p.add_argument("--results-dir", type=Path, default=None, help=f"where the JSON results go ({RESULTS_DIR})")
    p.add_argument("--dry-run", action="store_true", help="print the pytest commands and exit")
    a, pytest_args = p.parse_known_args(argv)
    env = dict(os.environ)
    root = Path(__file__).resolve().parents[2]
    results_dir = (a.results_dir or root / RESULTS_DIR).resolve()
    tier = a.tier or env.get(TIER_ENV) or tag_filters.DEFAULT_TIER
    try:
        tag_filters.tier(tier)
        gpus = gpu_slots.detect(env)
        platform, why = choose_platform(a.platform, env, gpus)
        workers = a.workers if a.workers is not None else (int(env[WORKERS_ENV]) if env.get(WORKERS_ENV) else None)
        reruns = a.reruns if a.reruns is not None else int(env.get(RERUNS_ENV) or DEFAULT_RERUNS[platform])
        notes = []
        have_rerun = importlib.util.find_spec("pytest_rerunfailures") is not None
        if reruns and not have_rerun:
            notes.append(f"retries off: pytest-rerunfailures is not installed for {sys.executable} "
                         "(pip install pytest-rerunfailures, or `pip install -e .[test]`)")
        runs = plan(tier, platform, gpus, pytest_args, workers, reruns, have_rerun, env, results_dir=results_dir)
    except (tag_filters.TagFilterError, TierError, ValueError) as e:
        print(f"test_tiers: {e}", file=sys.stderr)
        return 2
    if a.dry_run:
        for note in notes:
            print(f"note: {note}")
        for run in runs:
            print(f"{run.kind} {run.config}{' exclusive' if run.exclusive else ''}: {run.command_line()}")
        return 0
    if importlib.util.find_spec("pytest") is None:
        print(f"test_tiers: pytest is not installed for {sys.executable}; run `bash scripts/run.sh nox -s tests` "
              "or set PYTHON to an interpreter with the [test] extras", file=sys.stderr)
        return 2
    try:
        results = execute(runs, gpus, root)
    except gpu_slots.SlotTimeout as e:
        print(f"test_tiers: {e}", file=sys.stderr)
        return 75
    return summarize(tier, platform, why, results, results_dir, notes)


if __name__ == "__main__":
    sys.exit(main())
