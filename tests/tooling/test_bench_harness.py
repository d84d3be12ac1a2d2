"""A tiny-scale smoke of the benchmark harness (benchmarks are not tests: no timing is asserted).

Runs verify, publish and fetch at scale 0.001 (a few MB) through the real code
paths and the real anchors (sha256sum, zstd, curl over 127.0.0.1), then checks
the results JSON and the table have the promised shape. Also checks the
corpus generator's promise: zstd level 3 ratio between 0.25 and 0.45.
"""
from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest

from jatools.bench import cases, corpus, harness, runner

CHEAP = ["verify", "publish", "fetch"]
KEYS = {"name", "ours_s", "anchor_s", "ratio", "goal", "met", "bytes"}


def test_corpus_is_deterministic_and_compresses_like_gpu_code(tmp_path):
    a = corpus.ensure_corpus(tmp_path / "a", 0.004, log=lambda m: None)
    b = corpus.ensure_corpus(tmp_path / "b", 0.004, log=lambda m: None)
    assert a.files == corpus.corpus_sizes(0.004) and a.files["libmha_bwd.so"] == 5_197_824  # whole pages
    for name in a.files:
        data = (a.folder / name).read_bytes()
        assert data == (b.folder / name).read_bytes(), f"{name} differs between two generations"
        assert 0.25 <= corpus.zstd3_ratio(data) <= 0.45, name
    assert a.folder.name == f"v{corpus.CORPUS_VERSION}-s0.004", "cached by (generator version, scale)"


def test_corpus_cache_is_reused_and_a_damaged_one_regenerated(tmp_path):
    c = corpus.ensure_corpus(tmp_path, 0.001, log=lambda m: None)
    mtime = c.paths[0].stat().st_mtime_ns
    assert corpus.ensure_corpus(tmp_path, 0.001, log=lambda m: None).paths[0].stat().st_mtime_ns == mtime
    c.paths[1].write_bytes(b"short")
    said = []
    again = corpus.ensure_corpus(tmp_path, 0.001, log=said.append)
    assert said and again.paths[1].stat().st_size == c.files[c.paths[1].name]


def test_missing_anchor_tool_is_named_with_its_install_command(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(harness.AnchorMissing,
                       match=r"zstd is not installed \(install it with `apt-get install -y zstd`\)"):
        harness.require("zstd")


def test_install_command_defaults_to_apt_get_of_the_tool(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(harness.AnchorMissing,
                       match=r"make is not installed \(install it with `apt-get install -y make`\); "
                             r"sha256sum is not installed \(install it with `apt-get install -y coreutils`\)"):
        harness.require("make", "sha256sum")


def test_benchmarks_keep_their_names_and_order():
    assert list(cases.BENCHMARKS) == ["verify", "publish", "fetch", "wheel_full", "noop", "incremental", "validate",
                                     "import"]
    assert all(c.goal for c in cases.BENCHMARKS.values())


def test_a_benchmark_that_cannot_run_is_reported_with_its_goal_and_the_others_still_run(monkeypatch):
    def missing(ctx):
        raise harness.AnchorMissing("zstd is not installed")

    def broken(ctx):
        raise ValueError("bad")

    monkeypatch.setitem(cases.BENCHMARKS, "missing", cases.Case(missing, "goal m"))
    monkeypatch.setitem(cases.BENCHMARKS, "broken", cases.Case(broken, "goal b"))
    logged = []
    ctx = SimpleNamespace(log=logged.append)
    results = [runner.run_one("missing", ctx), runner.run_one("broken", ctx)]
    assert [(r.goal, r.met, r.error) for r in results] == [("goal m", None, "zstd is not installed"),
                                                           ("goal b", None, "ValueError: bad")]
    assert "ValueError: bad" in logged[0], "the traceback is logged"
    text = harness.table(results)
    assert "missing: not run: zstd is not installed" in text and "broken: not run: ValueError: bad" in text
    assert text.splitlines()[2].split()[-2:] == ["not", "run"]


def test_tiny_run_writes_results_and_table(tmp_path, monkeypatch, capsys):
    missing = [t for t in ("sha256sum", "zstd", "curl") if shutil.which(t) is None]
    if missing:
        pytest.skip(f"anchor tools missing: {', '.join(missing)} (apt-get install -y zstd curl coreutils)")
    out = tmp_path / "results.json"
    monkeypatch.setattr(harness, "BENCH_DIR", tmp_path / "bench")
    code = runner.main(["--scale", "0.001", "--runs", "1", "--warmup", "0", "--out", str(out),
                         *[f"--only={n}" for n in CHEAP]])
    text = capsys.readouterr().out
    report = json.loads(out.read_text())
    assert code == 0, text
    assert [b["name"] for b in report["benchmarks"]] == CHEAP
    for b in report["benchmarks"]:
        assert KEYS <= set(b), b
        assert b["ours_s"] > 0 and b["anchor_s"] > 0 and b["bytes"] > 0 and isinstance(b["met"], bool), b
        # the ratio comes from the unrounded times; ours_s and anchor_s are rounded to 0.1 ms, which at this
        # tiny scale (a few ms) moves their quotient by up to 1e-4 / time of each
        rounding = 1e-4 / b["ours_s"] + 1e-4 / b["anchor_s"]
        assert b["ratio"] == pytest.approx(b["anchor_s"] / b["ours_s"], rel=1e-2 + rounding)
    machine = report["machine"]
    assert machine["cores"] >= 1 and machine["python"] and len(machine["load_average"]) == 3
    assert machine["tools"]["zstd"].startswith("*** Zstandard") or "zstd" in machine["tools"]["zstd"].lower()
    header = next(line for line in text.splitlines() if line.startswith("benchmark"))
    assert header.split() == ["benchmark", "ours", "anchor", "ratio", "goal", "met?"]
    for name in CHEAP:
        assert any(line.startswith(name + " ") for line in text.splitlines()), name


def test_unknown_benchmark_is_refused(capsys):
    assert runner.main(["--only", "nope"]) == 2
    assert "unknown benchmark(s) nope" in capsys.readouterr().err
