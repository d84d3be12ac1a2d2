#!/usr/bin/env python3
"""Summarise a MaxText-style training log over its last steps, compare with a baseline, and gate.

Step lines look like (any prefix before ``completed step`` is ignored)::

    completed step: 41, seconds: 1.512, TFLOP/s/device: 402.7, Tokens/s/device: 5421.9, total_weights: 65536, loss: 3.117

The summary covers the last ``--window`` distinct steps (early ones include compilation and warm-up). A
repeated step (a restarted run) keeps its later line and is reported; nan/inf losses are counted and listed,
never dropped silently, and loss means cover the finite values. ``--baseline`` (a summary this script wrote
with ``--json-out``) compares throughput and loss; ``--gate`` then fails on a throughput drop beyond
``--max-drop-pct`` or a non-finite loss in the window (a loss drift beyond ``--loss-warn-pct`` only warns).
The markdown table goes to ``$GITHUB_STEP_SUMMARY`` when set (and ``--markdown``), the JSON summary to stdout
(and ``--json-out``); docs/ci.md has the details.

Exit codes: 0 ok (gate passed, or no --gate); 1 gate failed; 2 input problem (log missing or unreadable, no
step lines, baseline missing or invalid, --gate without --baseline, bad arguments).
Standard library (and jatools.atomic_write) only, so it runs on any CI runner:
    python3 -m ci.perf.parse_perf_log LOG [--window 20] [--baseline B.json] [--gate]
"""  # noqa: E501 (the sample step line above is a log line, kept whole)
from __future__ import annotations

import argparse
import collections
import json
import math
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from jatools import atomic_write

SCHEMA = 1
EXIT_OK, EXIT_GATE_FAILED, EXIT_INPUT = 0, 1, 2

STEP_RE = re.compile(r"completed step:\s*(\d+)\s*,(.*)$")
FIELD_RE = re.compile(r"\s*([A-Za-z][\w/ .-]*?)\s*:\s*([^,]+?)\s*(?:,|$)")
# Keys as MaxText prints them -> our field names.
FIELDS = {"seconds": "seconds", "tflop/s/device": "tflops", "tokens/s/device": "tokens", "loss": "loss"}
# The summary's means (their order is the JSON's and the table's) -> field, and the table's label.
MEANS = {"mean_tflops_per_device": ("tflops", "mean TFLOP/s/device"), "mean_seconds": ("seconds", "mean seconds/step"),
         "mean_tokens_per_device": ("tokens", "mean Tokens/s/device"), "mean_loss": ("loss", "mean loss")}


class InputError(ValueError):
    """The log or baseline cannot be used; exit code 2."""


@dataclass
class Step:
    step: int
    seconds: float | None = None
    tflops: float | None = None
    tokens: float | None = None
    loss: float | None = None
    loss_text: str | None = None


@dataclass
class ParsedLog:
    steps: list[Step]
    lines_parsed: int
    repeated_steps: list[int]


def parse_line(line: str) -> Step | None:
    m = STEP_RE.search(line)
    if not m:
        return None
    step = Step(int(m.group(1)))
    for key, value in FIELD_RE.findall(m.group(2)):
        name = FIELDS.get(key.strip().lower())
        if name:
            try:
                setattr(step, name, float(value))  # accepts nan, inf, -inf
            except ValueError:
                setattr(step, name, None)
            if name == "loss":
                step.loss_text = value.strip()
    return step


def parse_log(path: Path) -> ParsedLog:
    """Every step line of the log; a later line for the same step replaces the earlier one."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        raise InputError(f"log {path} does not exist; pass the training job's log file") from None
    except OSError as e:
        raise InputError(f"cannot read log {path}: {e}") from None
    steps = [s for line in text.splitlines() if (s := parse_line(line))]
    by_step = {s.step: s for s in steps}  # the later line wins
    if not by_step:
        raise InputError(f"no step lines in {path} (expected lines containing 'completed step: N, seconds: S, "
                         "TFLOP/s/device: T, ... loss: L'); did the training job start?")
    repeated = sorted(n for n, count in collections.Counter(s.step for s in steps).items() if count > 1)
    return ParsedLog(sorted(by_step.values(), key=lambda s: s.step), len(steps), repeated)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def finite_number(v) -> bool:
    """A finite number (a baseline's field may hold anything: a string, a bool, a list)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def summarise(parsed: ParsedLog, window: int, log_name: str) -> dict:
    if window < 1:
        raise InputError(f"--window must be at least 1, got {window}")
    tail = parsed.steps[-window:]
    nonfinite = [s.step for s in parsed.steps if s.loss is not None and not math.isfinite(s.loss)]
    last = parsed.steps[-1]
    return {"schema": SCHEMA, "log": log_name, "lines_parsed": parsed.lines_parsed, "steps_seen": len(parsed.steps),
            "first_step": parsed.steps[0].step, "final_step": last.step, "repeated_steps": parsed.repeated_steps,
            "window": {"requested": window, "steps": len(tail), "first_step": tail[0].step, "last_step": tail[-1].step},
            **{key: _mean([v for s in tail if finite_number(v := getattr(s, name))])
               for key, (name, _) in MEANS.items()},
            "final_loss": last.loss if finite_number(last.loss) else None, "final_loss_text": last.loss_text,
            "nonfinite_loss": {"count": len(nonfinite), "steps": nonfinite,
                               "in_window": sum(s.step in nonfinite for s in tail)}}


def load_baseline(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"baseline {path} does not exist; write one with "
                         f"`python3 -m ci.perf.parse_perf_log LOG --json-out {path}` from a good run") from None
    except (OSError, json.JSONDecodeError) as e:
        raise InputError(f"baseline {path} is not readable JSON: {e}") from None
    if not isinstance(data, dict) or not finite_number(data.get("mean_tflops_per_device")):
        raise InputError(f"baseline {path} has no numeric mean_tflops_per_device; it must be a summary "
                         "written by parse_perf_log.py --json-out")
    return data


def _pct(cur: float | None, base: float | None) -> float | None:
    if not (finite_number(cur) and finite_number(base)) or base == 0:
        return None
    return (cur - base) / abs(base) * 100.0


def compare(summary: dict, baseline: dict, max_drop_pct: float, loss_warn_pct: float) -> dict:
    """Throughput change and loss drift against the baseline, with the failures and warnings they imply."""
    tput = _pct(summary["mean_tflops_per_device"], baseline.get("mean_tflops_per_device"))
    drift = _pct(summary["mean_loss"], baseline.get("mean_loss"))
    failures, warnings = [], []
    if tput is None:
        failures.append("no finite TFLOP/s/device values in the window to compare")
    elif -tput > max_drop_pct:
        failures.append(f"throughput dropped {-tput:.2f}% (limit {max_drop_pct:g}%): "
                        f"{summary['mean_tflops_per_device']:.3f} vs baseline {baseline['mean_tflops_per_device']:.3f} "
                        "TFLOP/s/device")
    if summary["nonfinite_loss"]["in_window"]:
        failures.append(f"{summary['nonfinite_loss']['in_window']} step(s) in the window have a non-finite loss "
                        f"(steps {summary['nonfinite_loss']['steps']})")
    if drift is not None and abs(drift) > loss_warn_pct:
        warnings.append(f"mean loss drifted {drift:+.2f}% from the baseline (warn above {loss_warn_pct:g}%): "
                        f"{summary['mean_loss']:.4f} vs {baseline['mean_loss']:.4f}")
    return {"throughput_change_pct": tput, "loss_drift_pct": drift, "max_drop_pct": max_drop_pct,
            "loss_warn_pct": loss_warn_pct, "failures": failures, "warnings": warnings}


def _fmt(v, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def markdown(summary: dict, baseline: dict | None, comparison: dict | None, gated: bool) -> str:
    """A table for the job summary page; the verdict line says gated or report-only."""
    base = baseline or {}
    rows = [(label, summary[key], base.get(key), _pct(summary[key], base.get(key)) if comparison else None)
            for key, (_, label) in MEANS.items()]
    rows.append(("final loss", summary["final_loss"] if summary["final_loss"] is not None
                 else summary["final_loss_text"], base.get("final_loss"), None))
    w = summary["window"]
    lines = [f"### Perf log: {summary['log']}", "",
             f"Window: steps {w['first_step']}..{w['last_step']} ({w['steps']} of {summary['steps_seen']} seen); "
             f"non-finite loss lines: {summary['nonfinite_loss']['count']}"
             + (f" (steps {summary['nonfinite_loss']['steps']})" if summary["nonfinite_loss"]["count"] else ""),
             "", "| metric | this run | baseline | change % |", "|---|---:|---:|---:|"]
    lines += [f"| {name} | {_fmt(cur)} | {_fmt(b)} | {_fmt(change, 2)} |" for name, cur, b, change in rows]
    if comparison:
        lines += ["", *(f"- :x: {f}" for f in comparison["failures"]),
                  *(f"- :warning: {wmsg}" for wmsg in comparison["warnings"])]
        verdict = ("FAILED" if comparison["failures"] else "passed") if gated else "report only (no --gate)"
        lines.append(f"\n**Gate: {verdict}**")
    return "\n".join(lines) + "\n"


def run(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m ci.perf.parse_perf_log", description=__doc__.splitlines()[0],
                                epilog="exit codes: 0 ok, 1 gate failed, 2 input problem")
    p.add_argument("log", type=Path, help="training log with 'completed step: N, ...' lines")
    p.add_argument("--window", type=int, default=20, help="tail steps summarised (default %(default)s)")
    p.add_argument("--baseline", type=Path, help="summary JSON of a reference run to compare with")
    p.add_argument("--gate", action="store_true", help="exit 1 when the comparison fails (needs --baseline)")
    p.add_argument("--max-drop-pct", type=float, default=5.0,
                   help="largest allowed throughput drop in percent (default %(default)g)")
    p.add_argument("--loss-warn-pct", type=float, default=2.0,
                   help="mean-loss drift in percent that warns (default %(default)g)")
    p.add_argument("--json-out", type=Path, help="also write the JSON summary here")
    p.add_argument("--markdown", type=Path, help="also write the markdown table here")
    try:
        args = p.parse_args(argv)
    except SystemExit as e:  # argparse exits 2 on bad arguments, matching EXIT_INPUT; run() returns it
        return int(e.code or 0)
    try:
        if args.gate and not args.baseline:
            raise InputError("--gate needs --baseline FILE (a summary JSON from a reference run)")
        summary = summarise(parse_log(args.log), args.window, args.log.name)
        baseline = load_baseline(args.baseline) if args.baseline else None
    except InputError as e:
        print(f"parse_perf_log: error: {e}", file=sys.stderr)
        return EXIT_INPUT
    comparison = compare(summary, baseline, args.max_drop_pct, args.loss_warn_pct) if baseline else None
    result = {**summary, "baseline": str(args.baseline) if args.baseline else None, "comparison": comparison,
              "gated": args.gate}
    text, md = json.dumps(result, indent=2), markdown(summary, baseline, comparison, args.gate)
    print(text)
    for path, content in ((args.json_out, text + "\n"), (args.markdown, md)):
        if path:
            atomic_write.write_text(path, content)
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary:
        with open(step_summary, "a") as f:
            f.write(md)
    nf = summary["nonfinite_loss"]
    if nf["count"]:
        print(f"parse_perf_log: {nf['count']} line(s) with non-finite loss at steps {nf['steps']}", file=sys.stderr)
    for wmsg in (comparison or {}).get("warnings", []):
        print(f"::warning::{wmsg}" if os.environ.get("GITHUB_ACTIONS") else f"parse_perf_log: warning: {wmsg}",
              file=sys.stderr)
    for fmsg in (comparison or {}).get("failures", []):
        print(f"parse_perf_log: {'FAIL' if args.gate else 'would fail'}: {fmsg}", file=sys.stderr)
    return EXIT_GATE_FAILED if args.gate and comparison and comparison["failures"] else EXIT_OK


if __name__ == "__main__":
    sys.exit(run())
