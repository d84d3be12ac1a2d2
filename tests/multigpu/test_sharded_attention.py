"""flash_attn_func inside jax.shard_map, batch- and head-sharded, equal to the single-device result.

q [batch, seq_q, heads_q, head_dim], k/v [batch, seq_k, heads_kv, head_dim]
(the API of jax_aiter.flash_attn_func). Heads are sharded contiguously, so each
device keeps whole GQA groups (q head i reads kv head i // (heads_q // heads_kv)).
Gradients for q, k and v included. seq_q != seq_k, causal aligned bottom-right.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from _mesh_cases import (
    assert_close,
    layout_params,
    mesh_and_spec,
    put,
    random,
    shard_mapped,
)

import jax_aiter

BATCH, SEQ_Q, SEQ_K, HEAD_DIM = 4, 16, 24, 64
CASES = [  # (heads_q, heads_kv, causal, dtype): GQA ratios 1 and 4, both mask kinds, both dtype families
    pytest.param(4, 4, False, jnp.float32, id="mha-f32"),
    pytest.param(8, 2, True, jnp.bfloat16, id="gqa4-causal-bf16"),
]


@pytest.mark.parametrize("layout", layout_params())
@pytest.mark.parametrize("heads_q,heads_kv,causal,dtype", CASES)
def test_flash_attn_sharded_equals_single_device(layout, heads_q, heads_kv, causal, dtype):
    mesh, spec = mesh_and_spec(layout)
    q = random(10, (BATCH, SEQ_Q, heads_q, HEAD_DIM), dtype)
    k = random(11, (BATCH, SEQ_K, heads_kv, HEAD_DIM), dtype)
    v = random(12, (BATCH, SEQ_K, heads_kv, HEAD_DIM), dtype)
    ct = random(13, q.shape, jnp.float32)

    def attn(q, k, v):
        return jax_aiter.flash_attn_func(q, k, v, causal=causal)

    op = shard_mapped(attn, mesh, (spec, spec, spec), spec)
    args = tuple(put(a, mesh, spec) for a in (q, k, v))

    compiled = op.lower(*args).compile()
    hlo = compiled.as_text()
    assert "all-gather" not in hlo and "all-to-all" not in hlo, "attention did not run per shard"
    out = compiled(*args)
    assert out.sharding.spec == spec
    assert_close(out, attn(q, k, v), dtype, f"flash_attn_func ({layout}, causal={causal}) output")

    def loss(f):
        return lambda *a: jnp.sum(f(*a).astype(jnp.float32) * ct)

    grads = jax.jit(jax.grad(loss(op), argnums=(0, 1, 2)))(*args)
    grads0 = jax.jit(jax.grad(loss(attn), argnums=(0, 1, 2)))(q, k, v)
    for name, g, g0 in zip(("dq", "dk", "dv"), grads, grads0):
        assert g.sharding.spec == spec
        assert_close(g, g0, dtype, f"flash_attn_func {name} ({layout}, causal={causal})")
