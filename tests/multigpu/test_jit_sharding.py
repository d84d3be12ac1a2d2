"""The ops under plain jax.jit with NamedSharding inputs are partitioned, not gathered.

XLA's partitioner splits each op by its sharding rule (jax_aiter/ops/_partition.py): the compiled
program (read here as HLO text) runs each kernel on the shard's shapes, moves no operand between
devices (no all-gather, all-to-all or collective-permute; the weight and MQA K/V gradients are
all-reduced, as any replicated parameter's are), and its results keep the inputs' sharding. Values
equal the single-device ones. A dimension the kernel cannot split (a norm's hidden size, attention's
sequences) is resharded by the partitioner, and the result stays correct.
4 devices: a GPU host with 4 GPUs, or the CPU with XLA_FLAGS=--xla_force_host_platform_device_count=4.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _mesh_cases import assert_close, hlo_shape, kernel_shapes, moves, random
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jax_aiter

pytestmark = pytest.mark.multigpu(devices=4)
DTYPES = pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=lambda d: jnp.dtype(d).name)


def _mesh(axis_type=jax.sharding.AxisType.Auto) -> jax.sharding.Mesh:
    """Auto axes: the partitioner propagates shardings (an FSDP model under plain jit); Explicit axes
    (jax.make_mesh's default) carry them in the types."""
    return jax.make_mesh((2, 2), ("data", "model"), devices=jax.devices()[:4], axis_types=(axis_type,) * 2)


def _local(shape, mesh, spec) -> tuple[int, ...]:
    spec = tuple(spec) + (None,) * (len(shape) - len(tuple(spec)))
    sizes = [int(np.prod([mesh.shape[a] for a in (e if isinstance(e, tuple) else (e,))])) if e else 1 for e in spec]
    return tuple(n // k for n, k in zip(shape, sizes))


def _compiled(fn, args):
    compiled = jax.jit(fn).lower(*args).compile()
    return compiled, compiled.as_text()


def _loss_grad(fn, n, cts):
    def loss(*a):
        outs = fn(*a)
        outs = outs if isinstance(outs, tuple) else (outs,)
        return sum(jnp.sum(o.astype(jnp.float32) * c) for o, c in zip(outs, cts))
    return jax.grad(loss, argnums=tuple(range(n)))


def _check_partitioned(fn, args, specs, target, kernel_local, out_specs, grad_specs, cts, dtype, what,
                       mesh=None):
    """Forward and grad of fn on args placed by specs: no operand moves, the kernel's shapes are the
    shard's, results keep their specs, values equal the single-device ones."""
    mesh = mesh or _mesh()
    placed = [jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(args, specs)]
    grad = _loss_grad(fn, len(args), cts)
    for name, f, want_specs in (("forward", fn, out_specs), ("grad", grad, grad_specs)):
        compiled, text = _compiled(f, placed)
        assert moves(text) == [], f"{what} {name}: the compiled program moves operands: {moves(text)}"
        shapes = kernel_shapes(text, target)  # a grad needing only the residuals has no forward kernel
        assert (shapes or name == "grad") and all(s[0] == kernel_local for s in shapes), \
            f"{what} {name}: kernel result shapes {shapes}, expected the shard's {kernel_local}"
        got = compiled(*placed)
        for g, spec in zip(jax.tree.leaves(got), want_specs):
            assert g.sharding.is_equivalent_to(NamedSharding(mesh, spec), g.ndim), \
                f"{what} {name}: result sharding {g.sharding.spec}, expected {spec}"
            assert g.addressable_shards[0].data.shape == _local(g.shape, mesh, spec)
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(jax.jit(f)(*args))):
            assert_close(g, w, dtype, f"{what} {name}")


ROWS = [P("data", "model"), P(("data", "model"))]  # rows split over both mesh axes: batch x seq, or batch alone


@pytest.mark.parametrize("spec", ROWS, ids=["batch-seq", "batch"])
@DTYPES
def test_norms_and_silu_keep_rows_sharded(spec, dtype):
    shape, hidden = (4, 8, 128), 128
    x, r, w = random(1, shape, dtype), random(2, shape, dtype), random(3, (hidden,), dtype)
    ct, local = random(4, shape, jnp.float32), _local(shape, _mesh(), spec)
    _check_partitioned(jax_aiter.rms_norm, (x, w), (spec, P()), "ja_rmsnorm_fwd", hlo_shape(dtype, local),
                       [spec], [spec, P()], (ct,), dtype, "rms_norm")
    _check_partitioned(jax_aiter.rms_norm_with_add, (x, r, w), (spec, spec, P()), "ja_rmsnorm_fwd_add",
                       hlo_shape(dtype, local), [spec, spec], [spec, spec, P()], (ct, ct), dtype, "rms_norm_with_add")
    half = random(5, (*shape[:-1], hidden // 2), jnp.float32)
    _check_partitioned(jax_aiter.silu_and_mul, (x,), (spec,), "ja_silu_and_mul",
                       hlo_shape(dtype, (*local[:-1], hidden // 2)), [spec], [spec], (half,), dtype, "silu_and_mul")


ATTN = [  # (heads_q, heads_kv, causal, dtype): MHA, GQA (kv heads split with their groups), MQA (K/V whole)
    pytest.param(4, 4, False, jnp.float32, id="mha-f32"),
    pytest.param(8, 2, True, jnp.bfloat16, id="gqa4-causal-bf16"),
    pytest.param(4, 1, True, jnp.float32, id="mqa-causal-f32"),
]


@pytest.mark.parametrize("heads_q,heads_kv,causal,dtype", ATTN)
def test_attention_keeps_batch_and_heads_sharded(heads_q, heads_kv, causal, dtype):
    batch, seq_q, seq_k, d = 4, 16, 24, 64
    q, k, v = (random(10, (batch, seq_q, heads_q, d), dtype), random(11, (batch, seq_k, heads_kv, d), dtype),
               random(12, (batch, seq_k, heads_kv, d), dtype))
    ct = random(13, q.shape, jnp.float32)
    q_spec = P("data", None, "model")
    kv_spec = P("data", None, "model") if heads_kv > 1 else P("data")

    def attn(q, k, v):
        return jax_aiter.flash_attn_func(q, k, v, causal=causal)

    local = hlo_shape(dtype, _local(q.shape, _mesh(), q_spec))
    _check_partitioned(attn, (q, k, v), (q_spec, kv_spec, kv_spec), "ja_mha_fwd", local, [q_spec],
                       [q_spec, kv_spec, kv_spec], (ct,), dtype, f"flash_attn_func {heads_q}/{heads_kv}")
    mesh = _mesh()
    placed = [jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip((q, k, v), (q_spec, kv_spec, kv_spec))]
    _, text = _compiled(_loss_grad(attn, 3, (ct,)), placed)
    (bwd,) = kernel_shapes(text, "ja_mha_bwd")
    assert bwd[:3] == (local, *(hlo_shape(dtype, _local(k.shape, mesh, kv_spec)),) * 2), bwd


def test_explicit_mesh_axes_are_partitioned_too():
    """jax.make_mesh's default axis type, Explicit: the same partitioning."""
    mesh = _mesh(jax.sharding.AxisType.Explicit)
    x, w, ct = random(40, (4, 8, 128), jnp.float32), random(41, (128,), jnp.float32), random(42, (4, 8, 128),
                                                                                           jnp.float32)
    spec = P("data", "model")
    _check_partitioned(jax_aiter.rms_norm, (x, w), (spec, P()), "ja_rmsnorm_fwd",
                       hlo_shape(jnp.float32, (2, 4, 128)), [spec], [spec, P()], (ct,), jnp.float32,
                       "rms_norm (explicit)", mesh)
    q, k = random(43, (4, 16, 8, 64), jnp.float32), random(44, (4, 24, 2, 64), jnp.float32)
    q_spec = P("data", None, "model")
    _check_partitioned(lambda q, k, v: jax_aiter.flash_attn_func(q, k, v, causal=True), (q, k, k),
                       (q_spec,) * 3, "ja_mha_fwd", hlo_shape(jnp.float32, (2, 16, 4, 64)), [q_spec], [q_spec] * 3,
                       (q,), jnp.float32, "flash_attn_func (explicit)", mesh)


def test_split_hidden_and_attention_splits_stay_split():
    """A split hidden axis stays split (the rows' sums of squares are all-reduced; nothing is gathered) and the
    values equal the single-device ones. Attention keeps a split query sequence (K/V gathered, never q) and
    query heads split across GQA groups (each shard takes its kv heads): the kernel runs on the shard's rows
    and heads."""
    mesh = _mesh()
    x, w = random(20, (4, 8, 128), jnp.float32), random(21, (128,), jnp.float32)
    xs = jax.device_put(x, NamedSharding(mesh, P("data", None, "model")))  # hidden split over "model"
    compiled, text = _compiled(jax_aiter.rms_norm, (xs, w))
    assert moves(text) == [] and "all-reduce" in text, text
    assert compiled(xs, w).sharding.is_equivalent_to(xs.sharding, 3)
    assert_close(compiled(xs, w), jax_aiter.rms_norm(x, w), jnp.float32, "hidden-split rms_norm")

    q, k = random(22, (2, 16, 4, 64), jnp.float32), random(23, (2, 24, 2, 64), jnp.float32)
    seq = NamedSharding(mesh, P("data", "model"))  # sequences split over "model"
    qs, ks = jax.device_put(q, seq), jax.device_put(k, seq)

    def attn(q, k, v):
        return jax_aiter.flash_attn_func(q, k, v, causal=True)

    compiled, text = _compiled(attn, (qs, ks, ks))
    assert {s[0] for s in kernel_shapes(text, "ja_mha_fwd")} == {hlo_shape(jnp.float32, (1, 8, 4, 64))}  # q's rows
    assert_close(compiled(qs, ks, ks), attn(q, k, k), jnp.float32, "seq-sharded attention")
    grads = jax.jit(_loss_grad(attn, 3, (q,)))(qs, ks, ks)
    for g, w in zip(grads, jax.jit(_loss_grad(attn, 3, (q,)))(q, k, k)):
        assert_close(g, w, jnp.float32, "seq-sharded attention grad")

    # query heads split 2 ways over 3 kv heads: a shard's 3 query heads read kv heads (0, 0, 1) or (1, 2, 2)
    q6, k3 = random(24, (2, 16, 6, 64), jnp.float32), random(25, (2, 24, 3, 64), jnp.float32)
    q6s = jax.device_put(q6, NamedSharding(mesh, P("data", None, "model")))
    compiled, text = _compiled(attn, (q6s, k3, k3))
    assert kernel_shapes(text, "ja_mha_fwd")[0][0] == hlo_shape(jnp.float32, (1, 16, 3, 64))  # the shard's heads
    assert moves(text) == [], f"the compiled program moves operands: {moves(text)}"
    assert_close(compiled(q6s, k3, k3), attn(q6, k3, k3), jnp.float32, "GQA 6/3 split 2 ways")


@pytest.mark.parametrize("case", ["mqa-heads", "seq-q"])
def test_grad_through_shard_map_with_replicated_kv(case):
    """q sharded (over heads with one kv head, or over its sequence without a mask), K/V replicated
    (in_specs P()): values and gradients equal the single-device ones; dK/dV are psum-ed by JAX."""
    mesh = jax.make_mesh((2,), ("x",), devices=jax.devices()[:2])
    heads_kv, causal, q_spec = (1, True, P(None, None, "x")) if case == "mqa-heads" else (2, False, P(None, "x"))
    q = random(30, (2, 16, 4, 64), jnp.float32)
    k, v = random(31, (2, 24, heads_kv, 64), jnp.float32), random(32, (2, 24, heads_kv, 64), jnp.float32)
    ct = random(33, q.shape, jnp.float32)

    def attn(q, k, v):
        return jax_aiter.flash_attn_func(q, k, v, causal=causal)

    mapped = jax.shard_map(attn, mesh=mesh, in_specs=(q_spec, P(), P()), out_specs=q_spec)
    args = (jax.device_put(q, NamedSharding(mesh, q_spec)), *(jax.device_put(a, NamedSharding(mesh, P()))
                                                               for a in (k, v)))
    assert_close(jax.jit(mapped)(*args), attn(q, k, v), jnp.float32, f"{case} forward")
    for name, g, w in zip(("dq", "dk", "dv"), jax.jit(_loss_grad(mapped, 3, (ct,)))(*args),
                          jax.jit(_loss_grad(attn, 3, (ct,)))(q, k, v)):
        assert_close(g, w, jnp.float32, f"{case} {name}")


def test_small_inputs_count_the_shard(monkeypatch):
    """JA_KERNEL_MIN_BYTES counts one device's call: 16 KiB of rows split 4 ways (4 KiB a shard) are written in
    jax.numpy at a limit of 8 KiB, where the whole array alone would have called the kernel, and call it at
    4 KiB; the values are the kernel's either way."""
    x, w = random(50, (4, 8, 128), jnp.float32), random(51, (128,), jnp.float32)
    xs = jax.device_put(x, NamedSharding(_mesh(), P("data", "model")))
    want = jax_aiter.rms_norm(x, w)  # the plugin's 0: the kernel
    for limit, shapes in ((8 << 10, []), (4 << 10, [(hlo_shape(jnp.float32, (2, 4, 128)),)])):
        monkeypatch.setenv("JA_KERNEL_MIN_BYTES", str(limit))
        compiled, text = _compiled(lambda x, w: jax_aiter.rms_norm(x, w), (xs, w))
        assert kernel_shapes(text, "ja_rmsnorm_fwd") == shapes, f"limit {limit}"
        assert moves(text) == [], f"limit {limit}: the compiled program moves operands: {moves(text)}"
        assert_close(compiled(xs, w), want, jnp.float32, f"limit {limit}")
