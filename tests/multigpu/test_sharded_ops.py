"""rms_norm, rms_norm_with_add and silu_and_mul inside jax.shard_map over a device mesh.

Batch- and head-sharded (and both, on 4 devices): each device runs the FFI
kernel on its shard (checked in the compiled HLO), the result equals the
single-device result, and so do the gradients (the replicated weight's
gradient is the psum over shards). On the CPU these run with
XLA_FLAGS=--xla_force_host_platform_device_count=4 (`JA_TEST_TIER=multigpu bash ci/test.sh`).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from _mesh_cases import (
    assert_close,
    assert_equal,
    custom_call_shapes,
    hlo_shape,
    layout_params,
    local_shape,
    mesh_and_spec,
    put,
    random,
    shard_mapped,
)
from jax.sharding import PartitionSpec as P

import jax_aiter

SHAPE = (4, 8, 4, 64)  # batch, seq, heads, head_dim (normalised over head_dim)
DTYPES = [jnp.float32, jnp.bfloat16]
dtypes = pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
layouts = pytest.mark.parametrize("layout", layout_params())


def _grads(fn, args, cts):
    """Gradients of sum(out * ct) over every output: a fixed random cotangent per output."""
    def loss(*a):
        outs = fn(*a)
        outs = outs if isinstance(outs, tuple) else (outs,)
        return sum(jnp.sum(o.astype(jnp.float32) * c) for o, c in zip(outs, cts))
    return jax.jit(jax.grad(loss, argnums=tuple(range(len(args)))))(*args)


@layouts
@dtypes
def test_rms_norm_sharded_equals_single_device(layout, dtype):
    mesh, spec = mesh_and_spec(layout)
    x, w = random(0, SHAPE, dtype), random(1, SHAPE[-1:], dtype)
    ct = random(2, SHAPE, jnp.float32)
    op = shard_mapped(jax_aiter.rms_norm, mesh, (spec, P()), spec)
    xs, ws = put(x, mesh, spec), put(w, mesh, P())

    compiled = op.lower(xs, ws).compile()
    assert custom_call_shapes(compiled.as_text(), "ja_rmsnorm_fwd") == \
        [hlo_shape(dtype, local_shape(SHAPE, mesh, spec))]  # the kernel ran per shard, not on a gathered array
    out = compiled(xs, ws)
    assert out.sharding.spec == spec
    assert_equal(out, jax_aiter.rms_norm(x, w), "rms_norm")

    dx, dw = _grads(op, (xs, ws), (ct,))
    dx0, dw0 = _grads(jax_aiter.rms_norm, (x, w), (ct,))
    assert_close(dx, dx0, dtype, "d rms_norm / dx")
    assert_close(dw, dw0, dtype, "d rms_norm / dweight (psum over shards)")


@layouts
@dtypes
def test_rms_norm_with_add_sharded_equals_single_device(layout, dtype):
    mesh, spec = mesh_and_spec(layout)
    x, r, w = random(3, SHAPE, dtype), random(4, SHAPE, dtype), random(5, SHAPE[-1:], dtype)
    cts = (random(6, SHAPE, jnp.float32), random(7, SHAPE, jnp.float32))
    op = shard_mapped(jax_aiter.rms_norm_with_add, mesh, (spec, spec, P()), (spec, spec))
    args = (put(x, mesh, spec), put(r, mesh, spec), put(w, mesh, P()))

    out, summed = op(*args)
    out0, summed0 = jax_aiter.rms_norm_with_add(x, r, w)
    assert_equal(out, out0, "rms_norm_with_add output")
    assert_equal(summed, summed0, "rms_norm_with_add residual sum")

    grads = _grads(op, args, cts)
    grads0 = _grads(jax_aiter.rms_norm_with_add, (x, r, w), cts)
    for name, g, g0 in zip(("dx", "dresidual", "dweight"), grads, grads0):
        assert_close(g, g0, dtype, f"rms_norm_with_add {name}")


@layouts
@dtypes
def test_silu_and_mul_sharded_equals_single_device(layout, dtype):
    mesh, spec = mesh_and_spec(layout)
    shape = (*SHAPE[:-1], 2 * SHAPE[-1])  # [gate | up] on the unsharded last axis
    x, ct = random(8, shape, dtype), random(9, SHAPE, jnp.float32)
    op = shard_mapped(jax_aiter.silu_and_mul, mesh, (spec,), spec)
    xs = put(x, mesh, spec)

    compiled = op.lower(xs).compile()
    assert custom_call_shapes(compiled.as_text(), "ja_silu_and_mul") == \
        [hlo_shape(dtype, local_shape(SHAPE, mesh, spec))]
    out = compiled(xs)
    assert_equal(out, jax_aiter.silu_and_mul(x), "silu_and_mul")
    (dx,), (dx0,) = _grads(op, (xs,), (ct,)), _grads(jax_aiter.silu_and_mul, (x,), (ct,))
    assert_close(dx, dx0, dtype, "d silu_and_mul / dx")
