"""Measure what GPU slots buy: the pr tier's GPU tests with N xdist workers (one GPU each) vs 1, in one run.

    python3 ci/measure_slot_speedup.py [--workers 2] [--repeats 1] [--out F] [pytest args]

Both runs use the same pytest command the pr tier uses (jatools.testing.tiers.plan),
with retries off. Each worker records its slot and the devices JAX showed it
(jatools.testing.pytest_plugin), and the run fails unless every worker of the
N-worker run saw exactly one GPU and no two workers shared one. Untimed
warm-up rounds go first (--warmup, default 1: the first run after a build
starts on cold caches and was measured slower; it also records the durations
the runs' --longest-first orders by); then the N-worker run goes first in each round,
so any warm-cache effect left favours the 1-worker run (the reported speed-up
is not flattered). Writes a JSON with every run, warm-ups marked, and each
round's own speed-up next to the one the medians give.

Each run's wall time is also split by the workers' records into start (launch
to the first test), tests (first test started to last test ended, over all
workers) and end (last test ended to exit). Start and end are paid once per
run whatever the number of workers (process start, JAX import, collection,
backend start; reports and exit), so they bound the wall-time speed-up: the
summary gives the test phase's own speed-up and the most a perfect N-way split
of the 1-worker test phase could give with the 1-worker start and end.
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

from jatools import atomic_write, config
from jatools.testing import gpu_slots, tiers

GOAL = 1.8


def _counts(output: str) -> dict[str, int]:
    tail = "\n".join(output.strip().splitlines()[-3:])
    return {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected|rerun)", tail)}


def check_pinning(records: list[dict], workers: int) -> list[str]:
    """Problems with how the workers were pinned (empty when each saw exactly one, different, GPU)."""
    problems = []
    if len(records) != workers:
        problems.append(f"{len(records)} worker records for {workers} workers")
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
    """Split a run's wall time (time.time() at launch and exit) by its workers' first and last test.

    None when no worker recorded a test.
    """
    ran = [r["tests"] for r in records if (r.get("tests") or {}).get("count")]
    if not ran:
        return None
    first, last = min(t["first_start"] for t in ran), max(t["last_end"] for t in ran)
    return {"start": round(first - launched, 2), "tests": round(last - first, 2), "end": round(ended - last, 2)}


def timed_run(run: tiers.PytestRun, root: Path, records: Path) -> dict:
    env = {**os.environ, **run.env, gpu_slots.RECORD_ENV: str(records)}
    launched, start = time.time(), time.monotonic()
    proc = subprocess.run(list(run.argv), cwd=root, env=env, capture_output=True, text=True, check=False)
    seconds, ended = time.monotonic() - start, time.time()
    sys.stdout.write("\n".join(proc.stdout.splitlines()[-4:]) + "\n")
    recs = [json.loads(p.read_text()) for p in sorted(records.glob("*.json"))]
    return {"rc": proc.returncode, "seconds": round(seconds, 2), "counts": _counts(proc.stdout), "workers_seen": recs,
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
    by_round = {}
    for x in timed:
        by_round.setdefault(x["round"], {})[x["workers"]] = x["seconds"]
    return [round(r[1] / r[workers], 3) for _, r in sorted(by_round.items()) if r.get(workers)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 ci/measure_slot_speedup.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    p.add_argument("--workers", type=int, default=2, help="workers of the parallel run, one GPU each (2)")
    p.add_argument("--repeats", type=int, default=1, help="rounds of (N workers, 1 worker); medians are compared")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds first, not in the medians (1)")
    p.add_argument("--tier", default="pr", help="tier whose single-device run is timed (pr)")
    p.add_argument("--platform", default=None, help="cuda | rocm (default: detected)")
    p.add_argument("--out", type=Path, default=Path("build/test-results/slot_speedup.json"))
    a, pytest_args = p.parse_known_args(argv)
    if a.repeats < 1 or a.warmup < 0 or a.workers < 2:
        p.error("--repeats must be >= 1, --warmup >= 0 and --workers >= 2")
    root = config.REPO_ROOT
    gpus = gpu_slots.detect()
    platform, why = tiers.choose_platform(a.platform, dict(os.environ), gpus)
    if platform == "cpu" or gpus.count < a.workers:
        print(f"slot_speedup: needs {a.workers} GPUs, found {gpus.count} ({gpus.how}); run it on the GPU host",
              file=sys.stderr)
        return 2
    rounds = []
    for r in range(a.warmup + a.repeats):
        warmup = r < a.warmup
        label = f"warm-up {r + 1}" if warmup else f"round {r - a.warmup + 1}"
        for n in (a.workers, 1):
            (run,) = [x for x in tiers.plan(a.tier, platform, gpus, pytest_args, workers=n, reruns=0,
                                                 results_dir=root / tiers.RESULTS_DIR) if x.kind == "single"]
            print(f"slot_speedup: {label}, {n} worker(s): {run.command_line()}", flush=True)
            with tempfile.TemporaryDirectory(prefix="ja-slots-") as tmp:
                res = timed_run(run, root, Path(tmp))
            res.update(workers=n, round=r - a.warmup + 1, warmup=warmup, label=label, command=run.command_line(),
                       pinning_problems=check_pinning(res["workers_seen"], n))
            rounds.append(res)
    timed = [x for x in rounds if not x["warmup"]]
    t_n = statistics.median(x["seconds"] for x in timed if x["workers"] == a.workers)
    t_1 = statistics.median(x["seconds"] for x in timed if x["workers"] == 1)
    failures = [f"{x['workers']} worker(s), {x['label']}: exit {x['rc']}" for x in rounds if x["rc"] != 0]
    failures += [f"{x['workers']} worker(s), {x['label']}: {pr}" for x in rounds for pr in x["pinning_problems"]]
    speedup = t_1 / t_n if t_n else 0.0
    split = phase_summary(timed, a.workers)
    per_round = round_speedups(timed, a.workers)
    result = {"tier": a.tier, "platform": platform, "platform_how": why, "gpus": list(gpus.ids), "gpus_how": gpus.how,
              "workers": a.workers, "repeats": a.repeats, "warmup": a.warmup, "seconds_1_worker": t_1, f"seconds_{a.workers}_workers": t_n,
              "speedup": round(speedup, 3), "round_speedups": per_round, "goal": GOAL, "met_goal": speedup >= GOAL and not failures,
              "phases": split, "failures": failures, "runs": rounds}
    atomic_write.write_text(a.out, json.dumps(result, indent=1) + "\n")
    print(f"\n== slot speed-up, tier {a.tier} on {platform} ({gpus.how}) ==")
    for x in rounds:
        pins = ", ".join(f"{w['worker']}->GPU {w['gpu']} ({len(w.get('jax_devices') or [])} dev)" for w in x["workers_seen"])
        ph = x["phases"]
        split_s = f" (start {ph['start']:.1f} + tests {ph['tests']:.1f} + end {ph['end']:.1f})" if ph else ""
        print(f"{x['workers']} worker(s) {x['label']}: {x['seconds']:.1f} s{split_s}, exit {x['rc']}, {x['counts']}; {pins}")
    print(f"1 worker {t_1:.1f} s, {a.workers} workers {t_n:.1f} s: speed-up {speedup:.2f}x (goal {GOAL}x)")
    print(f"each round's own speed-up: {', '.join(f'{r:.2f}x' for r in per_round)} "
          f"(from {min(per_round):.2f}x to {max(per_round):.2f}x)")
    if split:
        one, par = split["median_1_worker"], split[f"median_{a.workers}_workers"]
        print(f"test phase (first test started to last ended), medians: 1 worker {one['tests']:.1f} s, "
              f"{a.workers} workers {par['tests']:.1f} s: " + (f"{split['test_phase_speedup']:.2f}x" if split["test_phase_speedup"]
                                                               else "not measurable (test phase under 0.01 s)"))
        print(f"start + end, paid once per run: {split['start_end_1_worker']:.1f} s with 1 worker, "
              f"{split[f'start_end_{a.workers}_workers']:.1f} s with {a.workers}; with the 1-worker start and end, a perfect "
              f"{a.workers}-way split of its test phase gives at most {split['wall_speedup_bound']:.2f}x")
    for f in failures:
        print(f"FAILED: {f}")
    print(f"results: {a.out}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
