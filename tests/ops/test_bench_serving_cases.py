"""bench_gpu's serving section (benchmarks/gpu/bench_serving.py) times cases that must compute the same attention:
paged decode over scattered pages against our dense decode over the same keys gathered, FP8 pools against bf16
ones, paged prefill against the varlen forward over the same tokens packed, the FP8 forward against bf16. The
timing needs a GPU; the inputs and the cases do not, so they are checked here, at a small size, on every device
the op tests use (a wrong page table or gather would time the wrong thing).
"""
from __future__ import annotations

import importlib

import jax.numpy as jnp
import numpy as np
import pytest


@pytest.fixture
def paged(device):
    if device.platform != "cpu":
        pytest.skip("the paged KV cache has CPU kernels only so far (docs/serving.md, Backends)")
    return device


@pytest.fixture(scope="module")
def bench():
    return importlib.import_module("benchmarks.gpu.bench_serving")


def _close(a, b, tol):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    assert np.isfinite(a).all()
    err = np.linalg.norm(a - b) / np.linalg.norm(b)
    assert err <= tol, err


def test_paged_decode_cases_agree_with_dense_and_fp8(paged, bench):
    s = bench.page_set((37, 37, 37), page_size=16, seed=1, fp8=True)
    assert s["table"].shape == (3, 3) and sorted(np.asarray(s["indices"]).tolist()) == list(range(9))
    cases = bench.decode_cases((37, 37, 37), fa3_mod=None, fp8=True)
    assert set(cases) == {"ours", "ours_fp8", "dense"}
    out = {n: f(s) for n, f in cases.items()}
    _close(out["ours"], out["dense"], 2e-2)
    _close(out["ours_fp8"], out["ours"], 1.5e-1)  # e4m3 keeps 3 mantissa bits
    assert out["ours"].shape == (3, bench.HQ, bench.D)


def test_mixed_contexts_have_no_dense_case_and_a_wrong_table_is_seen(paged, bench):
    ctx = (5, 40, 17)
    s = bench.page_set(ctx, page_size=16, seed=2)
    assert "k_dense" not in s and set(bench.decode_cases(ctx, None)) == {"ours"}
    assert np.asarray(s["last"]).tolist() == [5, 8, 1]
    same = bench.page_set((40, 40), page_size=16, seed=3)
    good = bench.decode_cases((40, 40), None)["dense"](same)
    same["indices"] = same["indices"][::-1]  # keys read from other pages than the dense gather's
    with pytest.raises(AssertionError):
        _close(bench.decode_cases((40, 40), None)["ours"](same), good, 2e-2)


def test_prefill_and_fp8_forward_cases_agree(paged, bench):
    s = bench.prefill_set(2, 48, page_size=16, seed=4)
    out = {n: f(s) for n, f in bench.prefill_cases(48).items()}
    _close(out["ours"], out["varlen"], 2e-2)
    f = bench.fp8_set(1, 64, seed=5)
    out = {n: c(f) for n, c in bench.fp8_cases().items()}
    assert out["fp8"].dtype == jnp.bfloat16
    _close(out["fp8"], out["bf16"], 1.5e-1)


def test_a_case_that_does_not_compile_is_refused_with_its_reason(paged, bench):
    s = bench.page_set((16,), page_size=16, seed=6)
    why = bench.compile_refusal(lambda s: s["q"] @ s["k"], s)  # shapes that do not multiply
    assert why and "TypeError" in why
    assert bench.compile_refusal(bench.decode_cases((16,), None)["ours"], s) is None
