"""FSDP-style sharding: every op under plain jax.jit on NamedSharding-ed operands (no shard_map).

A model trained with FSDP keeps each parameter sharded over the mesh ("fsdp" axis) and
its activations sharded over the batch; jax.jit and XLA's SPMD partitioner place the
FFI kernels by their sharding rules (jax_aiter/ops/_partition.py; test_jit_sharding.py
reads the compiled HLO). The forward result and every gradient must equal the
single-device result. The 2-device layout runs on a
2-GPU host; the 4-device one on 4 GPUs and on the CPU with
XLA_FLAGS=--xla_force_host_platform_device_count=4 (`JA_TEST_TIER=multigpu bash ci/test.sh`).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from _mesh_cases import assert_close, random
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jax_aiter

# name: (mesh axes, mesh shape); activations are sharded over every axis on the batch,
# parameters over "fsdp" on their first axis (the way FSDP splits a parameter).
MESHES = {
    "fsdp2": (("fsdp",), (2,)),
    "data2_fsdp2": (("data", "fsdp"), (2, 2)),
}
BATCH, SEQ, HIDDEN = 4, 8, 256
DTYPES = [jnp.float32, jnp.bfloat16]

meshes = pytest.mark.parametrize("mesh_name", [
    pytest.param(name, id=name, marks=pytest.mark.multigpu(devices=shape[0] * (shape[1] if len(shape) > 1 else 1)))
    for name, (_, shape) in MESHES.items()])
dtypes = pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)


def _mesh(name: str) -> jax.sharding.Mesh:
    """Auto axes: jax.jit's propagation (GSPMD) places the ops, as an FSDP model under plain jit has it."""
    axes, shape = MESHES[name]
    n = 1
    for s in shape:
        n *= s
    return jax.make_mesh(shape, axes, devices=jax.devices()[:n], axis_types=(jax.sharding.AxisType.Auto,) * len(axes))


def _batch(mesh) -> P:
    return P(tuple(mesh.axis_names))  # the batch over every mesh axis


def _put(x, mesh, spec: P):
    out = jax.device_put(x, NamedSharding(mesh, spec))
    assert len(out.sharding.device_set) == mesh.size  # really spread over the mesh
    return out


def _value_and_grads(fn, args, ct):
    """(output, gradients of sum(out * ct) for every argument), all under one jax.jit."""
    def loss(*a):
        return jnp.sum(fn(*a).astype(jnp.float32) * ct)

    return jax.jit(fn)(*args), jax.jit(jax.grad(loss, argnums=tuple(range(len(args)))))(*args)


def _check(fn, args, sharded, ct, dtype, what):
    out, grads = _value_and_grads(fn, sharded, ct)
    out0, grads0 = _value_and_grads(fn, args, ct)
    assert_close(out, out0, dtype, f"{what} output")
    for i, (g, g0) in enumerate(zip(grads, grads0)):
        assert g.shape == g0.shape
        assert_close(g, g0, dtype, f"{what} gradient of argument {i}")


@meshes
@dtypes
def test_rms_norm_fsdp(mesh_name, dtype):
    mesh = _mesh(mesh_name)
    x, w, ct = random(20, (BATCH, SEQ, HIDDEN), dtype), random(21, (HIDDEN,), dtype), random(22, (BATCH, SEQ, HIDDEN),
                                                                                           jnp.float32)
    sharded = (_put(x, mesh, _batch(mesh)), _put(w, mesh, P("fsdp")))
    _check(jax_aiter.rms_norm, (x, w), sharded, ct, dtype, f"rms_norm ({mesh_name})")


@meshes
@dtypes
def test_rms_norm_with_add_fsdp(mesh_name, dtype):
    mesh = _mesh(mesh_name)
    x, r, w = (random(23, (BATCH, SEQ, HIDDEN), dtype), random(24, (BATCH, SEQ, HIDDEN), dtype),
               random(25, (HIDDEN,), dtype))
    ct = random(26, (BATCH, SEQ, HIDDEN), jnp.float32)

    def op(x, r, w):  # both outputs enter the loss
        out, summed = jax_aiter.rms_norm_with_add(x, r, w)
        return out.astype(jnp.float32) + 0.5 * summed.astype(jnp.float32)

    sharded = (_put(x, mesh, _batch(mesh)), _put(r, mesh, _batch(mesh)), _put(w, mesh, P("fsdp")))
    _check(op, (x, r, w), sharded, ct, dtype, f"rms_norm_with_add ({mesh_name})")


@meshes
@dtypes
def test_silu_and_mul_fsdp(mesh_name, dtype):
    """An MLP's up projection with an FSDP-sharded weight, then silu_and_mul."""
    mesh = _mesh(mesh_name)
    x, w_up = random(27, (BATCH, SEQ, HIDDEN), dtype), random(28, (HIDDEN, 2 * HIDDEN), dtype) * 0.05
    ct = random(29, (BATCH, SEQ, HIDDEN), jnp.float32)

    def mlp(x, w_up):
        return jax_aiter.silu_and_mul(x @ w_up)

    sharded = (_put(x, mesh, _batch(mesh)), _put(w_up, mesh, P("fsdp", None)))
    _check(mlp, (x, w_up), sharded, ct, dtype, f"silu_and_mul ({mesh_name})")


@meshes
@pytest.mark.parametrize("heads_q,heads_kv,causal,dtype", [
    pytest.param(4, 4, False, jnp.float32, id="mha-f32"),
    pytest.param(4, 2, True, jnp.bfloat16, id="gqa2-causal-bf16"),
])
def test_flash_attn_fsdp(mesh_name, heads_q, heads_kv, causal, dtype):
    """Attention after q/k/v projections whose weights are FSDP-sharded; gradients for x and every weight."""
    mesh = _mesh(mesh_name)
    head_dim, model = 64, 128
    x = random(30, (BATCH, SEQ, model), dtype)
    wq = random(31, (model, heads_q * head_dim), dtype) * 0.1
    wk = random(32, (model, heads_kv * head_dim), dtype) * 0.1
    wv = random(33, (model, heads_kv * head_dim), dtype) * 0.1
    ct = random(34, (BATCH, SEQ, heads_q, head_dim), jnp.float32)

    def attn(x, wq, wk, wv):
        b, s, _ = x.shape
        q = (x @ wq).reshape(b, s, heads_q, head_dim)
        k = (x @ wk).reshape(b, s, heads_kv, head_dim)
        v = (x @ wv).reshape(b, s, heads_kv, head_dim)
        return jax_aiter.flash_attn_func(q, k, v, causal=causal)

    sharded = (_put(x, mesh, _batch(mesh)), *(_put(w, mesh, P("fsdp", None)) for w in (wq, wk, wv)))
    _check(attn, (x, wq, wk, wv), sharded, ct, dtype, f"flash_attn_func ({mesh_name}, causal={causal})")
