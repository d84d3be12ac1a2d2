"""benchmarks/gpu/gpu_timing.py's timed program (every bench_gpu.py case runs in one): the L2 flush must reach the GPU.

The flush is a sum over a 256 MiB buffer between the previous case's stop event and the next
case's start event. XLA drops any value nothing uses, so the sum must feed the start event's
record; these tests read the lowered program (no GPU needed) and check that it does, and that
each case's work still sits between its own two records.
"""
import importlib
import re
from pathlib import Path

import jax.numpy as jnp
import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    return importlib.import_module("benchmarks.gpu.gpu_timing")


def _lowered(bench, flush: bool, reps: int = 2) -> str:
    import jax

    cases = {"a": lambda x: x * 2, "b": lambda x: jnp.tanh(x)}
    program = bench.case_program(cases, reps, 0, flush)
    sets = [(jnp.ones((8, 16), jnp.float32),), (jnp.zeros((8, 16), jnp.float32),)]
    scratch = jnp.ones((1024 if flush else 1,), jnp.float32)
    return jax.jit(program).lower(sets, scratch).as_text()


def _records(text: str) -> list[list[str]]:
    """The operands of each ja_bench_record custom call, in program order."""
    return [m.group(1).split(", ") for m in
            re.finditer(r"stablehlo\.custom_call @ja_bench_record\(([^)]*)\)", text)]


def _reduce_results(text: str) -> set[str]:
    return {m.group(1) for m in re.finditer(r"(%[\w#.]+) = stablehlo\.reduce\(", text)}


def test_every_start_record_waits_for_its_own_flush(bench):
    text = _lowered(bench, flush=True)
    records = _records(text)
    assert len(records) == 2 * 2 * 2  # reps x cases x (start, stop)
    sums = _reduce_results(text)
    assert len(sums) == 4, f"one flush sum per case and rep, found {sorted(sums)}"
    starts = records[0::2]
    fed = [next((op for op in ops if op in sums), None) for ops in starts]
    assert all(fed), f"a start record does not take a flush sum as an operand: {starts}"
    assert len(set(fed)) == len(fed), "two start records share one flush: XLA would run it once"
    for ops in records[1::2]:  # stop records take the case's outputs, not a flush
        assert not any(op in sums for op in ops)


def test_warm_l2_program_has_no_flush(bench):
    text = _lowered(bench, flush=False)
    assert len(_records(text)) == 8
    assert not _reduce_results(text)


def test_a_run_saves_its_json_as_each_section_ends(tmp_path, monkeypatch):
    """bench_gpu.run_sections hands each finished section to save (bench_gpu.main: write_json, the whole file
    replaced): a run killed in a later section (a device call's time limit) keeps what it measured, marked
    "partial", and only a run that went through is marked otherwise. The sections here are stand-ins (no GPU);
    the code under test is the saving."""
    import argparse
    import json

    gpu = importlib.import_module("benchmarks.gpu.bench_gpu")
    monkeypatch.setattr(gpu, "gpu_provenance", dict)
    monkeypatch.setattr(gpu, "build_provenance", dict)
    monkeypatch.setattr(gpu, "bench_copy", lambda lib, reps: {"GBps": 1.0})
    monkeypatch.setattr(gpu, "bench_decode", lambda lib, reps, gbps, quick: [{"name": "decode row"}])

    def cut(lib, reps, quick, dims, progress):
        progress([{"name": "attention case 1"}])  # the section's first case, timed
        raise KeyboardInterrupt("the device call's time limit")

    monkeypatch.setattr(gpu.bench_attention, "bench_attention", cut)
    out = tmp_path / "gpu.json"
    args = argparse.Namespace(only=["decode", "attention"], shape=[], reps=3, quick=True, head_dim=None,
                              model_workload=None, model_swaps=None)
    with pytest.raises(KeyboardInterrupt):
        gpu.run_sections(args, None, "stand-in", save=lambda r: gpu.write_json(out, r))
    saved = json.loads(out.read_text())
    assert saved["partial"] is True and saved["decode"] == [{"name": "decode row"}]
    assert saved["attention"] == [{"name": "attention case 1"}]  # the cases timed before the cut are kept

    monkeypatch.setattr(gpu.bench_attention, "bench_attention",
                        lambda lib, reps, quick, dims, progress: [{"name": "attention row"}])
    done = gpu.run_sections(args, None, "stand-in", save=lambda r: gpu.write_json(out, r))
    assert done["partial"] is False and json.loads(out.read_text())["attention"] == [{"name": "attention row"}]
    assert [p.name for p in tmp_path.iterdir()] == ["gpu.json"]  # no temporary file left beside it
