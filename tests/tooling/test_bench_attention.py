"""benchmarks/gpu/bench_attention.py (bench_gpu --only attention, issue 82's table) runs through without a GPU: the
grid, the anchors that cannot run here (cuDNN, FlashAttention-3) recorded with their reasons, the rows, the goals
and the gate's case names. A device run that breaks in its attention section wastes the H200 time of the others.

The sizes shrink to a few tokens and the GPU event timer gives way to test_bench_attn_features' wall-clock
stand-in; no test reads the timings as speed.
"""
from __future__ import annotations

import math

import pytest

from benchmarks.gpu import bench_attention as attention
from ci.perf import bench_gate
from tests.tooling.test_bench_attn_features import _wall_clock_cases


@pytest.fixture(scope="module")
def rows():
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(attention, "TOKENS", 256)
        mp.setattr(attention, "SEQS", (64, 128))
        mp.setattr(attention, "HEAD_DIMS", (32, 64))
        mp.setattr(attention, "XLA_MAX_SEQ", 64)
        mp.setattr(attention, "heads", lambda d: 2)
        mp.setattr(attention, "n_sets", lambda per_set, l2=0: 2)
        mp.setattr(attention, "time_cases", _wall_clock_cases)
        logged = []
        yield attention.bench_attention(None, 1, False, None, log=logged.append), logged


def test_the_full_grid_holds_32k_tokens_a_case_and_16_heads_at_head_dim_256():
    cases = attention.grid(False, None)
    assert {d for d, _, _ in cases} == {64, 128, 256}
    assert sorted({s for _, _, s in cases}) == [1024, 2048, 4096, 8192, 16384, 32768]
    assert all(b * s == 32768 for _, b, s in cases)
    assert attention.heads(256) == 16 and attention.heads(128) == 32 and attention.heads(64) == 32
    assert attention.grid(True, None) == [(128, 4, 1024), (128, 2, 16384), (128, 1, 32768)]
    assert attention.grid(True, [64]) == [(64, 4, 1024), (64, 2, 16384), (64, 1, 32768)]


def test_every_case_gives_a_forward_and_a_backward_row_with_our_times(rows):
    got, _ = rows
    assert len(got) == 2 * 2 * 2 * 2  # head dims x lengths x (full, causal) x (fwd, bwd)
    for r in got:
        assert r["ours_ms"] > 0 and math.isfinite(r["ours_TFLOPs"]), r
        assert r["batch"] * r["seq"] == 256
    for r in got[1::2]:
        assert r["name"] == "flash_attn_bwd"
        assert r["ours_fwd_bwd_ms"] == pytest.approx(r["ours_ms"] + got[got.index(r) - 1]["ours_ms"])
        assert r["bwd_over_fwd"] > 0 and isinstance(r["met"], bool)
    assert all("xla_ms" in r for r in got[0::2] if r["seq"] <= 64)
    assert not any("xla_ms" in r for r in got if r["seq"] > 64)


def test_anchors_that_cannot_run_are_named_with_their_reason_and_the_run_goes_on(rows):
    """On this CPU host cuDNN compiles nothing and flash_attn3_jax is not installed: both are recorded on every row
    with a reason, the FA3 reason printed once, and no ratio to a missing anchor is made up."""
    got, logged = rows
    for r in got:
        assert set(r["refused"]) >= {"cudnn", "fa3"} and all(r["refused"].values()), r["refused"]
        assert not any(k.endswith(("_cudnn", "_fa3")) for k in r), r
    assert sum("flash-attn3-jax" in line for line in logged) == 1


def test_goals_follow_issue_82():
    fwd = {"ours": 10.0, "cudnn": 11.0, "fa3": 9.0}
    bwd = {"ours": 28.0, "cudnn": 30.0, "fa3": 25.0}
    g = attention.bwd_goals(128, 16384, False, fwd, bwd, 555.0)
    assert g == {"fwd+bwd <= cuDNN's": True, "backward >= 560 TF/s": False, "fwd+bwd <= FA3's": False,
                 "backward <= 2.9x the forward": True}
    assert attention.bwd_goals(128, 16384, True, fwd, bwd, 545.0)["backward >= 540 TF/s"] is True
    assert list(attention.bwd_goals(64, 2048, False, fwd, bwd, 1.0)) == ["fwd+bwd <= cuDNN's"]
    assert "fwd+bwd <= FA3's" not in attention.bwd_goals(64, 16384, False, fwd, bwd, 1.0)
    assert attention.bwd_goals(256, 32768, True, fwd, {"ours": 1.0, "cudnn": 1.0}, 480.0) == {
        "fwd+bwd <= cuDNN's": True, "backward >= 480 TF/s": True}


def test_the_gate_reads_one_case_per_row(rows):
    got, _ = rows
    assert len(bench_gate.cases({"attention": got})) == len(got)
