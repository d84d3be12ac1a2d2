#!/usr/bin/env python3
"""Tests for parse_perf_log.py: CPU-only, standard library and jatools only.

    python3 ci/perf/test_parse_perf_log.py      # self-runnable (the contract's name)
    python3 -m ci.perf.test_parse_perf_log      # the same
    pytest ci/perf/test_parse_perf_log.py       # collected by pytest too
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if __name__ == "__main__" and not __package__:
    # Run by its path (the contract's name): the same tests as `python3 -m ci.perf.test_parse_perf_log` from the
    # checkout root, where ci/ is a package (jatools/stages.py) and the import below resolves.
    os.chdir(ROOT)
    os.execv(sys.executable, [sys.executable, "-m", "ci.perf.test_parse_perf_log", *sys.argv[1:]])

from ci.perf import parse_perf_log as ppl  # after the re-run above


def step_line(n: int, seconds: float = 1.5, tflops: float = 400.0, loss: str = "3.0",
              prefix: str = "I1101 12:00:00.000 train.py:42] ") -> str:
    return (f"{prefix}completed step: {n}, seconds: {seconds}, TFLOP/s/device: {tflops}, "
            f"Tokens/s/device: {tflops * 10}, total_weights: 65536, loss: {loss}")


class PerfLogCase(unittest.TestCase):
    def setUp(self) -> None:
        self._tmp = tempfile.TemporaryDirectory()
        self.tmp = Path(self._tmp.name)

    def tearDown(self) -> None:
        self._tmp.cleanup()

    def write_log(self, lines: list[str], name: str = "train.log") -> Path:
        path = self.tmp / name
        path.write_text("\n".join(["starting training", "compiling...", *lines, "done"]) + "\n")
        return path

    def cli(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        full_env = {k: v for k, v in os.environ.items() if k not in ("GITHUB_STEP_SUMMARY", "GITHUB_ACTIONS")}
        full_env.update(env or {})
        return subprocess.run([sys.executable, "-m", "ci.perf.parse_perf_log", *args], check=False, capture_output=True,
                              text=True, env=full_env, cwd=ROOT)


class ParseTests(PerfLogCase):
    def test_tail_window_means(self) -> None:
        # Warm-up steps are slow and would skew the mean; the window leaves them out.
        lines = [step_line(i, seconds=30.0, tflops=10.0, loss="9.0") for i in range(3)]
        lines += [step_line(i, seconds=2.0, tflops=100.0 + i, loss=str(5.0 - 0.1 * i)) for i in range(3, 13)]
        s = ppl.summarise(ppl.parse_log(self.write_log(lines)), 4, "train.log")
        self.assertEqual(s["steps_seen"], 13)
        self.assertEqual(s["window"], {"requested": 4, "steps": 4, "first_step": 9, "last_step": 12})
        self.assertAlmostEqual(s["mean_tflops_per_device"], (109 + 110 + 111 + 112) / 4)
        self.assertAlmostEqual(s["mean_seconds"], 2.0)
        self.assertAlmostEqual(s["mean_loss"], sum(5.0 - 0.1 * i for i in range(9, 13)) / 4)
        self.assertAlmostEqual(s["final_loss"], 5.0 - 1.2)
        self.assertEqual(s["final_step"], 12)

    def test_window_larger_than_log(self) -> None:
        s = ppl.summarise(ppl.parse_log(self.write_log([step_line(1), step_line(2)])), 50, "x")
        self.assertEqual(s["window"]["steps"], 2)

    def test_nonfinite_losses_are_counted_not_dropped(self) -> None:
        lines = [step_line(1, loss="2.0"), step_line(2, loss="nan"), step_line(3, loss="inf"),
                 step_line(4, loss="-inf"), step_line(5, loss="1.5")]
        s = ppl.summarise(ppl.parse_log(self.write_log(lines)), 2, "x")
        self.assertEqual(s["nonfinite_loss"]["count"], 3)
        self.assertEqual(s["nonfinite_loss"]["steps"], [2, 3, 4])
        self.assertEqual(s["nonfinite_loss"]["in_window"], 1)  # window = steps 4, 5
        self.assertAlmostEqual(s["mean_loss"], 1.5)  # the finite value only

    def test_restarted_run_later_line_wins(self) -> None:
        lines = [step_line(1, tflops=1.0), step_line(2, tflops=1.0), step_line(2, tflops=200.0),
                 step_line(3, tflops=200.0)]
        parsed = ppl.parse_log(self.write_log(lines))
        self.assertEqual(parsed.repeated_steps, [2])
        self.assertEqual(parsed.lines_parsed, 4)
        s = ppl.summarise(parsed, 2, "x")
        self.assertAlmostEqual(s["mean_tflops_per_device"], 200.0)

    def test_line_without_prefix_and_extra_fields(self) -> None:
        step = ppl.parse_line("completed step: 7, seconds: 0.5, TFLOP/s/device: 12.5, loss: 2.25, perplexity: 9.4")
        self.assertEqual((step.step, step.seconds, step.tflops, step.loss), (7, 0.5, 12.5, 2.25))
        self.assertIsNone(step.tokens)

    def test_no_step_lines_is_input_error(self) -> None:
        with self.assertRaises(ppl.InputError) as ctx:
            ppl.parse_log(self.write_log(["loss went down", "completed nothing"]))
        self.assertIn("no step lines", str(ctx.exception))


class CompareTests(PerfLogCase):
    def summary(self, tflops: float, loss: float, nan_in_window: bool = False) -> dict:
        lines = [step_line(i, tflops=tflops, loss=str(loss)) for i in range(5)]
        if nan_in_window:
            lines.append(step_line(5, tflops=tflops, loss="nan"))
        return ppl.summarise(ppl.parse_log(self.write_log(lines)), 3, "x")

    def test_drop_beyond_limit_fails(self) -> None:
        base = self.summary(400.0, 3.0)
        c = ppl.compare(self.summary(370.0, 3.0), base, max_drop_pct=5.0, loss_warn_pct=2.0)
        self.assertAlmostEqual(c["throughput_change_pct"], -7.5)
        self.assertEqual(len(c["failures"]), 1)
        self.assertIn("throughput dropped 7.50%", c["failures"][0])

    def test_drop_within_limit_and_gain_pass(self) -> None:
        base = self.summary(400.0, 3.0)
        self.assertEqual(ppl.compare(self.summary(390.0, 3.0), base, 5.0, 2.0)["failures"], [])
        self.assertEqual(ppl.compare(self.summary(480.0, 3.0), base, 5.0, 2.0)["failures"], [])

    def test_loss_drift_warns_only(self) -> None:
        c = ppl.compare(self.summary(400.0, 3.3), self.summary(400.0, 3.0), 5.0, 2.0)
        self.assertEqual(c["failures"], [])
        self.assertEqual(len(c["warnings"]), 1)
        self.assertAlmostEqual(c["loss_drift_pct"], 10.0)

    def test_nonfinite_loss_in_window_fails(self) -> None:
        c = ppl.compare(self.summary(400.0, 3.0, nan_in_window=True), self.summary(400.0, 3.0), 5.0, 2.0)
        self.assertTrue(any("non-finite" in f for f in c["failures"]))


class CliTests(PerfLogCase):
    def baseline(self, tflops: float = 400.0) -> Path:
        log = self.write_log([step_line(i, tflops=tflops) for i in range(10)], "base.log")
        out = self.tmp / "baseline.json"
        r = self.cli(str(log), "--json-out", str(out))
        self.assertEqual(r.returncode, 0, r.stderr)
        return out

    def test_missing_log_exits_2(self) -> None:
        r = self.cli(str(self.tmp / "nope.log"))
        self.assertEqual(r.returncode, 2)
        self.assertIn("does not exist", r.stderr)

    def test_run_returns_2_on_bad_arguments(self) -> None:
        # in-process callers (ci/convergence/train_tiny.py) read run()'s exit code; argparse's exit must not escape
        with contextlib.redirect_stderr(io.StringIO()) as err:
            self.assertEqual(ppl.run(["--no-such-option"]), ppl.EXIT_INPUT)
        self.assertIn("the following arguments are required: log", err.getvalue())

    def test_no_step_lines_exits_2(self) -> None:
        r = self.cli(str(self.write_log(["nothing here"])))
        self.assertEqual(r.returncode, 2)
        self.assertIn("no step lines", r.stderr)

    def test_gate_without_baseline_exits_2(self) -> None:
        r = self.cli(str(self.write_log([step_line(1)])), "--gate")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--gate needs --baseline", r.stderr)

    def test_invalid_baseline_exits_2(self) -> None:
        bad = self.tmp / "bad.json"
        bad.write_text("{not json")
        r = self.cli(str(self.write_log([step_line(1)])), "--baseline", str(bad))
        self.assertEqual(r.returncode, 2)

    def test_non_numeric_baseline_fields_exit_2_or_are_not_compared(self) -> None:
        log = str(self.write_log([step_line(i) for i in range(5)]))
        base = json.loads(self.baseline(400.0).read_text())
        for value in ("fast", True, [400.0]):
            bad = self.tmp / "bad_tflops.json"
            bad.write_text(json.dumps({**base, "mean_tflops_per_device": value}))
            r = self.cli(log, "--baseline", str(bad), "--gate")
            self.assertEqual(r.returncode, 2, (value, r.stderr))
            self.assertIn("no numeric mean_tflops_per_device", r.stderr)
            self.assertNotIn("Traceback", r.stderr)
        odd = self.tmp / "odd_loss.json"
        odd.write_text(json.dumps({**base, "mean_loss": "3.0"}))
        r = self.cli(log, "--baseline", str(odd), "--gate")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIsNone(json.loads(r.stdout)["comparison"]["loss_drift_pct"])

    def test_gate_fails_with_exit_1_and_writes_summary(self) -> None:
        base = self.baseline(400.0)
        log = self.write_log([step_line(i, tflops=300.0) for i in range(10)])
        summary = self.tmp / "step_summary.md"
        r = self.cli(str(log), "--baseline", str(base), "--gate", env={"GITHUB_STEP_SUMMARY": str(summary)})
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("throughput dropped 25.00%", r.stderr)
        md = summary.read_text()
        self.assertIn("| mean TFLOP/s/device | 300.000 | 400.000 | -25.00 |", md)
        self.assertIn("**Gate: FAILED**", md)
        self.assertEqual(json.loads(r.stdout)["comparison"]["throughput_change_pct"], -25.0)

    def test_same_drop_without_gate_exits_0(self) -> None:
        base = self.baseline(400.0)
        log = self.write_log([step_line(i, tflops=300.0) for i in range(10)])
        r = self.cli(str(log), "--baseline", str(base))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("would fail", r.stderr)

    def test_gate_passes_and_reports_nan_lines(self) -> None:
        base = self.baseline(400.0)
        log = self.write_log([step_line(0, loss="nan")] + [step_line(i, tflops=401.0) for i in range(1, 30)])
        md = self.tmp / "table.md"
        r = self.cli(str(log), "--baseline", str(base), "--gate", "--markdown", str(md))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("1 line(s) with non-finite loss at steps [0]", r.stderr)
        self.assertIn("non-finite loss lines: 1 (steps [0])", md.read_text())
        self.assertIn("**Gate: passed**", md.read_text())


if __name__ == "__main__":
    unittest.main(verbosity=1)
