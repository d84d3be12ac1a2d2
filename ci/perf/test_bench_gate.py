#!/usr/bin/env python3
"""Tests for bench_gate.py on the committed H200 runs: CPU-only, standard library and jatools only.

    python3 -m ci.perf.test_bench_gate      # self-runnable, from the checkout root
    pytest ci/perf/test_bench_gate.py       # collected by pytest too
"""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

from ci.perf import bench_gate

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
BASELINE = HERE / "baselines" / "nvidia-h200.json"
# The runs the H200 baseline was made from, and the later runs that added cases to it ("added_from"), each
# with the cases it gave.
RUNS = [ROOT / p for p in json.loads(BASELINE.read_text())["made_from"]]
ADDED = [([ROOT / p for p in a["runs"]], a["cases"]) for a in json.loads(BASELINE.read_text()).get("added_from", [])]


class BenchGateTests(unittest.TestCase):
    def setUp(self) -> None:
        self._tmp = tempfile.TemporaryDirectory()
        self.tmp = Path(self._tmp.name)
        # The first run, with the rows it lacks of the runs that added cases: a run of every case at its baseline.
        self.run1 = json.loads(RUNS[0].read_text())
        for runs, _ in ADDED:
            newer = json.loads(runs[0].read_text())
            self.run1["features"] = self.run1.get("features", []) + newer.get("features", [])

    def tearDown(self) -> None:
        self._tmp.cleanup()

    def cli(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        full = {k: v for k, v in os.environ.items() if k != "GITHUB_STEP_SUMMARY"}
        full.update(env or {})
        return subprocess.run([sys.executable, "-m", "ci.perf.bench_gate", *args], capture_output=True, text=True,
                              env=full, cwd=ROOT, check=False)

    def write(self, data: dict, name: str) -> Path:
        path = self.tmp / name
        path.write_text(json.dumps(data))
        return path

    def test_the_committed_baseline_is_made_from_the_committed_h200_runs(self) -> None:
        self.assertGreaterEqual(len(RUNS), 2)
        committed = json.loads(BASELINE.read_text())
        made = bench_gate.make_baseline([json.loads(p.read_text()) for p in RUNS], committed["made_from"])
        for added in committed.get("added_from", []):
            made = bench_gate.add_cases(made, [json.loads((ROOT / p).read_text()) for p in added["runs"]],
                                        added["runs"])
        self.assertEqual(made, committed)
        self.assertEqual(committed["device"], "NVIDIA H200")
        for case in committed["cases"].values():
            spread = 100 * (max(case["runs_ms"]) - min(case["runs_ms"])) / case["ms"]
            self.assertGreaterEqual(case["band_pct"],
                                    max(bench_gate.FLOOR_PCT, bench_gate.SPREAD_FACTOR * spread) - 0.01)

    def test_each_committed_run_passes_the_cases_it_gave_the_baseline(self) -> None:
        base = json.loads(BASELINE.read_text())
        made = set(base["cases"]) - {c for _, cases in ADDED for c in cases}
        for runs, cases in [(RUNS, made), *ADDED]:
            own = {**base, "cases": {k: v for k, v in base["cases"].items() if k in cases}}
            for run in runs:
                verdict = bench_gate.gate(json.loads(run.read_text()), own)
                self.assertTrue(verdict["passed"], (run.name, verdict["regressions"], verdict["missing"]))
        self.assertEqual(self.cli(self.write(self.run1, "all.json").as_posix()).returncode, 0)

    def test_the_gate_names_the_kernel_sources_the_run_and_the_baseline_timed(self) -> None:
        """A run's build provenance (the kernel source revision of the libraries it timed) goes into a baseline made
        from it, and the gate's last line names both, so a slowdown is put on a build or ruled out at a glance."""
        def timed(run: dict, rev: str, dirty: bool) -> dict:
            run = copy.deepcopy(run)
            run["machine"]["build"] = {"identity": {"kernel_source_revision": rev, "kernel_source_dirty": dirty}}
            return run
        base = bench_gate.make_baseline([timed(self.run1, "a" * 40, False), timed(self.run1, "a" * 40, False)],
                                        ["r1.json", "r2.json"])
        self.assertEqual(base["provenance"]["kernel_source"], ["a" * 12])
        verdict = bench_gate.gate(timed(self.run1, "b" * 40, True), base)
        self.assertEqual((verdict["kernel_source"], verdict["baseline_kernel_source"]),
                         ("b" * 12 + "+dirty", ["a" * 12]))
        folder = self.tmp / "baselines"
        folder.mkdir()
        (folder / f"{bench_gate.model_slug(base['device'])}.json").write_text(json.dumps(base))
        out = self.cli(self.write(timed(self.run1, "b" * 40, True), "run.json").as_posix(), "--baselines", str(folder))
        self.assertIn(f"this run timed kernel source {'b' * 12}+dirty; the baseline's: ['{'a' * 12}']", out.stdout)
        unrecorded = bench_gate.gate(self.run1, json.loads(BASELINE.read_text()))  # runs from before the field
        self.assertEqual((unrecorded["kernel_source"], unrecorded["baseline_kernel_source"]), (None, None))

    def test_a_slowdown_beyond_the_band_fails_and_names_the_case(self) -> None:
        base = json.loads(BASELINE.read_text())
        slow = copy.deepcopy(self.run1)
        row = slow["attention"][0]
        name = f"{row['name']} seq{row['seq']} {'causal' if row['causal'] else 'full'}"
        band = base["cases"][name]["band_pct"]
        row["ours_ms"] = base["cases"][name]["ms"] * (1 + (band + 5) / 100)
        summary = self.tmp / "summary.md"
        r = self.cli(str(self.write(slow, "slow.json")), env={"GITHUB_STEP_SUMMARY": str(summary)})
        self.assertEqual(r.returncode, bench_gate.EXIT_REGRESSION, r.stdout + r.stderr)
        self.assertIn(f"regression: {name}:", r.stderr)
        self.assertIn("**regression**", summary.read_text())
        within = copy.deepcopy(self.run1)
        within["attention"][0]["ours_ms"] = base["cases"][name]["ms"] * (1 + (band - 1) / 100)
        self.assertEqual(self.cli(str(self.write(within, "within.json"))).returncode, 0)

    def test_a_slower_model_step_fails_and_names_the_workload(self) -> None:
        base = json.loads(BASELINE.read_text())
        slow = copy.deepcopy(self.run1)
        row = next(r for r in slow["model"] if r["name"] == "decode b8 kv8k")
        case = base["cases"]["model decode b8 kv8k"]
        row["ours_ms"] = case["ms"] * (1 + (case["band_pct"] + 5) / 100)
        r = self.cli(str(self.write(slow, "slow_model.json")))
        self.assertEqual(r.returncode, bench_gate.EXIT_REGRESSION, r.stdout + r.stderr)
        self.assertIn("regression: model decode b8 kv8k:", r.stderr)

    def test_a_case_missing_from_the_results_fails_and_a_new_one_is_listed(self) -> None:
        fewer = copy.deepcopy(self.run1)
        fewer["decode"] = []
        fewer["memory_bound"].append({**fewer["memory_bound"][0], "shape": [1, 2]})
        r = self.cli(str(self.write(fewer, "fewer.json")))
        self.assertEqual(r.returncode, bench_gate.EXIT_REGRESSION)
        self.assertIn("MISSING    decode b8 hq32 hkv8 sk8192", r.stdout)
        self.assertIn("new        rms_norm 1x2 bfloat16: not in the baseline, not gated", r.stdout)

    def test_no_baseline_for_the_gpu_model_is_an_input_error_with_the_fix(self) -> None:
        other = copy.deepcopy(self.run1)
        other["machine"]["device"] = "AMD Instinct MI355X"
        r = self.cli(str(self.write(other, "mi355.json")))
        self.assertEqual(r.returncode, bench_gate.EXIT_INPUT)
        self.assertIn("no baseline for AMD Instinct MI355X", r.stderr)
        self.assertIn("--make-baseline", r.stderr)

    def test_a_baseline_case_that_is_not_a_number_is_an_input_error_naming_it(self) -> None:
        base = json.loads(BASELINE.read_text())
        name = min(base["cases"])
        folder = self.tmp / "baselines"
        folder.mkdir()
        for field, value in (("ms", "fast"), ("ms", True), ("ms", 0), ("band_pct", None), ("band_pct", [5])):
            bad = copy.deepcopy(base)
            bad["cases"][name][field] = value
            (folder / "nvidia-h200.json").write_text(json.dumps(bad))
            r = self.cli(str(RUNS[0]), "--baselines", str(folder))
            self.assertEqual(r.returncode, bench_gate.EXIT_INPUT, (field, value, r.stderr))
            self.assertIn(f"baseline case {name!r}", r.stderr)
            self.assertIn("--make-baseline", r.stderr)
            self.assertNotIn("Traceback", r.stderr)

    def test_feature_rows_are_gated_cases(self) -> None:
        """bench_gpu --only features (issue 56): a row's own time ("ms") is the case "features <row>"; rows
        without one (the times table, the refused anchors) are not cases."""
        case = "varlen (fwd+bwd) FLOP rate / our dense causal's"
        runs = []
        for ms in (5.4, 5.5):
            run = copy.deepcopy(self.run1)
            run["features"] = [{"section": "packed", "case": case, "ms": ms, "ratio": 0.82},
                               {"section": "packed", "case": "times (ms)", "times": {"ours_varlen": ms}},
                               {"section": "refused", "case": "cuDNN anchors that did not compile", "refused": {}}]
            runs.append(run)
        base = bench_gate.make_baseline(runs, ["r1", "r2"])
        self.assertEqual([c for c in base["cases"] if c.startswith("features")], [f"features {case}"])
        folder = self.tmp / "baselines"
        folder.mkdir()
        (folder / "nvidia-h200.json").write_text(json.dumps(base))
        self.assertEqual(self.cli(str(self.write(runs[0], "f_ok.json")), "--baselines", str(folder)).returncode, 0)
        slow = copy.deepcopy(runs[0])
        slow["features"][0]["ms"] = 6.5
        r = self.cli(str(self.write(slow, "f_slow.json")), "--baselines", str(folder))
        self.assertEqual(r.returncode, bench_gate.EXIT_REGRESSION, r.stdout + r.stderr)
        self.assertIn(f"regression: features {case}:", r.stderr)

    def test_attention_rows_of_other_batches_and_head_dims_are_cases_of_their_own(self) -> None:
        """The long-context grid (batch x length = 32k tokens) shares lengths with the gate's batch-4 rows: its
        rows must not overwrite theirs, and the batch-4 rows (older runs record no batch) keep their names."""
        row = {"name": "flash_attn_bwd", "seq": 1024, "causal": True, "ours_ms": 1.0}
        got = bench_gate.cases({"attention": [row, {**row, "batch": 4, "ours_ms": 2.0},
                                              {**row, "batch": 32, "ours_ms": 3.0},
                                              {**row, "batch": 32, "head_dim": 64, "ours_ms": 4.0}]})
        self.assertEqual(got, {"flash_attn_bwd seq1024 causal": 2.0, "flash_attn_bwd b32 seq1024 causal": 3.0,
                               "flash_attn_bwd d64 b32 seq1024 causal": 4.0})

    def test_decode_sub_paths_are_cases_of_their_own(self) -> None:
        """The decode rows' timings with the TMA loads or the cluster merge off are gated beside the kernel's own
        (each sub-path must keep earning its place), and rows that lack them (older runs) give the one case."""
        row = {"batch": 8, "heads_q": 32, "heads_kv": 8, "seq_k": 8192, "ours_ms": 1.0}
        got = bench_gate.cases({"decode": [{**row, "ours_cp_async_ms": 1.5, "ours_merge_kernel_ms": 1.2}]})
        self.assertEqual(got, {"decode b8 hq32 hkv8 sk8192": 1.0, "decode b8 hq32 hkv8 sk8192 cp_async": 1.5,
                               "decode b8 hq32 hkv8 sk8192 merge_kernel": 1.2})
        self.assertEqual(bench_gate.cases({"decode": [row]}), {"decode b8 hq32 hkv8 sk8192": 1.0})

    def test_added_cases_are_gated_and_the_baseline_keeps_its_own(self) -> None:
        """--add-cases: newer runs whose old cases are slower and which have a new row give the baseline that row;
        the old cases keep their times, so the slower run still fails the gate on them."""
        base = json.loads(BASELINE.read_text())
        folder = self.tmp / "baselines"
        folder.mkdir()
        (folder / "nvidia-h200.json").write_text(json.dumps(base))
        runs = []
        for i, ms in enumerate((7.0, 7.2)):
            run = copy.deepcopy(json.loads(RUNS[i].read_text()))
            for row in run["attention"]:
                row["ours_ms"] *= 1.2
            run["features"] = [{"section": "softcap", "case": "a new row", "ms": ms, "ratio": 1.1}]
            runs.append(self.write(run, f"newer{i}.json"))
        r = self.cli("--add-cases", *map(str, runs), "--baselines", str(folder))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        grown = json.loads((folder / "nvidia-h200.json").read_text())
        self.assertEqual(grown["cases"]["features a new row"]["ms"], 7.1)
        self.assertEqual({k: v for k, v in grown["cases"].items() if k != "features a new row"}, base["cases"])
        self.assertEqual(grown["added_from"][-1]["runs"], list(map(str, runs)))
        self.assertEqual(grown["added_from"][-1]["cases"], ["features a new row"])
        r = self.cli(str(runs[0]), "--baselines", str(folder))
        self.assertEqual(r.returncode, bench_gate.EXIT_REGRESSION, r.stdout + r.stderr)
        self.assertIn("regression: flash_attn_fwd seq1024 full:", r.stderr)

    def test_adding_no_new_case_is_an_input_error_that_changes_nothing(self) -> None:
        folder = self.tmp / "baselines"
        folder.mkdir()
        text = BASELINE.read_text()
        (folder / "nvidia-h200.json").write_text(text)
        r = self.cli("--add-cases", *map(str, RUNS), "--baselines", str(folder))
        self.assertEqual(r.returncode, bench_gate.EXIT_INPUT, r.stdout + r.stderr)
        self.assertIn("no case the baseline lacks", r.stderr)
        self.assertIn("--make-baseline", r.stderr)
        self.assertEqual((folder / "nvidia-h200.json").read_text(), text)

    def test_a_baseline_needs_two_runs_of_one_model(self) -> None:
        out = self.tmp / "baselines"
        r = self.cli("--make-baseline", str(RUNS[0]), "--baselines", str(out))
        self.assertEqual(r.returncode, bench_gate.EXIT_INPUT)
        self.assertIn("needs two or more runs", r.stderr)
        r = self.cli("--make-baseline", *map(str, RUNS), "--baselines", str(out))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue((out / "nvidia-h200.json").exists())

    def test_a_run_cut_short_makes_no_baseline(self) -> None:
        cut = copy.deepcopy(self.run1)
        cut["partial"] = True
        out = self.tmp / "baselines"
        r = self.cli("--make-baseline", str(self.write(cut, "cut.json")), str(RUNS[1]), "--baselines", str(out))
        self.assertEqual(r.returncode, bench_gate.EXIT_INPUT, r.stdout + r.stderr)
        self.assertIn("cut.json: a run cut short", r.stderr)
        self.assertFalse(out.exists())


if __name__ == "__main__":
    unittest.main(verbosity=1)
