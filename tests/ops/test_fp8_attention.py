"""FP8 attention (jax_aiter.mha.flash_attn_func / flash_attn_varlen with float8_e4m3fn q, k, v and their descales)
against float64: the attention of the values the inputs stand for (element * descale), bfloat16 out.

The float8 inputs are exact in float64, so the only error is the kernel's float32 accumulation and the bfloat16
rounding of the output (tests/ops/reference.py's bfloat16 bound); lse is float32.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jax_aiter
from jax_aiter.mha import flash_attn_func, flash_attn_varlen
from tests.ops.reference import TOL, f64, paged_attention_ref

FP8 = ml_dtypes.float8_e4m3fn


@pytest.fixture
def cpu(device):
    if device.platform != "cpu":
        pytest.skip("FP8 attention runs on the CPU kernel only so far (docs/serving.md, Backends)")
    return device


def _fp8(shape, seed, scale=2.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(FP8)


def _check(got, want, what):
    tol = TOL[jnp.dtype(jnp.bfloat16)]
    np.testing.assert_allclose(f64(got), want, rtol=tol["rtol"], atol=tol["atol"] * max(1.0, np.abs(want).max()),
                               err_msg=what)


def _dense_ref(q, k, v, descales, *, causal, window, softcap, scale):
    """The dense batch as sequences of one page each (paged_attention_ref's table), descales per (sequence, kv
    head)."""
    b, sq, hq, d = q.shape
    sk = k.shape[1]
    table = (np.arange(b + 1), np.arange(b), np.full(b, sk))
    return paged_attention_ref(q.reshape(b * sq, hq, d), k, v, np.arange(b + 1) * sq, *table, scale=scale,
                               causal=causal, window=window, softcap=softcap, descales=descales)


CASES = [  # (b, sq, sk, hq, hk, d, causal, window, softcap, per-(batch, kv head) descales)
    (2, 7, 7, 4, 4, 64, False, (-1, -1), 0.0, False),
    (2, 5, 40, 8, 2, 128, True, (-1, -1), 0.0, True),     # GQA, a prompt over a longer history
    (1, 70, 70, 4, 1, 64, True, (16, -1), 20.0, True),    # MQA, a sliding window with softcap
    (3, 1, 90, 6, 2, 96, True, (-1, -1), 0.0, False),     # decode shapes, head_dim 96
]


@pytest.mark.parametrize("b,sq,sk,hq,hk,d,causal,window,softcap,per_head", CASES)
def test_fp8_attention_matches_float64(cpu, b, sq, sk, hq, hk, d, causal, window, softcap, per_head):
    q, k, v = _fp8((b, sq, hq, d), 0), _fp8((b, sk, hk, d), 1), _fp8((b, sk, hk, d), 2)
    rng = np.random.default_rng(3)
    descales = [rng.uniform(0.25, 2.0, (b, hk) if per_head else (1,)).astype(np.float32) for _ in range(3)]
    want, want_lse = _dense_ref(f64(q), k, v, descales, causal=causal, window=window, softcap=softcap,
                                scale=d ** -0.5)
    want, want_lse = want.reshape(b, sq, hq, d), want_lse.reshape(hq, b, sq).transpose(1, 0, 2)
    if softcap:  # jax_aiter.mha.flash_attn_func has no softcap (upstream's has none): the top-level door's
        run = jax.jit(lambda *a: (jax_aiter.flash_attn_func(*a[:3], causal=causal, window_size=window,
                                                           softcap=softcap, q_descale=a[3], k_descale=a[4],
                                                           v_descale=a[5]), None))
    else:
        run = jax.jit(lambda *a: flash_attn_func(*a[:3], causal=causal, window_size=window, return_lse=True,
                                                 q_descale=a[3], k_descale=a[4], v_descale=a[5]))
    out, lse = run(q, k, v, *descales)
    assert out.dtype == jnp.bfloat16 and out.shape == (b, sq, hq, d)
    _check(out, want, "fp8 attention")
    if lse is not None:
        assert lse.shape == (b, hq, sq)
        np.testing.assert_allclose(np.asarray(lse), want_lse, rtol=1e-5, atol=1e-5)


def test_fp8_varlen_with_empty_sequences(cpu):
    """Packed sequences (one without keys, one without queries), causal, GQA; lse [heads_q, total_q]."""
    cu_q, cu_k = np.array([0, 4, 4, 9, 12], np.int32), np.array([0, 6, 6, 6, 20], np.int32)
    q, k, v = _fp8((12, 4, 32), 4), _fp8((20, 2, 32), 5), _fp8((20, 2, 32), 6)
    one = np.ones((1,), np.float32)
    out, lse = flash_attn_varlen(q, k, v, cu_q, cu_k, causal=True, return_lse=True, q_descale=one * 0.5,
                                 k_descale=one, v_descale=one * 4)
    assert out.dtype == jnp.bfloat16 and lse.shape == (4, 12)
    table = (cu_k, np.arange(20), (np.diff(cu_k) > 0).astype(np.int32))
    want, want_lse = paged_attention_ref(q, k[:, None], v[:, None], cu_q, *table, scale=32 ** -0.5, causal=True,
                                         descales=(0.5, 1.0, 4.0))
    _check(out, want, "fp8 varlen")
    assert np.all(np.asarray(out)[4:9] == 0) and np.all(np.isposinf(np.asarray(lse)[:, 4:9]))  # no keys
    np.testing.assert_allclose(np.asarray(lse), want_lse, rtol=1e-5, atol=1e-5)


def test_fp8_attention_has_no_gradient(cpu):
    q, k, v = _fp8((1, 4, 2, 32), 7), _fp8((1, 4, 2, 32), 8), _fp8((1, 4, 2, 32), 9)

    def loss(scale):
        (out,) = flash_attn_func(q, k, v, q_descale=scale, k_descale=scale, v_descale=scale)
        return jnp.sum(out.astype(jnp.float32))

    with pytest.raises(NotImplementedError, match="paged KV cache's kernels \\(and FP8 attention's\\) are inference"):
        jax.grad(loss)(jnp.ones((1,), jnp.float32))
