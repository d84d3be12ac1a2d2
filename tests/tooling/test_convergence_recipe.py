"""The convergence recipe (ci/convergence/train_tiny.py): its verdict, and one short real comparison on the CPU.

The recipe trains a small transformer (causal grouped-query attention through flash_attn_func,
RMSNorm, SiLU-and-mul MLP), so the comparison needs the attention libraries as well.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax", reason="the convergence recipe trains with JAX (pip install --group test)")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "ci" / "convergence"))

import train_tiny


def test_verdict_accepts_matching_curves() -> None:
    ref = [4.0 - 0.1 * i for i in range(30)]
    assert train_tiny.verdict(ref, [v * 1.001 for v in ref], window=5, rel_tol=0.02) == []


def test_verdict_names_each_way_to_diverge() -> None:
    ref = [4.0 - 0.1 * i for i in range(30)]
    apart = train_tiny.verdict(ref, [v * 1.2 for v in ref], window=5, rel_tol=0.02)
    assert len(apart) == 1 and "differs from the reference" in apart[0]
    flat = train_tiny.verdict([4.0] * 30, [4.0] * 30, window=5, rel_tol=0.02)
    assert len(flat) == 1 and "did not fall" in flat[0]
    nan = train_tiny.verdict(ref, ref[:10] + [math.nan] + ref[11:], window=5, rel_tol=0.02)
    assert nan == ["non-finite loss at steps [10]"]


def test_short_comparison_on_the_cpu(tmp_path: Path) -> None:
    from jax_aiter import _loader

    try:
        for name in ("libjax_aiter.so", "librmsnorm_fwd.so", "rmsnorm_fwd_ja.so", "silu_and_mul_ja.so",
                     "libmha_fwd.so", "libmha_bwd.so", "mha_fwd_ja.so", "mha_bwd_ja.so"):
            _loader.find_library(name)
    except _loader.LibraryNotFoundError as e:
        pytest.skip(f"CPU libraries not built ({e}); `nox -s tests` builds them first")
    r = subprocess.run([sys.executable, str(ROOT / "ci/convergence/train_tiny.py"), "--compare", "--steps", "30",
                        "--window", "5", "--out", str(tmp_path)], check=False, capture_output=True, text=True, timeout=600,
                       env={**__import__("os").environ, "JAX_PLATFORMS": "cpu"})
    assert r.returncode == 0, r.stderr[-3000:]
    verdict = json.loads((tmp_path / "verdict.json").read_text())
    assert verdict["converged"] and verdict["problems"] == []
    summary = json.loads((tmp_path / "aiter.json").read_text())
    assert summary["steps_seen"] == 30 and summary["nonfinite_loss"]["count"] == 0
    assert summary["comparison"]["loss_drift_pct"] is not None  # compared with the reference run
