"""The ops as JAX citizens on one device: zero-size inputs, array-likes, the head-dim padding advice,
and clear errors for what is unsupported (forward-mode autodiff, higher-order gradients).
Export and registration are in test_export.py; sharding in tests/multigpu/."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_aiter
from tests.ops.reference import attention_features_ref, f64, rel_err, window_mask_ref

F32 = jnp.float32


def _rand(seed, shape, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _attn(q, k, v):
    return jax_aiter.flash_attn_func(q, k, v, causal=True)


def _norm_add(x, r, w):
    out, summed = jax_aiter.rms_norm_with_add(x, r, w)
    return out + summed  # both results enter the loss


# (id, op, argument shapes): a zero somewhere in every case
EMPTY = [
    ("rms_norm-rows0", jax_aiter.rms_norm, [(0, 64), (64,)]),
    ("rms_norm-seq0", jax_aiter.rms_norm, [(2, 0, 64), (64,)]),
    ("rms_norm-hidden0", jax_aiter.rms_norm, [(3, 0), (0,)]),
    ("rms_norm_with_add-rows0", _norm_add, [(0, 64), (0, 64), (64,)]),
    ("silu_and_mul-rows0", jax_aiter.silu_and_mul, [(0, 128)]),
    ("silu_and_mul-seq0", jax_aiter.silu_and_mul, [(2, 0, 128)]),
    ("flash-batch0", _attn, [(0, 8, 4, 64), (0, 8, 2, 64), (0, 8, 2, 64)]),
    ("flash-seq_q0", _attn, [(2, 0, 4, 64), (2, 8, 2, 64), (2, 8, 2, 64)]),
    ("flash-seq_k0", _attn, [(2, 8, 4, 64), (2, 0, 2, 64), (2, 0, 2, 64)]),
    ("flash-heads0", _attn, [(2, 8, 0, 64), (2, 8, 2, 64), (2, 8, 2, 64)]),
]


@pytest.mark.parametrize("op,shapes", [c[1:] for c in EMPTY], ids=[c[0] for c in EMPTY])
def test_zero_size_inputs_give_empty_outputs_and_grads_without_a_kernel(device, op, shapes):
    args = [jnp.asarray(_rand(i, s)) for i, s in enumerate(shapes)]

    def loss(*a):
        return jnp.sum(op(*a))

    grad = jax.jit(jax.grad(loss, argnums=tuple(range(len(args)))))
    for fn in (op, grad):
        text = str(jax.make_jaxpr(fn)(*args))
        assert "ffi_call" not in text and "custom_partitioning" not in text, f"a kernel is called:\n{text}"
    out = jax.jit(op)(*args)
    want_shape = shapes[0] if op is not jax_aiter.silu_and_mul else (*shapes[0][:-1], shapes[0][-1] // 2)
    assert out.shape == want_shape and out.dtype == F32
    assert np.all(np.asarray(out) == 0) or out.size == 0  # seq_k 0: rows that see no key give 0
    grads = grad(*args)
    for g, a in zip(grads, args):
        assert g.shape == a.shape and g.dtype == a.dtype
        assert np.all(np.asarray(g) == 0)


def test_array_likes_follow_jax_numpy(device):
    """Lists and NumPy float64 arrays are converted as jnp.asarray converts them (float32 without x64)."""
    x64, w64 = _rand(0, (4, 64), np.float64), _rand(1, (64,), np.float64)
    x, w = jnp.asarray(x64), jnp.asarray(w64)
    assert x.dtype == F32
    np.testing.assert_array_equal(jax_aiter.rms_norm(x64, w64.tolist()), jax_aiter.rms_norm(x, w))
    out, summed = jax_aiter.rms_norm_with_add(x64, x64.tolist(), w64)
    want = jax_aiter.rms_norm_with_add(x, x, w)
    np.testing.assert_array_equal(out, want[0])
    np.testing.assert_array_equal(summed, want[1])
    np.testing.assert_array_equal(jax_aiter.silu_and_mul(x64.tolist()), jax_aiter.silu_and_mul(x))
    q64 = _rand(2, (1, 4, 2, 32), np.float64)
    np.testing.assert_array_equal(jax_aiter.flash_attn_func(q64, q64.tolist(), q64),
                                  jax_aiter.flash_attn_func(*(jnp.asarray(q64),) * 3))
    with pytest.raises(TypeError, match=r"rms_norm: x has dtype int32"):
        jax_aiter.rms_norm([[1, 2]], [1.0, 2.0])
    with pytest.raises(TypeError, match=r"silu_and_mul: x must be an array or array-like"):
        jax_aiter.silu_and_mul("not an array")


def test_any_head_dim_needs_no_padding(device):
    """A head dim without a kernel instance of its own (48, and head_dim_v 24) runs as it is: the caller never
    pads (docs/attention.md, Head dims); output and gradients against float64."""
    d, dv = 48, 24
    (q, k, v, do) = (_rand(i, s) for i, s in enumerate([(2, 9, 4, d), (2, 13, 2, d), (2, 13, 2, dv), (2, 9, 4, dv)]))
    out, vjp = jax.vjp(lambda q, k, v: jax_aiter.flash_attn_func(q, k, v, causal=True), q, k, v)
    ref_o, _, ref_grads = attention_features_ref(f64(q), f64(k), f64(v), f64(do), scale=d ** -0.5,
                                                 mask=window_mask_ref(9, 13, True)[None])
    for name, got, ref in zip(("o", "dq", "dk", "dv"), (out, *vjp(jnp.asarray(do))), (ref_o, *ref_grads[:3])):
        assert rel_err(got, ref) <= 1e-4, f"{name}: head_dim {d}/{dv} differs from float64"


@pytest.mark.parametrize("transform", [
    pytest.param(lambda f, x: jax.jvp(f, (x,), (x,)), id="jvp"),
    pytest.param(lambda f, x: jax.jacfwd(f)(x), id="jacfwd"),
])
def test_forward_mode_is_refused_clearly(device, transform):
    x = jnp.asarray(_rand(0, (1, 4, 2, 32)))
    for f in (lambda a: jax_aiter.rms_norm(a, a[0, 0, 0]), jax_aiter.silu_and_mul,
              lambda a: jax_aiter.flash_attn_func(a, a, a)):
        with pytest.raises(TypeError, match="can't apply forward-mode autodiff"):
            transform(f, x)


def test_grad_of_grad_of_attention_is_refused_clearly(device):
    q = jnp.asarray(_rand(0, (1, 4, 2, 32)))

    def first(a):
        return jnp.sum(jnp.sin(jax_aiter.flash_attn_func(a, q, q)))

    jax.grad(first)(q)  # first order works
    with pytest.raises(NotImplementedError, match=r"flash_attn_func: higher-order derivatives .* not supported"):
        jax.grad(lambda a: jnp.sum(jax.grad(first)(a) ** 2))(q)


def test_grad_of_grad_of_the_norms_and_silu_matches_plain_jax(device):
    """Their backward is plain JAX, so reverse-over-reverse works and equals plain JAX's."""
    x, r, w = (jnp.asarray(_rand(i, s)) for i, s in enumerate([(3, 64), (3, 64), (64,)]))

    def plain_norm(x, w):
        return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * w

    def plain_silu(x):
        a, b = jnp.split(x, 2, -1)
        return jax.nn.silu(a) * b

    cases = [(jax_aiter.rms_norm, plain_norm, (x, w)), (jax_aiter.silu_and_mul, plain_silu, (x,)),
             (lambda x, r, w: jax_aiter.rms_norm_with_add(x, r, w)[0], lambda x, r, w: plain_norm(x + r, w), (x, r, w))]
    for ours, plain, args in cases:
        def second(f, args=args):
            argnums = tuple(range(len(args)))
            inner = jax.grad(lambda *b: jnp.sum(jnp.sin(f(*b))), argnums=argnums)
            return jax.grad(lambda *a: sum(jnp.sum(g ** 2) for g in inner(*a)), argnums=argnums)
        for got, want in zip(second(ours)(*args), second(plain)(*args)):
            np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)
