"""benchmarks/gpu/bench_attn_features.py (bench_gpu --only features, issue 56's rows) runs every section through and
gives the gate one case per measured row, without a GPU: a device run that breaks at its last section wastes the
H200 time of all the others.

The sizes shrink to a few tokens and the GPU event timer (gpu_timing.time_cases, which needs a GPU) gives way to a
wall-clock stand-in; the code under test is each section's cases and rows. Timings here mean nothing, and no test
reads them as speed: only that each row holds a positive time and a finite ratio, and a verdict where it has a goal.
"""
from __future__ import annotations

import math
import time

import jax
import pytest

from benchmarks.gpu import bench_attn_features as features
from ci.perf import bench_gate


def _wall_clock_cases(lib, cases: dict, input_sets: list, reps: int) -> dict[str, list[float]]:
    """time_cases' contract (name -> fn(*inputs), or (prepare, run)) timed by the host clock, once each."""
    out = {}
    for name, case in cases.items():
        if callable(case):
            fn, args = jax.jit(case), input_sets[0]
        else:
            prepare, run = case
            fn, args = jax.jit(run), (prepare(*input_sets[0]),)
        jax.block_until_ready(fn(*args))
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        out[name] = [1e3 * (time.perf_counter() - start) + 1e-9]
    return out


@pytest.fixture(scope="module")
def rows():
    with pytest.MonkeyPatch.context() as mp:
        for name, value in {"SEQ": 128, "HEADS": 16, "HEAD_DIM": 32, "DOCS": (64, 32, 16, 8, 8),
                            "WINDOWS": (16, 64), "HEAD_DIM_SEQ": 64, "BIAS_SEQ": 64}.items():
            mp.setattr(features, name, value)
        mp.setattr(features, "n_sets", lambda per_set, l2=0: 2)
        mp.setattr(features, "time_cases", _wall_clock_cases)
        yield features.bench_features(None, 1)


def test_every_section_gives_its_rows(rows):
    sections = [r["section"] for r in rows]
    for section in ("packed", "window", "softcap", "alibi", "head_dim", "deterministic", "bias", "dropout"):
        assert section in sections, f"no {section} row: {sections}"
    assert sections.count("head_dim") == len(features.HEAD_DIM_PAIRS)
    assert sections.count("deterministic") == 2  # MHA and GQA


def test_each_measured_row_has_a_time_a_ratio_and_a_verdict_where_it_has_a_goal(rows):
    measured = [r for r in rows if "ratio" in r]
    assert measured
    for r in measured:
        assert r["ms"] > 0 and math.isfinite(r["ratio"]) and r["ratio"] > 0, r
        assert r["met"] is None if r["goal"] == "reported" else isinstance(r["met"], bool), r


def test_the_gate_reads_one_case_per_measured_row(rows):
    measured = [r for r in rows if isinstance(r.get("ms"), (int, float))]
    gated = bench_gate.cases({"features": rows})
    assert len(gated) == len(measured), "two rows share a case name: the gate would keep only one of them"


def test_an_anchor_that_does_not_compile_is_recorded_and_the_run_goes_on(rows):
    """On this CPU host cuDNN compiles nothing: every cuDNN anchor is named with its reason, and every row of
    ours is still there."""
    refused = [r for r in rows if r["section"] == "refused"]
    assert len(refused) == 1
    names = refused[0]["refused"]
    assert {"cudnn_segment_mask", "cudnn_causal_bias"} <= set(names) and all(names.values()), names


def test_window_tags_name_each_width():
    assert features._window_tag(1024, True) == "1k_causal"
    assert features._window_tag(4096, False) == "4k_both"
    assert features._window_tag(16, True) != features._window_tag(64, True)
    assert [c[2] for c in features.window_cases()] == [(w, r) for w in features.WINDOWS for r in (0, w)]


def test_window_and_head_dim_rows_carry_cudnns_own_ratio_where_it_ran():
    """The anchor's own ratio (cuDNN's window time over the unmasked fraction of cuDNN's full time; cuDNN's FLOP
    rate at d over its rate at the reference head dim) rides on our row, from the anchor's times, not ours."""
    t = {"ours_full": 100.0, "cudnn_full": 80.0}
    for tag, causal, win in features.window_cases():
        frac = features.visible_pairs(features.SEQ, causal, win) / features.SEQ ** 2
        t[f"ours_{tag}"], t[f"cudnn_{tag}"] = 1.5 * frac * 100.0, 1.25 * frac * 80.0
    # cuDNN refuses a right window without causal: no anchor ratio, no cuDNN row
    del t[f"cudnn_{features._window_tag(features.WINDOWS[-1], False)}"]
    rows = features.window_rows(t)
    firsts = [r for r in rows if r["goal"] == "<= 1.2"]
    assert [r["ratio"] for r in firsts] == pytest.approx([1.5] * 4)
    assert [r.get("anchor_of_visible_dense") for r in firsts] == pytest.approx([1.25, 1.25, 1.25, None])
    assert len(rows) == 7 and rows[-1]["goal"] == "<= 1.2"
    assert all(r["met"] is False for r in firsts)

    t = {f"ours_d{d}": float(d) for pair in features.HEAD_DIM_PAIRS for d in pair}  # ours: equal rates
    t |= {f"cudnn_d{d}": 2.0 * d for pair in features.HEAD_DIM_PAIRS for d in pair}
    (d0, _), (d2, _) = features.HEAD_DIM_PAIRS[0], features.HEAD_DIM_PAIRS[2]
    t[f"cudnn_d{d0}"] = float(d0)  # cuDNN twice as fast per FLOP at the first pair's head dim as at its reference
    del t[f"cudnn_d{d2}"]
    rows = features.head_dim_rows(t)
    assert [r["ratio"] for r in rows] == pytest.approx([1.0] * len(rows))
    assert [r.get("anchor_rate_ratio") for r in rows] == pytest.approx([2.0, 1.0, None, 1.0, 1.0])


def test_bound_rows_price_each_document_and_window_at_the_dense_kernels_own_length():
    """The packed bound sums each document's share of a dense batch of its length; the window bound is the dense
    time at a window's width against the same fraction of the full time. Both from the times given, ours and
    cuDNN's apart, and reported (no goal: they measure the goal, they do not meet it)."""
    docs = features.DOCS
    frac = features.doc_pairs(docs) / features.visible_pairs(features.SEQ, True)
    t = {"ours_dense_causal": 10.0, "cudnn_dense_causal": 8.0, "ours_varlen": 6.0}
    # every document length costs 2x (ours) and 3x (cuDNN) its pairs' share of the dense causal time
    per = {n: {"ours": 2.0 * 10.0 * (features.SEQ // n) * n * (n + 1) / 2 / features.visible_pairs(features.SEQ, True),
               "cudnn": 3.0 * 8.0 * (features.SEQ // n) * n * (n + 1) / 2 / features.visible_pairs(features.SEQ, True)}
           for n in set(docs)}
    bound, varlen = features.packed_bound_rows(t, per)
    assert bound["ratio"] == pytest.approx(0.5) and bound["anchor_of_dense_rate"] == pytest.approx(1 / 3)
    assert bound["ms"] == pytest.approx(2.0 * 10.0 * frac)
    assert varlen["ratio"] == pytest.approx(6.0 / (2.0 * 10.0 * frac))
    assert bound["met"] is None and varlen["met"] is None
    del per[min(docs)]["cudnn"]  # cuDNN declined one length: no anchor ratio, our rows stay
    assert "anchor_of_dense_rate" not in features.packed_bound_rows(t, per)[0]
    del per[min(docs)]["ours"]
    assert features.packed_bound_rows(t, per) == []

    t = {"ours_full": 100.0, "cudnn_full": 80.0}
    for tag, causal, win in features.window_cases():
        t[f"ours_{tag}"] = 1.0
    keys = features.bound_lengths()
    assert keys == sorted({w * m for w in features.WINDOWS for m in (1, 2)})
    for n in keys:
        t[f"ours_dense_{n}"], t[f"cudnn_dense_{n}"] = 1.4 * n / features.SEQ * 100.0, 1.6 * n / features.SEQ * 80.0
    bounds = [r for r in features.window_rows(t) if r["case"].startswith("bound")]
    assert len(bounds) == len(keys) and all(r["met"] is None for r in bounds)
    assert [r["ratio"] for r in bounds] == pytest.approx([1.4] * len(keys))
    assert [r["anchor_of_visible_dense"] for r in bounds] == pytest.approx([1.6] * len(keys))
