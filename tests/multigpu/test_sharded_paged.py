"""The paged KV cache split over 4 devices (XLA's partitioner; on the CPU with
--xla_force_host_platform_device_count=4): under a jit that donates the pools, a decode step over pools split over
the kv heads, and append_kv into pools split over their pages, write each shard's pools in place (no pool-sized
copy in the compiled per-device program, the donated pools aliased) with no collective, and give the single-device
values. (Attention over page-split pools gathers them: docs/serving.md, "Sharding".) The patterns beside plain JAX
are in the sharding parity table (_parity.py: paged-*, append-kv-*)."""
from __future__ import annotations

import re

import jax
import numpy as np
import pytest
from _mesh_cases import collectives
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jax_aiter.ops import append_kv, paged_attention

PAGES, PAGE, KV_HEADS, HEADS, D, SEQS = 32, 8, 4, 8, 32, 4


def step(k_pool, v_pool, k_new, v_new, slots, q, indptr, indices, last):
    k_pool, v_pool = append_kv(k_new, v_new, slots, k_pool, v_pool)
    return k_pool, v_pool, paged_attention(q, k_pool, v_pool, indptr, indices, last, max_seq_len=64)


def append_only(k_pool, v_pool, k_new, v_new, slots, *table):
    return append_kv(k_new, v_new, slots, k_pool, v_pool)


def _inputs():
    """Sequence s on pages s, s + 4, ... (so a page split gives each shard whole sequences' pages), 13 + s tokens,
    the last one new."""
    rng = np.random.default_rng(0)
    lens = 13 + np.arange(SEQS)
    pages = [[s + SEQS * j for j in range(-(-n // PAGE))] for s, n in enumerate(lens)]
    indptr = np.cumsum([0, *map(len, pages)]).astype(np.int32)
    indices = np.concatenate(pages).astype(np.int32)
    last = ((lens - 1) % PAGE + 1).astype(np.int32)
    slots = np.array([pages[s][(n - 1) // PAGE] * PAGE + (n - 1) % PAGE for s, n in enumerate(lens)], np.int32)
    pool = (PAGES, PAGE, KV_HEADS, D)
    k_pool, v_pool = (rng.standard_normal(pool).astype(np.float32) for _ in range(2))
    k_new, v_new = (rng.standard_normal((SEQS, KV_HEADS, D)).astype(np.float32) for _ in range(2))
    q = rng.standard_normal((SEQS, HEADS, D)).astype(np.float32)
    return [k_pool, v_pool, k_new, v_new, slots, q, indptr, indices, last]


@pytest.mark.multigpu(devices=4)
@pytest.mark.parametrize("split", ["kv_heads", "pages"])
def test_a_donated_sharded_step_writes_each_shard_in_place(split):
    mesh = jax.make_mesh((4,), ("model",), devices=jax.devices()[:4], axis_types=(jax.sharding.AxisType.Auto,))
    pool = P(None, None, "model") if split == "kv_heads" else P("model")
    rows = P(None, "model") if split == "kv_heads" else P()
    specs = [pool, pool, rows, rows, P(), rows, P(), P(), P()]
    args = _inputs()
    fn = step if split == "kv_heads" else append_only
    want = jax.jit(fn)(*args)
    placed = [jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(args, specs)]
    compiled = jax.jit(fn, donate_argnums=(0, 1)).lower(*placed).compile()
    text = compiled.as_text()
    assert collectives(text) == {}, collectives(text)
    local = (PAGES, PAGE, KV_HEADS // 4, D) if split == "kv_heads" else (PAGES // 4, PAGE, KV_HEADS, D)
    shape = re.escape(f"f32[{','.join(map(str, local))}]")
    made = re.findall(rf"=\s*{shape}\{{[^}}]*\}}\s+([a-z-]+)\(", text)
    # the pools' parameters and the call's results (its tuple's elements, or the tuple itself as the ROOT): no copy
    assert made.count("parameter") == 2 and set(made) <= {"parameter", "get-tuple-element"}, made
    assert "input_output_alias={ {0}: (0, {}, may-alias), {1}: (1, {}, may-alias) }" in text
    got = compiled(*placed)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6, atol=1e-6)
    assert got[0].sharding.is_equivalent_to(NamedSharding(mesh, pool), 4)
