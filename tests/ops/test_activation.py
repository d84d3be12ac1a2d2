"""silu_and_mul against a float64 reference: values, gradients, vmap, errors."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_aiter as ja
from tests.ops.reference import DTYPES, assert_close, f32, f64, random, silu_and_mul_ref

SHAPES = [(1, 2), (3, 14), (4, 128), (2, 3, 200), (7, 2 * 1001), (9, 2 * 8192)]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_silu_and_mul_matches_reference(shape, dtype, device):
    x = random(shape, dtype, 0, scale=3.0)
    got = jax.jit(ja.silu_and_mul)(x)
    assert got.shape == (*shape[:-1], shape[-1] // 2) and got.dtype == jnp.dtype(dtype)
    assert got.devices() == {device}
    assert_close(got, silu_and_mul_ref(x), dtype, what="silu_and_mul")


def test_extreme_inputs_stay_finite(device):
    x = jnp.asarray([[-100.0, -20.0, 0.0, 20.0, 3.0, 2.0, 1.0, 0.5]], jnp.float32)
    assert_close(ja.silu_and_mul(x), silu_and_mul_ref(x), jnp.float32, what="extremes")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
def test_grad_matches_reference(dtype, device):
    x, g = random((5, 48), dtype, 1, scale=2.0), random((5, 24), jnp.float32, 2)

    def ref(x):
        a, b = jnp.split(x, 2, axis=-1)
        return jnp.sum(jax.nn.silu(a) * b * g)

    got = jax.jit(jax.grad(lambda x: jnp.sum(ja.silu_and_mul(x).astype(jnp.float32) * g)))(x)
    want = jax.jit(jax.grad(ref))(f32(x))
    assert got.dtype == jnp.dtype(dtype)
    assert_close(got, f64(want), dtype, scale=float(np.abs(f64(want)).max()), what="dx")


def test_vmap_matches_per_example(device):
    x = random((4, 3, 64), jnp.float16, 3)
    per = jnp.stack([ja.silu_and_mul(x[i]) for i in range(4)])
    np.testing.assert_array_equal(f64(jax.vmap(ja.silu_and_mul)(x)), f64(per))
    np.testing.assert_array_equal(f64(jax.vmap(ja.silu_and_mul, in_axes=1, out_axes=1)(x)), f64(per))


def test_bad_input_is_a_clear_error(device):
    with pytest.raises(ValueError, match="must be even"):
        ja.silu_and_mul(jnp.ones((2, 5)))
    with pytest.raises(TypeError, match="supported dtypes are float32, bfloat16, float16"):
        ja.silu_and_mul(jnp.ones((2, 4), jnp.int8))


# --- gate and up as two arrays: upstream's jax_aiter.activation.silu_and_mul(gate, up) ---------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
def test_gate_and_up_match_the_joined_form_and_the_reference(dtype, device):
    """silu_and_mul(gate, up) is silu_and_mul(concat([gate, up])) bit for bit (one kernel), upstream's facade is the
    same function, and both are the float64 reference."""
    from jax_aiter.activation import silu_and_mul

    gate, up = random((3, 5, 200), dtype, 4, scale=3.0), random((3, 5, 200), dtype, 5, scale=3.0)
    got = jax.jit(silu_and_mul)(gate, up)
    np.testing.assert_array_equal(f64(got), f64(ja.silu_and_mul(jnp.concatenate([gate, up], -1))))
    np.testing.assert_array_equal(f64(got), f64(ja.silu_and_mul(gate, up)))
    assert got.dtype == jnp.dtype(dtype) and got.devices() == {device}
    assert_close(got, silu_and_mul_ref(np.concatenate([f64(gate), f64(up)], -1)), dtype, what="gate, up")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
def test_gate_and_up_are_differentiable(dtype, device):
    """Both gradients, first and second order, against plain JAX's silu(gate) * up in float32."""
    from jax_aiter.activation import silu_and_mul

    gate, up, g = random((6, 40), dtype, 6, scale=2.0), random((6, 40), dtype, 7), random((6, 40), jnp.float32, 8)
    loss = lambda f: lambda a, b: jnp.sum(f(a, b).astype(jnp.float32) * g)
    plain = lambda a, b: jax.nn.silu(a) * b
    got = jax.jit(jax.grad(loss(silu_and_mul), argnums=(0, 1)))(gate, up)
    want = jax.jit(jax.grad(loss(plain), argnums=(0, 1)))(f32(gate), f32(up))
    for name, x, w in zip(("dgate", "dup"), got, want):
        assert x.dtype == jnp.dtype(dtype)
        assert_close(x, f64(w), dtype, scale=float(np.abs(f64(w)).max()), what=name)
    hess = jax.grad(lambda a: jnp.sum(jax.grad(loss(silu_and_mul))(a, f32(up))))(f32(gate))
    want = jax.grad(lambda a: jnp.sum(jax.grad(loss(plain))(a, f32(up))))(f32(gate))
    assert_close(hess, f64(want), jnp.float32, scale=float(np.abs(f64(want)).max()), what="grad of grad")


def test_gate_and_up_under_vmap_and_their_errors(device):
    gate, up = random((4, 3, 64), jnp.float16, 9), random((4, 3, 64), jnp.float16, 10)
    per = jnp.stack([ja.silu_and_mul(gate[i], up[i]) for i in range(4)])
    np.testing.assert_array_equal(f64(jax.vmap(ja.silu_and_mul)(gate, up)), f64(per))
    with pytest.raises(ValueError, match=r"gate has shape \(4, 3, 64\) but up has \(4, 3, 32\)"):
        ja.silu_and_mul(gate, up[..., :32])
    with pytest.raises(TypeError, match="up has dtype float32 but gate has float16"):
        ja.silu_and_mul(gate, up.astype(jnp.float32))
    assert ja.silu_and_mul(gate[:0], up[:0]).shape == (0, 3, 64)
