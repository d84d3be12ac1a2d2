"""The slot speed-up measurement (python3 -m jatools.testing.speedup; docs/testing.md).

The pr tier's GPU tests with N xdist workers (one GPU each) vs 1, with the tier's own pytest command (plan)
and retries off: untimed warm-up rounds, then timed rounds, the N-worker run first in each (a warm-cache
effect left favours the 1-worker run). Every worker of the N-worker run must have seen exactly one GPU, none
shared. Each run's wall time is split by the workers' records into start (launch to the first test), tests
(first test started to last ended) and end (last test ended to exit): start and end are paid once per run,
so they bound the wall-time speed-up.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from jatools import atomic_write
from jatools.config import REPO_ROOT
from jatools.testing import gpu_slots
from jatools.testing.tiers import RESULTS_DIR, PytestRun, choose_platform, plan

SPEEDUP_GOAL = 1.8


def check_pinning(records: list[dict], workers: int) -> list[str]:
    """Problems with how the workers were pinned (empty when each saw exactly one, different, GPU)."""
    problems = [f"{len(records)} worker records for {workers} workers"] if len(records) != workers else []
    gpus = [r["gpu"] for r in records]
    if len(set(gpus)) != len(gpus):
        problems.append(f"workers shared a GPU: {gpus}")
    for r in records:
        devs = r.get("jax_devices")
        if devs is None:
            problems.append(f"{r['worker']}: JAX never started (no GPU test ran there?)")
        elif len(devs) != 1:
            problems.append(f"{r['worker']}: JAX saw {len(devs)} devices ({devs}), expected exactly 1")
    return problems


def phases(records: list[dict], launched: float, ended: float) -> dict | None:
    """Split a run's wall time (time.time() at launch and exit) by its workers' first and last test; None when
    no worker recorded a test."""
    ran = [r["tests"] for r in records if (r.get("tests") or {}).get("count")]
    if not ran:
        return None
    first, last = min(t["first_start"] for t in ran), max(t["last_end"] for t in ran)
    return {"start": round(first - launched, 2), "tests": round(last - first, 2), "end": round(ended - last, 2)}


def timed_run(run: PytestRun, root: Path, records: Path) -> dict:
    env = {**os.environ, **run.env, gpu_slots.RECORD_ENV: str(records)}
    # one clock (time.time(), the workers' test records' own) for the run's seconds and its phases, so that
    # start + tests + end is the run's wall time whatever the two clocks did in between
    launched = time.time()
    proc = subprocess.run(list(run.argv), cwd=root, env=env, capture_output=True, text=True, check=False)
    ended = time.time()
    seconds = ended - launched
    sys.stdout.write("\n".join(proc.stdout.splitlines()[-4:]) + "\n")
    recs = [json.loads(p.read_text()) for p in sorted(records.glob("*.json"))]
    tail = "\n".join(proc.stdout.strip().splitlines()[-3:])
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected|rerun)", tail)}
    return {"rc": proc.returncode, "seconds": round(seconds, 2), "counts": counts, "workers_seen": recs,
            "phases": phases(recs, launched, ended), "output_tail": proc.stdout[-4000:] + proc.stderr[-2000:]}


def phase_summary(timed: list[dict], workers: int) -> dict | None:
    """Median start / tests / end of the 1- and N-worker runs, the test phase's speed-up, and the bound
    start and end put on the wall-time speed-up. None unless every timed run has its phases."""
    if not timed or any(x["phases"] is None for x in timed):
        return None
    med = {n: {k: round(statistics.median(x["phases"][k] for x in timed if x["workers"] == n), 2)
               for k in ("start", "tests", "end")} for n in (1, workers)}
    one, par = med[1], med[workers]
    fixed = {n: round(med[n]["start"] + med[n]["end"], 2) for n in (1, workers)}
    return {"median_1_worker": one, f"median_{workers}_workers": par,
            "start_end_1_worker": fixed[1], f"start_end_{workers}_workers": fixed[workers],
            "test_phase_speedup": round(one["tests"] / par["tests"], 3) if par["tests"] else None,
            "wall_speedup_bound": round((fixed[1] + one["tests"]) / (fixed[1] + one["tests"] / workers), 3)}


def round_speedups(timed: list[dict], workers: int) -> list[float]:
    """Each timed round's own speed-up (its 1-worker run over its N-worker run), in round order: the
    spread shows how much of a difference between medians the host's run-to-run noise could make."""
    by_round: dict[int, dict[int, float]] = {}
    for x in timed:
        by_round.setdefault(x["round"], {})[x["workers"]] = x["seconds"]
    return [round(r[1] / r[workers], 3) for _, r in sorted(by_round.items()) if r.get(workers)]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python3 -m jatools.testing.speedup", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    p.add_argument("--workers", type=int, default=2, help="workers of the parallel run, one GPU each (2)")
    p.add_argument("--repeats", type=int, default=1, help="rounds of (N workers, 1 worker); medians are compared")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds first, not in the medians (1)")
    p.add_argument("--tier", default="pr", help="tier whose single-device run is timed (pr)")
    p.add_argument("--platform", default=None, help="cuda | rocm (default: detected)")
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "slot_speedup.json")
    return p


def _rounds(a: argparse.Namespace, platform: str, gpus: gpu_slots.Gpus, pytest_args: list[str]) -> list[dict]:
    """Every round's N-worker and 1-worker runs, timed, warm-up rounds first."""
    rounds = []
    for r in range(a.warmup + a.repeats):
        warmup = r < a.warmup
        label = f"warm-up {r + 1}" if warmup else f"round {r - a.warmup + 1}"
        for n in (a.workers, 1):
            (run,) = [x for x in plan(a.tier, platform, gpus, pytest_args, workers=n, reruns=0,
                                      results_dir=REPO_ROOT / RESULTS_DIR) if x.kind == "single"]
            print(f"measure_slot_speedup: {label}, {n} worker(s): {run.command_line()}", flush=True)
            with tempfile.TemporaryDirectory(prefix="ja-slots-") as tmp:
                res = timed_run(run, REPO_ROOT, Path(tmp))
            res.update(workers=n, round=r - a.warmup + 1, warmup=warmup, label=label, command=run.command_line(),
                       pinning_problems=check_pinning(res["workers_seen"], n))
            rounds.append(res)
    return rounds


def _print_summary(result: dict, gpus_how: str) -> None:
    n_w, rounds, split, per_round = result["workers"], result["runs"], result["phases"], result["round_speedups"]
    t_1, t_n, speedup = result["seconds_1_worker"], result[f"seconds_{n_w}_workers"], result["speedup"]
    print(f"\n== slot speed-up, tier {result['tier']} on {result['platform']} ({gpus_how}) ==")
    for x in rounds:
        pins = ", ".join(f"{w['worker']}->GPU {w['gpu']} ({len(w.get('jax_devices') or [])} dev)"
                         for w in x["workers_seen"])
        ph = x["phases"]
        split_s = f" (start {ph['start']:.1f} + tests {ph['tests']:.1f} + end {ph['end']:.1f})" if ph else ""
        print(f"{x['workers']} worker(s) {x['label']}: {x['seconds']:.1f} s{split_s}, exit {x['rc']}, "
              f"{x['counts']}; {pins}")
    print(f"1 worker {t_1:.1f} s, {n_w} workers {t_n:.1f} s: speed-up {speedup:.2f}x (goal {SPEEDUP_GOAL}x)")
    print(f"each round's own speed-up: {', '.join(f'{r:.2f}x' for r in per_round)} "
          f"(from {min(per_round):.2f}x to {max(per_round):.2f}x)")
    if split:
        one, par = split["median_1_worker"], split[f"median_{n_w}_workers"]
        test_speedup = (f"{split['test_phase_speedup']:.2f}x" if split["test_phase_speedup"]
                        else "not measurable (test phase under 0.01 s)")
        print(f"test phase (first test started to last ended), medians: 1 worker {one['tests']:.1f} s, "
              f"{n_w} workers {par['tests']:.1f} s: {test_speedup}")
        print(f"start + end, paid once per run: {split['start_end_1_worker']:.1f} s with 1 worker, "
              f"{split[f'start_end_{n_w}_workers']:.1f} s with {n_w}; with the 1-worker start and end, a perfect "
              f"{n_w}-way split of its test phase gives at most {split['wall_speedup_bound']:.2f}x")
    for f in result["failures"]:
        print(f"FAILED: {f}")


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    a, pytest_args = p.parse_known_args(argv)
    if a.repeats < 1 or a.warmup < 0 or a.workers < 2:
        p.error("--repeats must be >= 1, --warmup >= 0 and --workers >= 2")
    n_w = a.workers
    gpus = gpu_slots.detect()
    platform, why = choose_platform(a.platform, dict(os.environ), gpus)
    if platform == "cpu" or gpus.count < n_w:
        print(f"measure_slot_speedup: needs {n_w} GPUs, found {gpus.count} ({gpus.how}); run it on the GPU host",
              file=sys.stderr)
        return 2
    rounds = _rounds(a, platform, gpus, pytest_args)
    timed = [x for x in rounds if not x["warmup"]]
    t_n = statistics.median(x["seconds"] for x in timed if x["workers"] == n_w)
    t_1 = statistics.median(x["seconds"] for x in timed if x["workers"] == 1)
    failures = [f"{x['workers']} worker(s), {x['label']}: exit {x['rc']}" for x in rounds if x["rc"] != 0]
    failures += [f"{x['workers']} worker(s), {x['label']}: {pr}" for x in rounds for pr in x["pinning_problems"]]
    speedup = t_1 / t_n if t_n else 0.0
    result = {"tier": a.tier, "platform": platform, "platform_how": why, "gpus": list(gpus.ids),
              "gpus_how": gpus.how, "workers": n_w, "repeats": a.repeats, "warmup": a.warmup,
              "seconds_1_worker": t_1, f"seconds_{n_w}_workers": t_n, "speedup": round(speedup, 3),
              "round_speedups": round_speedups(timed, n_w), "goal": SPEEDUP_GOAL,
              "met_goal": speedup >= SPEEDUP_GOAL and not failures, "phases": phase_summary(timed, n_w),
              "failures": failures, "runs": rounds}
    atomic_write.write_text(a.out, json.dumps(result, indent=1) + "\n")
    _print_summary(result, gpus.how)
    print(f"results: {a.out}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
