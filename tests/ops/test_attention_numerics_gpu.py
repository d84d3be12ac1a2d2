"""Attention numerics on the GPU that issue 58 measured there: bf16 gradients on a peaked softmax against cuDNN's
error on the same case, and indexing past 2^31 elements (the nightly tier: gigabytes and minutes).

The error measure is tests/ops/reference.py's (normwise against float64). cuDNN is plain JAX's fused path,
jax.nn.dot_product_attention(implementation="cudnn"), given the same bf16 inputs; both are compared with one
float64 reference computed from those inputs.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_aiter
from tests.ops.reference import attention_ref, f64, rel_err

pytestmark = pytest.mark.gpu


def _grads(attend, q, k, v, do):
    out, vjp = jax.vjp(attend, q, k, v)
    return (out, *vjp(do))


def _peaked_inputs(seed: int, peak: float, b=2, s=1024, h=8, d=128):
    """q scaled by `peak` (issue 58: q x 30): most rows put nearly all their weight on one or two keys."""
    rng = np.random.default_rng(seed)
    dev = jax.devices("gpu")[0]
    host = [rng.standard_normal((b, s, h, d), np.float32) for _ in range(4)]
    host[0] *= peak
    host = [x.astype(jnp.bfloat16) for x in host]  # rounded once, on the host: both kernels see these values
    return [jax.device_put(x, dev) for x in host], [f64(x) for x in host]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_bf16_peaked_gradients_within_2x_cudnn(causal, record_property):
    """Each gradient's error is at most 2x cuDNN's on the same peaked bf16 case (issue 58: dq 1.5e-2 against
    cuDNN's 3.0e-3), and the output's too."""
    (q, k, v, do), (qe, ke, ve, doe) = _peaked_inputs(1, 30.0)
    scale = q.shape[-1] ** -0.5
    ours = jax.jit(lambda *a: _grads(lambda q, k, v: jax_aiter.flash_attn_func(q, k, v, causal=causal), *a))
    cudnn = jax.jit(lambda *a: _grads(lambda q, k, v: jax.nn.dot_product_attention(
        q, k, v, is_causal=causal, scale=scale, implementation="cudnn"), *a))
    ref_o, ref_g = attention_ref(qe, ke, ve, doe, causal, scale)
    names, refs = ("o", "dq", "dk", "dv"), (ref_o, *ref_g)
    err_ours = {n: rel_err(g, r) for n, g, r in zip(names, ours(q, k, v, do), refs)}
    err_cudnn = {n: rel_err(g, r) for n, g, r in zip(names, cudnn(q, k, v, do), refs)}
    for n in names:
        record_property(f"{n}_ours", err_ours[n])
        record_property(f"{n}_cudnn", err_cudnn[n])
    print(f"peaked bf16 ({'causal' if causal else 'full'}): ours {err_ours} cudnn {err_cudnn}")
    worse = {n: (err_ours[n], err_cudnn[n]) for n in names if not err_ours[n] <= 2 * err_cudnn[n]}
    assert not worse, f"error above 2x cuDNN's (ours, cudnn): {worse}"


@pytest.mark.slow
def test_one_query_against_35m_keys_on_gpu():
    """seq_k x head_dim of one head past 2^31 elements (35.6M keys at head_dim 64, one kv head): K = 0 gives a
    uniform softmax and V is 0 for the first half of the keys and 1 for the second, so o = 0.5 exactly."""
    sk, d = 35_600_000, 64
    dev = jax.devices("gpu")[0]
    with jax.default_device(dev):
        half = (jnp.arange(sk) >= sk // 2).astype(jnp.bfloat16)
        q = jnp.zeros((1, 1, 1, d), jnp.bfloat16)
        k = jnp.zeros((1, sk, 1, d), jnp.bfloat16)
        v = half[None, :, None, None] * jnp.ones((1, 1, 1, d), jnp.bfloat16)
        o = jax.jit(jax_aiter.flash_attn_func)(q, k, v)
    want = (sk - sk // 2) / sk
    got = np.asarray(o, np.float32)
    assert np.allclose(got, want, rtol=4e-3), (got.ravel()[:4], want)


@pytest.mark.slow
@pytest.mark.gpu_memory(gib=40)  # q, O, dO, dQ 4.2 GiB each, dQ's float32 accumulator 8.75: 26 GiB live (31 failed)
def test_one_key_against_35m_queries_on_gpu():
    """The backward's dV of one key seen by 35.6M query rows (P = 1) is the sum of their dO: 35.6M, past both 2^31
    elements of dO x head_dim and float32's 2^24 for a single running sum."""
    sq, d = 35_600_000, 64
    dev = jax.devices("gpu")[0]
    with jax.default_device(dev):
        q = jnp.zeros((1, sq, 1, d), jnp.bfloat16)
        k = jnp.zeros((1, 1, 1, d), jnp.bfloat16)
        v = jnp.ones((1, 1, 1, d), jnp.bfloat16)
        do = jnp.ones((1, sq, 1, d), jnp.bfloat16)
        _, dq, dk, dv = jax.jit(lambda *a: _grads(jax_aiter.flash_attn_func, *a))(q, k, v, do)
    got = np.asarray(dv, np.float64).ravel()
    assert np.allclose(got, sq, rtol=8e-3), (got[:4], sq)  # one bf16 rounding of the float32 sum
    assert not np.asarray(dk, np.float32).any() and not np.asarray(dq, np.float32).any()
