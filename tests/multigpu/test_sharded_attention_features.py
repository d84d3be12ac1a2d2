"""Attention's features sharded over batch and heads: segment ids, cu_seqlens, a bias, ALiBi, a window, softcap
and dropout, under plain jax.jit on NamedSharding-ed operands (XLA's partitioner places the kernels by their
rules: jax_aiter/ops/_attention_sharding.py) and inside jax.shard_map.

For each: the forward and every gradient equal the single-device result; the output and the gradients keep
their inputs' batch and heads shardings; the compiled program moves no operand between devices (no all-gather,
all-to-all or collective-permute: each device runs the kernels on its own batch rows and heads, with its own
rows of the mask, its own slopes and its own bias block); the kernels run on per-shard shapes. Under jit, dropout
draws the unsharded mask (each shard offsets its batch and head indices into the Philox counter); inside a
user's shard_map each call sees only its shard and draws as a batch of its own, so there the reference is the
op run on each shard's slices alone (docs/transformations.md, dropout_key).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _mesh_cases import (
    assert_close,
    kernel_shapes,
    layout_params,
    mesh_and_spec,
    moves,
    put,
    random,
)
from jax.sharding import PartitionSpec as P

import jax_aiter
from jax_aiter import mha

BATCH, SEQ, HQ, HKV, D = 4, 24, 8, 4, 32
SEG = np.repeat(np.asarray([[0, 1, 2], [3, 3, 4], [5, 6, 6], [7, 7, 7]], np.int32), SEQ // 3, axis=1)


def _specs(spec: P):
    """Partition specs of the per-example arguments from the activations' spec: batch and heads axes."""
    b, h = spec[0], spec[2]
    return {"seg": P(b, None), "bias": P(b, h, None, None), "alibi": P(b, h)}


FEATURES = {
    "segments-window-softcap": lambda q, k, v, seg, bias, alibi: jax_aiter.flash_attn_func(
        q, k, v, segment_ids=seg, causal=True, window_size=(5, -1), softcap=7.0),
    "bias-alibi": lambda q, k, v, seg, bias, alibi: jax_aiter.flash_attn_func(
        q, k, v, bias=bias, alibi_slopes=alibi, causal=True),
    "everything-dropout": lambda q, k, v, seg, bias, alibi: jax_aiter.flash_attn_func(
        q, k, v, segment_ids=seg, bias=bias, alibi_slopes=alibi, window_size=(6, 2), softcap=9.0, dropout_p=0.2,
        dropout_key=jax.random.key(3)),
}


def _inputs(dtype):
    q = random(20, (BATCH, SEQ, HQ, D), dtype)
    k, v = random(21, (BATCH, SEQ, HKV, D), dtype), random(22, (BATCH, SEQ, HKV, D), dtype)
    bias = random(23, (BATCH, HQ, SEQ, SEQ), jnp.float32)
    alibi = jnp.abs(random(24, (BATCH, HQ), jnp.float32)) * 0.2
    return q, k, v, jnp.asarray(SEG), bias, alibi


@pytest.mark.parametrize("layout", layout_params())
@pytest.mark.parametrize("feature", list(FEATURES))
@pytest.mark.parametrize("mode", ["jit", "shard_map"])
def test_features_sharded_over_batch_and_heads(layout, feature, mode):
    fn = FEATURES[feature]
    mesh, spec = mesh_and_spec(layout)
    s = _specs(spec)
    specs = (spec, spec, spec, s["seg"], s["bias"], s["alibi"])
    dtype = jnp.bfloat16 if feature == "bias-alibi" else jnp.float32
    args0 = _inputs(dtype)
    args = tuple(put(a, mesh, sp) for a, sp in zip(args0, specs))
    ct = random(25, args0[0].shape, jnp.float32)

    def loss(f):
        return lambda *a: jnp.sum(f(*a).astype(jnp.float32) * ct)

    run = fn if mode == "jit" else jax.shard_map(fn, mesh=mesh, in_specs=specs, out_specs=spec)
    grad = jax.grad(loss(run), argnums=(0, 1, 2, 4))
    if mode == "shard_map" and "dropout" in feature:
        wants = _per_shard(fn, args0, ct, mesh, spec)
    else:
        wants = fn(*args0), jax.jit(jax.grad(loss(fn), argnums=(0, 1, 2, 4)))(*args0)
    for what, f, want in (("forward", run, wants[0]), ("grad", grad, wants[1])):
        compiled = jax.jit(f).lower(*args).compile()
        text = compiled.as_text()
        assert not moves(text), f"{feature} {mode} {what}: operands moved between devices: {moves(text)}"
        calls = kernel_shapes(text, "ja_mha_fwd")
        shard_b = BATCH // (mesh.shape[spec[0]] if spec[0] else 1)
        shard_h = HQ // (mesh.shape[spec[2]] if spec[2] else 1)
        assert calls and all(c[0].endswith(f"[{shard_b},{SEQ},{shard_h},{D}]") for c in calls), \
            f"{feature} {mode} {what}: the forward kernel does not run per shard: {calls}"
        got = compiled(*args)
        if what == "forward":
            assert got.sharding.is_equivalent_to(args[0].sharding, 4), (got.sharding, args[0].sharding)
            assert_close(got, want, dtype, f"{feature} {layout} {mode} forward")
            continue
        for name, g, w, a in zip(("dq", "dk", "dv", "dbias"), got, want, (args[0], args[1], args[2], args[4])):
            assert g.sharding.is_equivalent_to(a.sharding, g.ndim), f"{name}: {g.sharding} vs {a.sharding}"
            assert_close(g, w, dtype if name != "dbias" else jnp.float32, f"{feature} {layout} {mode} {name}")


def _per_shard(fn, args0, ct, mesh, spec):
    """(output, grads of sum(out * ct) for q, k, v, bias) with fn run on each shard's slices alone, put together:
    what a shard_map of fn computes when each shard's call knows nothing of the others."""
    nb = mesh.shape[spec[0]] if spec[0] else 1
    nh = mesh.shape[spec[2]] if spec[2] else 1
    b, hq, hk = BATCH // nb, HQ // nh, HKV // nh
    out = np.zeros(args0[0].shape, np.float32)
    grads = [np.zeros(a.shape, np.float32) for a in (args0[0], args0[1], args0[2], args0[4])]
    for i in range(nb):
        for j in range(nh):
            bs, qs, ks = slice(i * b, (i + 1) * b), slice(j * hq, (j + 1) * hq), slice(j * hk, (j + 1) * hk)
            q, k, v, seg, bias, alibi = args0
            part = (q[bs, :, qs], k[bs, :, ks], v[bs, :, ks], seg[bs], bias[bs, qs], alibi[bs, qs])
            c = ct[bs, :, qs]
            out[bs, :, qs] = np.asarray(fn(*part), np.float32)
            g = jax.grad(lambda *a, c=c: jnp.sum(fn(*a).astype(jnp.float32) * c), argnums=(0, 1, 2, 4))(*part)
            for acc, x, idx in zip(grads, g, ((bs, slice(None), qs), (bs, slice(None), ks), (bs, slice(None), ks),
                                               (bs, qs))):
                acc[idx] = np.asarray(x, np.float32)
    return out, grads


@pytest.mark.parametrize("layout", [p for p in layout_params() if p.id == "heads"])
def test_varlen_sharded_over_heads(layout):
    """A packed batch (batch 1) with cu_seqlens: the heads stay sharded, the boundaries replicated, and each
    device runs its heads of every sequence; lse [heads, total] sharded like the heads."""
    mesh, spec = mesh_and_spec(layout)
    cu = jnp.asarray([0, 9, 9, 30, 48], jnp.int32)
    q = random(30, (48, HQ, D), jnp.float32)
    k, v = random(31, (48, HKV, D), jnp.float32), random(32, (48, HKV, D), jnp.float32)
    pspec = P(None, spec[2], None)

    def fn(q, k, v, cu):
        out, lse = mha.flash_attn_varlen(q, k, v, cu, cu, causal=True, window_size=(7, -1), return_lse=True)
        return out, lse

    args = (put(q, mesh, pspec), put(k, mesh, pspec), put(v, mesh, pspec), put(cu, mesh, P()))
    compiled = jax.jit(fn).lower(*args).compile()
    assert not moves(compiled.as_text()), moves(compiled.as_text())
    out, lse = compiled(*args)
    want_out, want_lse = fn(q, k, v, cu)
    assert out.sharding.is_equivalent_to(args[0].sharding, 3)
    assert lse.sharding.is_equivalent_to(jax.sharding.NamedSharding(mesh, P(spec[2], None)), 2)
    assert_close(out, want_out, jnp.float32, "varlen out")
    np.testing.assert_allclose(np.asarray(lse), np.asarray(want_lse), rtol=0, atol=2e-5)

    def loss(q, k, v, cu):
        out, lse = fn(q, k, v, cu)
        return jnp.sum(out * out) + jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0.0))

    g = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(*args)
    g0 = jax.grad(loss, argnums=(0, 1, 2))(q, k, v, cu)
    for name, a, b, x in zip(("dq", "dk", "dv"), g, g0, args):
        assert a.sharding.is_equivalent_to(x.sharding, 3), name
        assert_close(a, b, jnp.float32, f"varlen {name}")
