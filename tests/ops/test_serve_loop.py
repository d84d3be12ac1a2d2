"""The server loop of the model benchmark (benchmarks/gpu/serve_loop.py) at a tiny size: continuous batching over
a paged KV cache built from our ops agrees, step by step, with the same loop over plain JAX's dense padded cache,
pages go back to the pool and are taken again, and the pool holds what the schedule needs.

bench_gpu.py --only model runs the same loop at full size on a GPU and times it (serve_bench.py); here it runs on
every device the op tests run on, so a change that breaks the serving ops in a model shows up without a GPU. The
bound is model_bench.AGREE's logits bound (bfloat16 weights and caches; measured here: 7.5e-3 at the worst step).
A wrong slot, a stale page read past a sequence's end, or a position off by one is off by far more (the test with
each step's pages listed in reverse shows it).
"""
from __future__ import annotations

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest


def _module(name: str):
    return importlib.import_module(f"benchmarks.gpu.{name}")


@pytest.fixture
def paged(device):
    """Our server needs the paged KV cache's kernels: CPU only so far (docs/serving.md, Backends)."""
    if device.platform != "cpu":
        pytest.skip("the paged KV cache has CPU kernels only so far (docs/serving.md, Backends); no GPU kernel to "
                    "serve with")
    return device


@pytest.fixture(scope="module")
def mods():
    return {n: _module(n) for n in ("llama", "model_bench", "serve_schedule", "serve_loop")}


def _tiny(llama):
    return llama.Config(layers=2, d_model=64, heads_q=4, heads_kv=2, head_dim=32, ffn=96, vocab=101)


def _load(mods, n=9, slots=3):
    sched = mods["serve_schedule"]
    return sched.make_requests(n, contexts=(5, 12, 23, 40), generate=(1, 3, 6), vocab=101, seed=3), slots


def test_schedule_admits_every_request_once_and_keeps_slots_busy(mods):
    sched = mods["serve_schedule"]
    requests, slots = _load(mods)
    admitted, steps = [], 0
    for step in sched.schedule(requests, slots):
        admitted += [r.rid for _, r in step.admit]
        assert len({s for s, _, _ in step.decode}) == len(step.decode) <= slots
        steps += 1
    assert admitted == [r.rid for r in requests]
    assert sum(len(s.decode) for s in sched.schedule(requests, slots)) == sum(r.generate for r in requests)
    assert steps < sum(r.generate for r in requests)  # requests overlap: batching happened


def test_page_table_reuses_freed_pages_and_pool_is_the_peak(mods):
    sched = mods["serve_schedule"]
    requests, slots = _load(mods)
    pages = sched.pool_pages(requests, slots, page_size=4)
    table = sched.PageTable(pages, 4, slots)
    for step in sched.schedule(requests, slots):
        for s, r in step.admit:
            got = table.admit(s, r.context)
            assert len(set(got.tolist())) == r.context and got.max() < pages * 4
        meta = table.decode([s for s, _, _ in step.decode])
        ptr, last = meta["kv_indptr"], meta["kv_last_page_lens"]
        for s, r, j in step.decode:  # the metadata describes exactly the tokens the slot holds
            held = r.context + j + 1
            assert (ptr[s + 1] - ptr[s] - 1) * 4 + last[s] == held
            assert meta["slot_mapping"][s] == table.slots_of(s, held - 1, held)[0]
        in_use = meta["kv_page_indices"][:ptr[-1]]
        assert len(set(in_use.tolist())) == len(in_use)  # no page held twice
        for s, r, j in step.decode:
            if j + 1 == r.generate:
                table.release(s)
    assert table.peak_pages == pages and table.reused > 0
    with pytest.raises(RuntimeError, match="exhausted"):
        small = sched.PageTable(pages - 1, 4, slots)
        for step in sched.schedule(requests, slots):
            for s, r in step.admit:
                small.admit(s, r.context)
            small.decode([s for s, _, _ in step.decode])


def test_paged_server_agrees_with_plain_jax_dense_server(paged, mods):
    llama, loop = mods["llama"], mods["serve_loop"]
    cfg = _tiny(llama)
    requests, slots = _load(mods)
    params = llama.init_params(cfg, jax.random.key(1), jnp.bfloat16)
    ours = loop.OurServer(cfg, params, requests, slots, page_size=4)
    plain = loop.PlainServer(cfg, params, requests, slots, implementation=None)
    got = loop.compare(ours, plain, requests, slots)
    assert got["steps_compared"] > len(requests)
    assert got["logits_worst_step_rel_err"] <= mods["model_bench"].AGREE["logits"], got
    assert ours.table.reused > 0  # later requests wrote into pages earlier ones had read
    stats = loop.run(ours, requests, slots)
    assert stats["generated"] == sum(r.generate for r in requests)
    assert stats["peak_tokens_held"] <= ours.table.num_pages * 4 < stats["peak_tokens_held"] + slots * 4
    assert ours.kv_bytes() < plain.kv_bytes()


def test_a_wrong_page_table_is_caught_by_the_comparison(paged, mods, monkeypatch):
    """The comparison can fail: the same loop with each decode step's pages listed in reverse order (every key read
    from another position) disagrees with plain JAX far beyond the bound."""
    llama, loop, sched = mods["llama"], mods["serve_loop"], mods["serve_schedule"]
    cfg = _tiny(llama)
    requests, slots = _load(mods)
    params = llama.init_params(cfg, jax.random.key(1), jnp.bfloat16)
    decode = sched.PageTable.decode

    def reversed_pages(self, active):
        meta = decode(self, active)
        ptr, idx = meta["kv_indptr"], meta["kv_page_indices"].copy()
        for s in range(self.slots):
            idx[ptr[s]:ptr[s + 1]] = idx[ptr[s]:ptr[s + 1]][::-1]
        return {**meta, "kv_page_indices": idx}

    monkeypatch.setattr(sched.PageTable, "decode", reversed_pages)
    ours = loop.OurServer(cfg, params, requests, slots, page_size=4)
    plain = loop.PlainServer(cfg, params, requests, slots, implementation=None)
    got = loop.compare(ours, plain, requests, slots)
    assert got["logits_worst_step_rel_err"] > 10 * mods["model_bench"].AGREE["logits"], got
    assert np.isfinite(got["logits_rel_err"])


def test_serve_bench_row_at_a_tiny_size(paged, mods, capsys):
    """bench_gpu's server-loop row, computed from one run of each server: its figures are those of the runs."""
    llama = mods["llama"]
    bench = _module("serve_bench")
    w = bench.ServeWorkload("tiny", _tiny(llama), 7, (5, 12, 23), (1, 4), slots=3, page_size=4)
    row = bench.bench_serve(w, samples=1)
    assert row["agree"] and row["ours"]["generated"] == row["plain"]["generated"] > 0
    assert row["speedup"] == pytest.approx(row["ours_tokens_per_s"] / row["plain_tokens_per_s"])
    per_token = 2 * w.cfg.layers * w.cfg.heads_kv * w.cfg.head_dim * 2
    assert row["ours_kv_bytes"] == row["pool_pages"] * w.page_size * per_token
    assert row["plain_kv_bytes"] == w.slots * (23 + 4) * per_token
    assert row["ours_kv_over_held"] == pytest.approx(row["ours_kv_bytes"] / (row["peak_tokens_held"] * per_token))
    if paged.platform == "cpu":
        assert row["plain_attention"] == "default" and "cudnn_refused" in row
    bench.print_table([row])
    assert "tiny" in capsys.readouterr().out
