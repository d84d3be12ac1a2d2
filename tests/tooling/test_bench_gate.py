"""ci/perf/bench_gate.py: the GPU benchmark's cases gated against a two-run baseline, issue 56's feature rows
(bench_gpu.py --only features) among them."""
from __future__ import annotations

import json

from ci.perf import bench_gate


def _run(varlen_ms: float, rms_ms: float = 0.1) -> dict:
    return {"machine": {"device": "NVIDIA H200"},
            "memory_bound": [{"name": "rms_norm", "shape": [8192, 4096], "dtype": "bfloat16", "ours_ms": rms_ms}],
            "features": [
                {"section": "packed", "case": "varlen (fwd+bwd) FLOP rate / our dense causal's", "ms": varlen_ms,
                 "ratio": 0.82},
                {"section": "packed", "case": "times (ms)", "times": {"ours_varlen": varlen_ms}},  # no "ms": not a case
                {"section": "refused", "case": "cuDNN anchors that did not compile", "refused": {}}]}


def test_feature_rows_are_cases():
    got = bench_gate.cases(_run(5.4))
    assert got == {"rms_norm 8192x4096 bfloat16": 0.1, "features varlen (fwd+bwd) FLOP rate / our dense causal's": 5.4}


def test_a_slower_feature_row_fails_the_gate_and_is_named(tmp_path):
    base = bench_gate.make_baseline([_run(5.4), _run(5.5)], ["r1", "r2"])
    assert bench_gate.gate(_run(5.45), base)["passed"]
    verdict = bench_gate.gate(_run(6.5), base)
    assert not verdict["passed"] and verdict["regressions"][0].startswith("features varlen")
    (tmp_path / "nvidia-h200.json").write_text(json.dumps(base))
    (tmp_path / "run.json").write_text(json.dumps(_run(6.5)))
    assert bench_gate.main([str(tmp_path / "run.json"), "--baselines", str(tmp_path)]) == bench_gate.EXIT_REGRESSION
