#!/usr/bin/env python3
"""Gate the GPU kernel benchmark's JSON against a committed baseline per GPU model.

    python3 -m ci.perf.bench_gate build/bench/gpu.json             # gate (exit 1 names each regression)
    python3 -m ci.perf.bench_gate --make-baseline RUN1.json RUN2.json [RUN3.json ...]
    python3 -m ci.perf.bench_gate --add-cases RUN1.json RUN2.json [RUN3.json ...]

The benchmark (benchmarks/gpu/bench_gpu.py; `nox -s bench -- gpu --quick --gate` runs both) times every
case as a median of device-side events; our kernel's time (``ours_ms``) is gated against
ci/perf/baselines/<gpu model>.json (e.g. nvidia-h200.json, from the JSON's ``machine.device``). A
baseline is made from two or more runs of the same benchmark command on that GPU: each case keeps the
median of their times and a noise band, ``max(floor, 3 x the relative spread between the runs)``. A case
slower than baseline x (1 + band) fails the gate and is named, with both times; a case of the baseline
missing from the results fails too (the cases changed: make a new baseline); new cases are listed, not gated.
--add-cases gives the committed baseline the cases of two or more newer runs that it lacks and leaves its own
cases as they are: new rows become gated without a slowdown of the old ones becoming the new normal.

Exit codes: 0 passed, 1 a regression, 2 input problem (no baseline for this GPU model, unreadable JSON).
A markdown table goes to $GITHUB_STEP_SUMMARY when set. Standard library (and jatools.atomic_write) only:
it runs on any CI runner.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
from pathlib import Path

from ci.perf.parse_perf_log import finite_number
from jatools import atomic_write

ROOT = Path(__file__).resolve().parents[2]

BASELINES = ROOT / "ci" / "perf" / "baselines"
SCHEMA = 1
FLOOR_PCT = 5.0
SPREAD_FACTOR = 3.0
EXIT_OK, EXIT_REGRESSION, EXIT_INPUT = 0, 1, 2
MAKE_CMD = "python3 -m ci.perf.bench_gate --make-baseline RUN1.json RUN2.json"
ADD_CMD = "python3 -m ci.perf.bench_gate --add-cases RUN1.json RUN2.json"


class InputError(ValueError):
    """A results or baseline file cannot be used; exit 2."""


def model_slug(device: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")


def cases(results: dict) -> dict[str, float]:
    """{case name: our kernel's median ms} from a bench_gpu.py JSON."""
    out = {}
    for r in results.get("memory_bound", []) + results.get("chains", []):
        out[f"{r['name']} {'x'.join(map(str, r['shape']))} {r.get('dtype', '')}".strip()] = r["ours_ms"]
    for r in results.get("decode", []):
        name = f"decode b{r['batch']} hq{r['heads_q']} hkv{r['heads_kv']} sk{r['seq_k']}"
        out[name] = r["ours_ms"]
        for sub in ("cp_async", "merge_kernel"):  # the kernel with one sm_90 sub-path off (TMA, cluster merge)
            if isinstance(r.get(f"ours_{sub}_ms"), (int, float)):
                out[f"{name} {sub}"] = r[f"ours_{sub}_ms"]
    for r in results.get("attention", []):
        # head dim and batch named where they differ from the first gated rows' (head dim 128, batch 4)
        d, b = r.get("head_dim", 128), r.get("batch", 4)
        out[f"{r['name']}{'' if d == 128 else f' d{d}'}{'' if b == 4 else f' b{b}'} seq{r['seq']} "
            f"{'causal' if r['causal'] else 'full'}"] = r["ours_ms"]
    for r in results.get("features", []):  # issue 56's feature rows: our time of the row's case ("ms")
        if isinstance(r.get("ms"), (int, float)):
            out[f"features {r['case']}"] = r["ms"]
    for r in results.get("model", []):  # host-timed ms per step of the whole model built from our ops
        out[f"model {r['name']}"] = r["ours_ms"]
    return out


def load(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise InputError(f"cannot read {path}: {e}") from None


def kernel_source(results: dict) -> str | None:
    """The kernel source revision a run timed ("+dirty" for an uncommitted tree), from its build provenance
    (benchmarks/gpu/gpu_provenance.build_provenance); None for a run that did not record one."""
    ident = (results["machine"].get("build") or {}).get("identity") or {}
    rev = ident.get("kernel_source_revision")
    return rev and rev[:12] + ("+dirty" if ident.get("kernel_source_dirty") else "")


def make_baseline(runs: list[dict], sources: list[str]) -> dict:
    """The baseline of two or more runs on one GPU model: per case the median time and the noise band."""
    if len(runs) < 2:
        raise InputError(f"a baseline needs two or more runs of the benchmark (the noise band is measured "
                         f"between them); got {len(runs)}: {MAKE_CMD}")
    cut = [src for r, src in zip(runs, sources) if r.get("partial")]
    if cut:
        raise InputError(f"{', '.join(cut)}: a run cut short (\"partial\": true, its later sections missing) makes "
                         f"no baseline; run the benchmark through: {MAKE_CMD}")
    devices = {r["machine"]["device"] for r in runs}
    if len(devices) != 1:
        raise InputError(f"the runs come from different GPU models ({', '.join(sorted(devices))})")
    per_run = [cases(r) for r in runs]
    names = sorted(set.intersection(*(set(c) for c in per_run)))
    out = {}
    for name in names:
        times = [c[name] for c in per_run]
        med = statistics.median(times)
        spread = 100.0 * (max(times) - min(times)) / med
        out[name] = {"ms": round(med, 6), "runs_ms": [round(t, 6) for t in times],
                     "band_pct": round(max(FLOOR_PCT, SPREAD_FACTOR * spread), 2)}
    gpu = (runs[0]["machine"].get("gpu_before", {}).get("gpus") or [{}])[0]
    return {"schema": SCHEMA, "device": devices.pop(), "made_from": sources,
            "provenance": {"jax": runs[0]["machine"].get("jax"), "driver": gpu.get("driver_version"),
                           "sm_clock_mhz": gpu.get("clocks.sm"), "power_limit_w": gpu.get("power.limit"),
                           **({"kernel_source": timed} if (timed := sorted(set(filter(None, map(kernel_source, runs)))))
                              else {})},
            "band": f"max({FLOOR_PCT}%, {SPREAD_FACTOR} x the spread between the runs)", "cases": out}


def add_cases(base: dict, runs: list[dict], sources: list[str]) -> dict:
    """The baseline `base` with the cases of these runs that it lacks, each measured as make_baseline measures
    (the median and band of these runs). Its own cases keep their times, so a slowdown of one since the
    baseline was made stays a gated regression. The runs and the cases they added are recorded in
    "added_from"."""
    made = make_baseline(runs, sources)
    if made["device"] != base["device"]:
        raise InputError(f"the runs come from {made['device']}, the baseline is {base['device']}'s")
    new = {name: case for name, case in made["cases"].items() if name not in base["cases"]}
    if not new:
        raise InputError(f"these runs have no case the baseline lacks; to remeasure its cases: {MAKE_CMD}")
    return {**base, "cases": dict(sorted({**base["cases"], **new}.items())),
            "added_from": [*base.get("added_from", []),
                           {"runs": sources, "provenance": made["provenance"], "cases": sorted(new)}]}


def gate(results: dict, baseline: dict) -> dict:
    """Compare one run with the baseline: regressions (named), missing and new cases."""
    got = cases(results)
    rows, regressions = [], []
    missing = [name for name in baseline["cases"] if name not in got]
    for name, base in baseline["cases"].items():
        if name not in got:
            continue
        if not (finite_number(base.get("ms")) and base["ms"] > 0
                and finite_number(base.get("band_pct")) and base["band_pct"] >= 0):
            raise InputError(f"baseline case {name!r} needs a positive number ms and a band_pct >= 0, got "
                             f"ms={base.get('ms')!r}, band_pct={base.get('band_pct')!r}; remake it: {MAKE_CMD}")
        change = 100.0 * (got[name] - base["ms"]) / base["ms"]
        bad = change > base["band_pct"]
        rows.append({"case": name, "ms": got[name], "baseline_ms": base["ms"], "change_pct": round(change, 2),
                     "band_pct": base["band_pct"], "regression": bad})
        if bad:
            regressions.append(f"{name}: {got[name]:.4f} ms against the baseline's {base['ms']:.4f} ms "
                               f"({change:+.1f}%, band {base['band_pct']:.1f}%)")
    return {"device": results["machine"]["device"], "kernel_source": kernel_source(results),
            "baseline_kernel_source": baseline.get("provenance", {}).get("kernel_source"),
            "rows": rows, "regressions": regressions, "missing": missing,
            "new": sorted(set(got) - set(baseline["cases"])), "passed": not regressions and not missing}


def markdown(verdict: dict) -> str:
    lines = [f"### GPU kernel benchmark gate ({verdict['device']}): {'passed' if verdict['passed'] else 'FAILED'}",
             "", "| case | ms | baseline ms | change | band |", "|---|---|---|---|---|"]
    for r in verdict["rows"]:
        flag = " **regression**" if r["regression"] else ""
        lines.append(f"| {r['case']} | {r['ms']:.4f} | {r['baseline_ms']:.4f} | {r['change_pct']:+.1f}%{flag} | "
                     f"{r['band_pct']:.1f}% |")
    lines += [f"- missing from the results: {m}" for m in verdict["missing"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", type=Path, nargs="+", help="bench_gpu.py JSON (several with --make-baseline)")
    p.add_argument("--baselines", type=Path, default=BASELINES, help="folder of <gpu model>.json baselines")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--make-baseline", action="store_true", help="write the baseline of these runs' GPU model")
    mode.add_argument("--add-cases", action="store_true",
                      help="add these runs' cases that the committed baseline lacks (its own cases unchanged)")
    p.add_argument("--json-out", type=Path, help="also write the verdict here")
    a = p.parse_args(argv)
    try:
        runs = [load(r) for r in a.results]
        if a.make_baseline:
            base = make_baseline(runs, [str(r) for r in a.results])
            out = atomic_write.write_text(a.baselines / f"{model_slug(base['device'])}.json",
                                          json.dumps(base, indent=1) + "\n")
            print(f"bench_gate: wrote {out} ({len(base['cases'])} cases)")
            return EXIT_OK
        if len(runs) != 1 and not a.add_cases:
            raise InputError("gate one results file at a time")
        device = runs[0].get("machine", {}).get("device", "?")
        path = a.baselines / f"{model_slug(device)}.json"
        if not path.exists():
            raise InputError(f"no baseline for {device} ({path} is missing); run the benchmark twice on that GPU "
                             f"and commit the result of: {MAKE_CMD}")
        if a.add_cases:
            base = load(path)
            grown = add_cases(base, runs, [str(r) for r in a.results])
            atomic_write.write_text(path, json.dumps(grown, indent=1) + "\n")
            print(f"bench_gate: added {len(grown['cases']) - len(base['cases'])} cases to {path} (its "
                  f"{len(base['cases'])} unchanged)")
            return EXIT_OK
        verdict = gate(runs[0], load(path))
    except (InputError, KeyError) as e:
        print(f"bench_gate: {e if isinstance(e, InputError) else f'not a bench_gpu.py JSON: missing {e}'}",
              file=sys.stderr)
        return EXIT_INPUT
    for r in verdict["rows"]:
        print(f"{'REGRESSION' if r['regression'] else 'ok':<10} {r['case']:<40} {r['ms']:>9.4f} ms  "
              f"baseline {r['baseline_ms']:.4f}  {r['change_pct']:+6.1f}%  band {r['band_pct']:.1f}%")
    for m in verdict["missing"]:
        print(f"MISSING    {m}: in the baseline, not in the results (cases changed? {MAKE_CMD})")
    for n in verdict["new"]:
        print(f"new        {n}: not in the baseline, not gated")
    for line in verdict["regressions"]:
        print(f"bench_gate: regression: {line}", file=sys.stderr)
    if a.json_out:
        a.json_out.write_text(json.dumps(verdict, indent=1) + "\n")
    if os.environ.get("GITHUB_STEP_SUMMARY"):
        with open(os.environ["GITHUB_STEP_SUMMARY"], "a", encoding="utf-8") as f:
            f.write(markdown(verdict))
    print(f"bench_gate: {'passed' if verdict['passed'] else 'FAILED'} against {path} (this run timed kernel source "
          f"{verdict['kernel_source'] or 'not recorded'}; the baseline's: "
          f"{verdict['baseline_kernel_source'] or 'not recorded'})")
    return EXIT_OK if verdict["passed"] else EXIT_REGRESSION


if __name__ == "__main__":
    sys.exit(main())
