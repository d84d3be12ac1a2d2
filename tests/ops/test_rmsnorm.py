"""rms_norm and rms_norm_with_add against a float64 reference: values, gradients, vmap, errors."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_aiter as ja
from tests.ops.reference import DTYPES, assert_close, f32, f64, random, rms_norm_ref

# Hidden sizes off the 16-byte vector width (7, 100, 1000), every GPU block shape of the
# common widths (4096, 5120, 7168, 8192: 128, 160, 224 and 256 threads) and large rows (16384).
SHAPES = [(1, 1), (3, 7), (4, 64), (2, 3, 100), (5, 1000), (17, 4096), (9, 5120), (9, 7168), (5, 8192),
          (2, 16384)]
EPS = 1e-6


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_rms_norm_matches_reference(shape, dtype, device):
    x, w = random(shape, dtype, 0), random(shape[-1:], dtype, 1)
    got = jax.jit(ja.rms_norm, static_argnums=2)(x, w, EPS)
    assert got.dtype == jnp.dtype(dtype) and got.devices() == {device}
    assert_close(got, rms_norm_ref(x, w, EPS), dtype, what="rms_norm")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("shape", [(3, 7), (2, 3, 100), (17, 4096), (9, 5120), (9, 7168), (5, 8192)], ids=str)
def test_rms_norm_with_add_matches_reference(shape, dtype, device):
    x, r, w = random(shape, dtype, 0), random(shape, dtype, 2), random(shape[-1:], dtype, 1)
    out, summed = jax.jit(ja.rms_norm_with_add)(x, r, w)
    ref_sum = f64(x) + f64(r)
    assert_close(summed, ref_sum, dtype, what="residual")
    assert_close(out, rms_norm_ref(ref_sum, w, EPS), dtype, what="rms_norm_with_add")


def test_eps_is_applied(device):
    x = jnp.zeros((2, 8), jnp.float32).at[0, 0].set(1e-3)
    w = jnp.ones((8,), jnp.float32)
    for eps in (1e-6, 1e-2):
        assert_close(ja.rms_norm(x, w, eps), rms_norm_ref(x, w, eps), jnp.float32, what=f"eps={eps}")


def _ref_jnp(x, w, eps=EPS):
    xf = x.astype(jnp.float32)
    return xf * jax.lax.rsqrt(jnp.mean(xf * xf, -1, keepdims=True) + eps) * w.astype(jnp.float32)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
def test_rms_norm_grad_matches_reference(dtype, device):
    x, w, g = random((6, 96), dtype, 3), random((96,), dtype, 4), random((6, 96), jnp.float32, 5)
    # Under jit: one program per side instead of one eager program per primitive of the
    # backward pass (eager grads are covered by test_vmap_of_grad).
    ours = jax.jit(jax.grad(lambda x, w: jnp.sum(ja.rms_norm(x, w).astype(jnp.float32) * g), argnums=(0, 1)))(x, w)
    ref = jax.jit(jax.grad(lambda x, w: jnp.sum(_ref_jnp(x, w) * g), argnums=(0, 1)))(f32(x), f32(w))
    for got, want, name in zip(ours, ref, ("dx", "dweight")):
        assert got.dtype == jnp.dtype(dtype)
        assert_close(got, f64(want), dtype, scale=float(np.abs(f64(want)).max()), what=name)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
def test_rms_norm_with_add_grad_matches_reference(dtype, device):
    x, r, w = random((4, 40), dtype, 6), random((4, 40), dtype, 7), random((40,), dtype, 8)
    g1, g2 = random((4, 40), jnp.float32, 9), random((4, 40), jnp.float32, 10)

    def ours(x, r, w):
        out, s = ja.rms_norm_with_add(x, r, w)
        return jnp.sum(out.astype(jnp.float32) * g1) + jnp.sum(s.astype(jnp.float32) * g2)

    def ref(x, r, w):
        s = x + r
        return jnp.sum(_ref_jnp(s, w) * g1) + jnp.sum(s * g2)

    got = jax.jit(jax.grad(ours, argnums=(0, 1, 2)))(x, r, w)
    want = jax.jit(jax.grad(ref, argnums=(0, 1, 2)))(f32(x), f32(r), f32(w))
    for a, b, name in zip(got, want, ("dx", "dresidual", "dweight")):
        assert_close(a, f64(b), dtype, scale=float(np.abs(f64(b)).max()), what=name)


def test_vmap_over_rows_and_over_weights(device):
    x = random((3, 5, 32), jnp.bfloat16, 11)
    w = random((32,), jnp.bfloat16, 12)
    ws = random((3, 32), jnp.bfloat16, 13)
    stacked = jnp.stack([ja.rms_norm(x[i], w) for i in range(3)])
    np.testing.assert_array_equal(f64(jax.vmap(ja.rms_norm, in_axes=(0, None))(x, w)), f64(stacked))
    per_w = jnp.stack([ja.rms_norm(x[i], ws[i]) for i in range(3)])
    np.testing.assert_array_equal(f64(jax.vmap(ja.rms_norm)(x, ws)), f64(per_w))
    out, s = jax.vmap(ja.rms_norm_with_add, in_axes=(0, None, None))(x, x[0], w)
    for i in range(3):
        o_i, s_i = ja.rms_norm_with_add(x[i], x[0], w)
        np.testing.assert_array_equal(f64(out[i]), f64(o_i))
        np.testing.assert_array_equal(f64(s[i]), f64(s_i))


def test_vmap_of_grad(device):
    x, w = random((3, 4, 16), jnp.float32, 14), random((16,), jnp.float32, 15)
    f = jax.grad(lambda x, w: jnp.sum(ja.rms_norm(x, w) ** 2), argnums=(0, 1))
    dx, dw = jax.vmap(f, in_axes=(0, None))(x, w)  # eager: the batching rules op by op
    per_example = jax.jit(f)                          # the reference: one program, not one per op
    for i in range(3):
        dxi, dwi = per_example(x[i], w)
        np.testing.assert_allclose(f64(dx[i]), f64(dxi), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(f64(dw[i]), f64(dwi), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=lambda d: jnp.dtype(d).name)
def test_float32_weight_with_16_bit_rows_is_computed_in_float32(dtype, device):
    """Flax's default (param_dtype float32, dtype bfloat16): the weight is used in float32, not rounded to x's
    dtype first, and the results are x's dtype; the gradients are each input's dtype."""
    x, r, g = random((6, 96), dtype, 6), random((6, 96), dtype, 7), random((6, 96), jnp.float32, 8)
    w = random((96,), jnp.float32, 9) * (1 + 2 ** -10)  # not representable in 16 bits: rounding it would show
    ulp = float(jnp.finfo(dtype).eps)

    def one_rounding(got, x, w):  # within an ulp of the float32 result, and not the result of a rounded weight
        np.testing.assert_allclose(f64(got), f64(_ref_jnp(x, w).astype(dtype)), rtol=ulp, atol=0)
        assert not np.array_equal(f64(got), f64(_ref_jnp(x, w.astype(dtype)).astype(dtype)))

    out = jax.jit(ja.rms_norm)(x, w)
    assert out.dtype == jnp.dtype(dtype)
    one_rounding(out, x, w)
    (out2, summed) = jax.jit(ja.rms_norm_with_add)(x, r, w)
    assert out2.dtype == summed.dtype == jnp.dtype(dtype)
    total = (f32(x) + f32(r)).astype(dtype)
    np.testing.assert_array_equal(f64(summed), f64(total))
    one_rounding(out2, total, w)
    ours = jax.jit(jax.grad(lambda x, w: jnp.sum(ja.rms_norm(x, w).astype(jnp.float32) * g), argnums=(0, 1)))(x, w)
    ref = jax.jit(jax.grad(lambda x, w: jnp.sum(_ref_jnp(x, w) * g), argnums=(0, 1)))(f32(x), w)
    for got, want, want_dtype, name in zip(ours, ref, (dtype, jnp.float32), ("dx", "dweight")):
        assert got.dtype == jnp.dtype(want_dtype), name
        assert_close(got, f64(want), dtype, scale=float(np.abs(f64(want)).max()), what=name)


@pytest.mark.parametrize(
    "make, exc, text",
    [
        (lambda: (jnp.ones((2, 4), jnp.int32), jnp.ones(4, jnp.int32), EPS), TypeError, "supported dtypes are"),
        (lambda: (jnp.ones((2, 4)), jnp.ones(4, jnp.int32), EPS), TypeError, "weight has dtype int32"),
        (lambda: (jnp.ones((2, 4)), jnp.ones(5), EPS), ValueError, "must be (hidden,) = (4,)"),
        (lambda: (jnp.ones((2, 4)), jnp.ones((1, 4)), EPS), ValueError, "must be (hidden,)"),
        (lambda: (jnp.ones(()), jnp.ones(1), EPS), ValueError, "rank >= 1"),
        (lambda: (jnp.ones((2, 4)), jnp.ones(4), "1e-6"), TypeError, "eps must be a Python float"),
        (lambda: (jnp.ones((2, 4)), jnp.ones(4), jnp.float32(1e-6) * jnp.ones(())), TypeError, "not an array"),
        (lambda: (jnp.ones((2, 4)), jnp.ones(4), -1.0), ValueError, "non-negative"),
        (lambda: (jnp.ones((2, 4)), jnp.ones(4), True), TypeError, "eps must be a Python float"),
    ],
)
def test_bad_input_is_a_clear_error(make, exc, text, device):
    with pytest.raises(exc, match=None) as info:
        ja.rms_norm(*make())
    assert text in str(info.value), str(info.value)


def test_residual_shape_mismatch(device):
    with pytest.raises(ValueError, match="residual shape"):
        ja.rms_norm_with_add(jnp.ones((2, 4)), jnp.ones((3, 4)), jnp.ones(4))
    with pytest.raises(TypeError, match="residual.astype"):
        ja.rms_norm_with_add(jnp.ones((2, 4)), jnp.ones((2, 4), jnp.float16), jnp.ones(4))
