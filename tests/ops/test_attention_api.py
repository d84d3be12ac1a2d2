"""Attention's arguments through the public API: every bad argument refused with an error naming it, before any
kernel runs; the conventions that need no kernel of their own (zero heads, head_dim 0, windows that cover every
key); lse's gradient through the upstream facade (docs/attention.md). Each feature against float64:
test_attention_features.py."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_aiter
from jax_aiter import mha
from tests.ops.reference import f64, rel_err


def _inputs(seed, dtype, b, sq, sk, hq, hkv, d):
    rng = np.random.default_rng(seed)
    return [jax.device_put(rng.standard_normal(s).astype(np.float32).astype(jnp.dtype(dtype)))
            for s in ((b, sq, hq, d), (b, sk, hkv, d), (b, sk, hkv, d))]


def _qkv(shape=(1, 8, 2, 32), kv=None):
    kv = shape if kv is None else kv
    return jnp.zeros(shape), jnp.zeros(kv), jnp.zeros(kv)


BAD = [
    ("window three ints", {"window_size": (1, 2, 3)}, TypeError, r"window_size must be two Python ints"),
    ("window floats", {"window_size": (1.0, 2)}, TypeError, r"window_size must be two Python ints"),
    ("window int", {"window_size": 4}, TypeError, r"window_size must be two Python ints"),
    ("window -2", {"window_size": (-2, 0)}, ValueError, r"window_size entries must be -1 \(unbounded\) or >= 0"),
    ("dropout 1", {"dropout_p": 1.0}, ValueError, r"dropout_p must be in \[0, 1\), got 1.0"),
    ("dropout negative", {"dropout_p": -0.1}, ValueError, r"dropout_p must be in \[0, 1\)"),
    ("dropout array", {"dropout_p": jnp.asarray(0.1)}, TypeError, r"dropout_p must be a Python float"),
    ("alibi shape", {"alibi_slopes": np.ones(3, np.float32)}, ValueError,
     r"alibi_slopes must have shape \[heads_q\] = \(2,\) or \[batch, heads_q\] = \(1, 2\), got \(3,\)"),
    ("alibi int", {"alibi_slopes": np.ones(2, np.int32)}, TypeError, r"alibi_slopes must be a float array"),
    ("bias shape", {"bias": np.ones((3, 8, 8), np.float32)}, ValueError,
     r"bias of shape \(3, 8, 8\) does not broadcast to \[batch, heads_q, seq_q, seq_k\] = \(1, 2, 8, 8\)"),
    ("softcap negative", {"softcap": -1.0}, ValueError, r"softcap must be >= 0"),
    ("segment ids shape", {"segment_ids": np.zeros((1, 7), np.int32)}, ValueError,
     r"segment_ids must have shape \[batch, seq\] = \(1, 8\)"),
    ("segment ids float", {"segment_ids": np.zeros((1, 8), np.float32)}, TypeError,
     r"segment_ids must be an integer array of rank 2"),
    ("causal int", {"causal": 1}, TypeError, r"causal must be a Python bool"),
    ("deterministic str", {"deterministic": "yes"}, TypeError, r"deterministic must be a Python bool"),
    ("key", {"dropout_p": 0.1, "dropout_key": 3}, TypeError, r"dropout_key must be a jax.random key"),
    ("implementation unknown", {"implementation": "fa3"}, ValueError,
     (r"implementation must be None \(automatic\) or one of the kernel families 'cpu', 'simt', 'mma', 'decode', "
      r"'sm90', got 'fa3'")),
    ("implementation auto", {"implementation": "auto"}, ValueError, r"implementation must be None \(automatic\)"),
    ("implementation int", {"implementation": 3}, ValueError, r"implementation must be None"),
]


@pytest.mark.parametrize("kwargs,exc,msg", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_arguments_name_the_argument(kwargs, exc, msg):
    with pytest.raises(exc, match=msg):
        jax_aiter.flash_attn_func(*_qkv(), **kwargs)


CU_BAD = [
    ("decreasing", [0, 5, 3, 8], [0, 5, 3, 8], 0,
     r"cu_seqlens_q must not decrease: entry 2 \(3\) is below entry 1 \(5\)"),
    ("short", [0, 3, 6], [0, 3, 6], 0, r"cu_seqlens_q must end at the number of packed tokens q = 8, got 6"),
    ("not from 0", [1, 3, 8], [1, 3, 8], 0, r"cu_seqlens_q must start at 0"),
    # the argument named (issue 84: the message said max_seqlen, which no API takes)
    ("over max", [0, 6, 8], [0, 6, 8], 4,
     r"sequence 0 has 6 tokens in cu_seqlens_q, more than max_seqlen_q 4; pass max_seqlen_q >= 6 \(or 0: not given\)"),
    ("counts", [0, 4, 8], [0, 8], 0, r"cu_seqlens_q and cu_seqlens_kv must count the same sequences, got 2 and 1"),
    ("float", np.array([0.0, 8.0]), [0, 8], 0, r"cu_seqlens_q must be an integer array of rank 1"),
]


@pytest.mark.parametrize("cu_q,cu_k,max_len,msg", [c[1:] for c in CU_BAD], ids=[c[0] for c in CU_BAD])
def test_bad_cu_seqlens_name_the_argument(cu_q, cu_k, max_len, msg):
    q, k, v = _qkv((8, 2, 32))
    with pytest.raises(ValueError if "float" not in msg and "integer" not in msg else TypeError, match=msg):
        mha.flash_attn_varlen(q, k, v, np.asarray(cu_q), np.asarray(cu_k), max_seqlen_q=max_len, max_seqlen_k=max_len)


def test_a_too_small_max_seqlen_names_its_own_argument():
    """max_seqlen_q and max_seqlen_k are checked against their own boundaries, each error naming its argument."""
    q, k, v = _qkv((8, 2, 32))
    cu_q, cu_k = np.asarray([0, 3, 8]), np.asarray([0, 6, 8])
    with pytest.raises(ValueError, match=r"sequence 1 has 5 tokens in cu_seqlens_q, more than max_seqlen_q 4; pass "
                                         r"max_seqlen_q >= 5"):
        mha.flash_attn_varlen(q, k, v, cu_q, cu_k, max_seqlen_q=4, max_seqlen_k=6)
    with pytest.raises(ValueError, match=r"sequence 0 has 6 tokens in cu_seqlens_kv, more than max_seqlen_k 5; pass "
                                         r"max_seqlen_k >= 6"):
        mha.flash_attn_varlen(q, k, v, cu_q, cu_k, max_seqlen_q=5, max_seqlen_k=5)


def test_other_bad_combinations():
    q, k, v = _qkv((8, 2, 32))
    with pytest.raises(ValueError, match=r"give both cu_seqlens_q and cu_seqlens_kv"):
        jax_aiter.flash_attn_func(q, k, v, cu_seqlens_q=np.array([0, 8]))
    with pytest.raises(ValueError, match=r"give segment_ids or cu_seqlens_q/cu_seqlens_kv, not both"):
        jax_aiter.flash_attn_func(q, k, v, cu_seqlens_q=np.array([0, 8]), cu_seqlens_kv=np.array([0, 8]),
                                  segment_ids=np.zeros((1, 8), np.int32))
    with pytest.raises(ValueError, match=r"segment_ids need seq_q == seq_k"):
        jax_aiter.flash_attn_func(*_qkv((1, 8, 2, 32), (1, 6, 2, 32)), segment_ids=np.zeros((1, 8), np.int32))
    with pytest.raises(ValueError, match=r"head_dim 257 is larger than 256"):
        jax_aiter.flash_attn_func(*_qkv((1, 4, 2, 257)))
    with pytest.raises(ValueError, match=r"with cu_seqlens, q, k and v are packed"):
        jax_aiter.flash_attn_func(*_qkv((2, 4, 2, 32)), cu_seqlens_q=np.array([0, 4]), cu_seqlens_kv=np.array([0, 4]))


def test_heads_zero_and_head_dim_zero(device):
    """Zero heads return an empty output (docs/transformations.md); head_dim 0 is attention of all-equal scores
    (the mean of the visible values), head_dim_v 0 an empty output, each with gradients and no error."""
    z = jnp.zeros((2, 8, 0, 32), jnp.float32)
    assert jax_aiter.flash_attn_func(z, z, z).shape == (2, 8, 0, 32)
    q0, v = jnp.zeros((1, 5, 2, 0)), jnp.asarray(np.random.default_rng(0).standard_normal((1, 5, 2, 32)), jnp.float32)
    out = jax_aiter.flash_attn_func(q0, q0, v, causal=True)
    want = np.cumsum(np.asarray(v), axis=1) / np.arange(1, 6)[None, :, None, None]
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-5, atol=1e-6)
    e = jnp.zeros((1, 5, 2, 16))
    assert jax_aiter.flash_attn_func(e, e, jnp.zeros((1, 5, 2, 0))).shape == (1, 5, 2, 0)


def test_window_wider_than_the_sequence_is_plain_attention(device):
    q, k, v = _inputs(11, "bfloat16", 2, 20, 30, 4, 2, 64)
    for causal, window in ((False, (100, 100)), (True, (100, -1)), (False, (29, 19))):
        a = jax_aiter.flash_attn_func(q, k, v, causal=causal, window_size=window)
        b = jax_aiter.flash_attn_func(q, k, v, causal=causal)
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def test_lse_is_differentiable_through_the_facade(device):
    """jax_aiter.mha's tuple (out, lse) under jit and grad: a loss through both gives plain JAX's gradients (the lse
    part by the forward with v = k and the backward's dV: attention._lse_grad)."""
    q, k, v = _inputs(0, "float32", 1, 12, 12, 2, 2, 32)

    @jax.jit
    def loss(q, k, v):
        out, lse = mha.flash_attn_func(q, k, v, causal=True, return_lse=True)
        return jnp.sum(out ** 2) + jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0.0))

    def plain(q, k, v):  # the same in jax.numpy: causal softmax, its lse (float32 products: a GPU's default is TF32)
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k, precision="highest") * 32 ** -0.5
        s = jnp.where(jnp.tril(jnp.ones((12, 12), bool)), s, -jnp.inf)
        lse = jax.nn.logsumexp(s, axis=-1)
        out = jnp.einsum("bhqk,bkhd->bqhd", jnp.exp(s - lse[..., None]), v, precision="highest")
        return jnp.sum(out ** 2) + jnp.sum(lse)

    for g, r in zip(jax.grad(loss, argnums=(0, 1, 2))(q, k, v), jax.grad(plain, argnums=(0, 1, 2))(q, k, v)):
        assert rel_err(g, f64(r)) <= 1e-5


def test_malformed_traced_cu_seqlens_run_as_their_sanitized_values(device):
    """Under jit cu_seqlens are traced and cannot be checked in Python: the op makes them valid (clipped to [0,
    total], then their running maximum) and the kernels run that, never reading out of bounds: [0, 5, 3, 12]
    (decreasing, past the end) runs as [0, 5, 5, 8] would, and a token past the last boundary outputs 0."""
    q, k, v = (x[0] for x in _inputs(3, "float32", 1, 8, 8, 2, 2, 32))
    run = jax.jit(lambda cu: mha.flash_attn_varlen(q, k, v, cu, cu, causal=True, return_lse=True)[:2])
    out, lse = run(jnp.asarray([0, 5, 3, 12], jnp.int32))
    want_out, want_lse = mha.flash_attn_varlen(q, k, v, np.asarray([0, 5, 5, 8]), np.asarray([0, 5, 5, 8]),
                                               causal=True, return_lse=True)[:2]
    np.testing.assert_array_equal(np.asarray(out), np.asarray(want_out))
    np.testing.assert_array_equal(np.asarray(lse), np.asarray(want_lse))
    out, lse = run(jnp.asarray([0, 3, 6], jnp.int32))  # ends before the packed length: tokens 6, 7 see nothing
    assert np.all(np.asarray(out)[6:] == 0) and np.all(np.isposinf(np.asarray(lse)[:, 6:]))
    assert np.all(np.isfinite(np.asarray(out)))


# --- implementation=: the kernel family ------------------------------------------------------------------

def _impl_attr(text: str) -> list[int]:
    """The implementation attribute of each attention custom call in a lowered program, in order."""
    import re

    return [int(m) for m in re.findall(r"implementation = (-?\d+) : i32", text)]


def test_implementation_reaches_each_kernel_call_and_decode_has_no_backward():
    """The family is an attribute of the compiled calls (an exported program keeps it): the forward's and the
    backward's; "decode" is a forward, so its calls' backward asks for the automatic choice (0)."""
    q, k, v = _inputs(0, "float32", 1, 8, 8, 2, 2, 32)
    grad = lambda impl: jax.grad(lambda q: jax_aiter.flash_attn_func(q, k, v, implementation=impl).sum())
    for impl, want in ((None, [0, 0]), ("sm90", [5, 5]), ("mma", [3, 3]), ("simt", [2, 2]), ("decode", [4, 0]),
                       ("cpu", [1, 1])):
        text = jax.jit(grad(impl)).lower(q).as_text()
        assert sorted(_impl_attr(text)) == sorted(want), (impl, _impl_attr(text))


def test_implementation_cpu_runs_every_call_on_the_cpu_and_gpu_families_are_refused_there():
    q, k, v = jax.device_put(_inputs(1, "float32", 1, 16, 24, 2, 1, 32), jax.devices("cpu")[0])
    auto = jax_aiter.flash_attn_func(q, k, v, causal=True)
    named = jax_aiter.flash_attn_func(q, k, v, causal=True, implementation="cpu")
    assert np.asarray(auto).tobytes() == np.asarray(named).tobytes()
    for family in ("simt", "mma", "decode", "sm90"):
        with pytest.raises(Exception, match=rf"mha_fwd: implementation '{family}' is a GPU kernel family; on the CPU "
                                            r"only 'cpu' runs \(or None: automatic\)"):
            jax.block_until_ready(jax_aiter.flash_attn_func(q, k, v, implementation=family))


def test_the_environment_names_the_default_family(monkeypatch):
    q, k, v = _inputs(2, "float32", 1, 8, 8, 2, 2, 32)
    monkeypatch.setenv("JA_MHA_IMPLEMENTATION", "simt")
    assert _impl_attr(jax.jit(jax_aiter.flash_attn_func).lower(q, k, v).as_text()) == [2]
    f = jax.jit(lambda q, k, v: jax_aiter.flash_attn_func(q, k, v, implementation="cpu"))
    assert _impl_attr(f.lower(q, k, v).as_text()) == [1]  # the argument wins
    monkeypatch.setenv("JA_MHA_IMPLEMENTATION", "fast")
    with pytest.raises(ValueError, match=r"JA_MHA_IMPLEMENTATION.*'fast'.*one of auto, cpu, simt, mma, decode, sm90"):
        jax_aiter.flash_attn_func(q, k, v)


@pytest.mark.gpu
def test_a_gpu_family_that_cannot_take_the_call_says_why():
    """A named family never falls back: the mma.sync kernels refuse float32 and a bias, the decode kernel a
    prefill shape, the Hopper kernels dropout; the CPU family is refused on the GPU."""
    gpu = [d for d in jax.devices() if d.platform != "cpu"]
    if not gpu:
        pytest.skip("no GPU visible to JAX (jax.devices() has only CPU devices)")
    with jax.default_device(gpu[0]):
        q32, k32, v32 = _inputs(3, "float32", 1, 64, 64, 2, 2, 64)
        q, k, v = _inputs(3, "bfloat16", 1, 128, 128, 2, 2, 64)
        cases = [((q32, k32, v32), {"implementation": "mma"},
                  r"implementation 'mma' does not take this call: its kernels run bfloat16 and float16"),
                 ((q, k, v), {"implementation": "mma", "bias": np.zeros((128, 128), np.float32)},
                  r"implementation 'mma' does not take this call: it does not handle"),
                 ((q, k, v), {"implementation": "decode"},
                  r"implementation 'decode' does not take this call: it is not a decode shape \(128 query rows"),
                 ((q, k, v), {"implementation": "sm90", "dropout_p": 0.1, "dropout_key": jax.random.key(0)},
                  r"implementation 'sm90' does not take this call"),
                 ((q, k, v), {"implementation": "cpu"}, r"implementation 'cpu' runs on the CPU platform")]
        for args, kwargs, msg in cases:
            with pytest.raises(Exception, match=msg):
                jax.block_until_ready(jax_aiter.flash_attn_func(*args, **kwargs))
