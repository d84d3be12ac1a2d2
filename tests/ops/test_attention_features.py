"""Every attention feature through the public API, forward and backward, against float64.

The doors users call: jax_aiter.flash_attn_func (an array; softcap, segment_ids), jax_aiter.mha.flash_attn_func
(upstream's tuple, lse float32 [batch, heads_q, seq_q], or [heads_q, total_q] packed) and
jax_aiter.mha.flash_attn_varlen (upstream's tuple). Each case differentiates the output and, where the door
returns it, the lse (a loss through both), and the bias where there is one, under jax.jit, and compares with
tests/ops/reference.py's attention_features_ref: float64, with masks written there by loops (window_mask_ref,
varlen_mask_ref, segment_mask_ref) from docs/attention.md's definitions and the dropout draw of dropout_keep_ref
(a plain-Python Philox), independent of jax_aiter/ops/_attn_mask.py and of the kernels.

Error measure and bounds: tests/ops/test_attention.py's (normwise rel_err, ATTENTION_RTOL per dtype); lse
elementwise, and its +inf rows (a row that sees no key) exactly where the reference has them.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_aiter
from jax_aiter import mha
from jax_aiter.ops import _attn_dropout
from tests.ops.reference import (
    ATTENTION_RTOL,
    attention_features_ref,
    dropout_keep_ref,
    rel_err,
    segment_mask_ref,
    sum_to,
    varlen_mask_ref,
    window_diag_ref,
    window_mask_ref,
)


def _host(seed, shapes, dtype, q_mul=1.0):
    rng = np.random.default_rng(seed)
    out = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    out[0] = out[0] * np.float32(q_mul)
    return [x.astype(jnp.dtype(dtype)) for x in out]


def check(fn, dtype, shapes, *, mask, diag, packed=False, bias=None, with_lse=True, seed=0, q_mul=1.0,
          ref_kw=None):
    """fn(q, k, v[, bias]) -> out or (out, lse), in the door's layout; shapes of q, k, v (packed: rank 3).

    mask bool [1 or b, sq, sk] and diag [1 or b, sq] for the reference (packed: batch 1). Differentiates
    sum(out * do) + sum(lse * dlse) (+ the bias) and compares everything with attention_features_ref.
    Returns (out, lse, grads) as NumPy."""
    q, k, v = _host(seed, shapes, dtype, q_mul)
    sq, hq, dv = q.shape[-3], q.shape[-2], v.shape[-1]
    lead = q.shape[:-3]
    rng = np.random.default_rng(seed + 100)
    do = rng.standard_normal((*lead, sq, hq, dv)).astype(np.float32).astype(q.dtype)
    dlse = rng.standard_normal((*lead, hq, sq) if not packed else (hq, sq)).astype(np.float32)
    args = [jnp.asarray(x) for x in (q, k, v)] + ([] if bias is None else [jnp.asarray(bias)])

    if with_lse:
        (o, lse), vjp = jax.vjp(jax.jit(fn), *args)
        grads = vjp((jnp.asarray(do), jnp.asarray(dlse)))
    else:
        (o, vjp), lse = jax.vjp(jax.jit(fn), *args), None
        grads = vjp(jnp.asarray(do))
    batch = (lambda x: np.asarray(x, np.float64)[None]) if packed else (lambda x: np.asarray(x, np.float64))
    ref_bias = None if bias is None else np.asarray(bias, np.float64)
    if ref_bias is not None and packed:
        ref_bias = ref_bias[None, None]
    ro, rlse, (rdq, rdk, rdv, rds) = attention_features_ref(
        batch(q), batch(k), batch(v), batch(do), scale=q.shape[-1] ** -0.5,
        mask=mask, diag=diag, bias=ref_bias, dlse=None if lse is None else (dlse[None] if packed else dlse),
        **(ref_kw or {}))
    if packed:
        ro, rlse, rdq, rdk, rdv = ro[0], rlse[0], rdq[0], rdk[0], rdv[0]
    bound = ATTENTION_RTOL[dtype]
    assert o.shape == ro.shape and o.dtype == q.dtype, (o.shape, o.dtype)
    assert rel_err(o, ro) <= bound, f"out: {rel_err(o, ro)}"
    if lse is not None:
        lse_np = np.asarray(lse)
        assert lse.dtype == jnp.float32 and lse_np.shape == rlse.shape, (lse.dtype, lse_np.shape, rlse.shape)
        assert np.array_equal(np.isposinf(lse_np), np.isinf(rlse)), "lse: the +inf rows differ from the reference"
        fin = np.isfinite(rlse)
        np.testing.assert_allclose(lse_np[fin], rlse[fin], rtol=0, atol=2e-3 if dtype != "float32" else 2e-5)
    for name, g, r in zip(("dq", "dk", "dv"), grads[:3], (rdq, rdk, rdv)):
        assert g.shape == r.shape and g.dtype == q.dtype, (name, g.shape, g.dtype)
        assert rel_err(g, r) <= bound, f"{name}: {rel_err(g, r)}"
    if bias is not None:
        rdb = sum_to(rds[0] if packed else rds, bias.shape)
        assert grads[3].shape == bias.shape, grads[3].shape
        assert rel_err(grads[3], rdb) <= bound, f"dbias: {rel_err(grads[3], rdb)}"
    return np.asarray(o, np.float32), None if lse is None else np.asarray(lse), [np.asarray(g, np.float32)
                                                                                  for g in grads]


def dense(sq, sk, causal=False, window=(-1, -1)):
    return {"mask": window_mask_ref(sq, sk, causal, window)[None], "diag": window_diag_ref(sq, sk)[None]}


def _mha(**kw):
    return lambda q, k, v, *b: mha.flash_attn_func(q, k, v, return_lse=True, **kw, **({"bias": b[0]} if b else {}))


def _top(**kw):
    return lambda q, k, v, *b: jax_aiter.flash_attn_func(q, k, v, **kw, **({"bias": b[0]} if b else {}))


DT = ["float32", "bfloat16"]
B, SQ, SK, HQ, HKV, D = 2, 24, 37, 4, 2, 32
SHAPES = [(B, SQ, HQ, D), (B, SK, HKV, D), (B, SK, HKV, D)]


# --- masks: causal, windows, the edge cases of goal 2 ------------------------------------------------------

WINDOWS = [
    ("plain", False, (-1, -1)), ("causal", True, (-1, -1)),
    ("causal-w8", True, (8, -1)), ("left8-right0", False, (8, 0)),
    ("w0-0", False, (0, 0)),                 # only the diagonal key
    ("noncausal-right-window", False, (5, 3)),  # keys inside the right window count, beyond it do not
    ("right-only", False, (-1, 4)),
    ("causal-replaces-right", True, (3, 7)),  # causal sets right = 0 (FlashAttention 2)
    ("wider-than-sequence", False, (1000, 1000)),
]


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("causal,window", [w[1:] for w in WINDOWS], ids=[w[0] for w in WINDOWS])
def test_windows(device, dtype, causal, window):
    check(_mha(causal=causal, window_size=window), dtype, SHAPES, **dense(SQ, SK, causal, window))


def test_seq_q_longer_than_seq_k_causal_rows_that_see_nothing(device):
    """Causal with seq_q > seq_k, bottom-right aligned: the first seq_q - seq_k rows see no key: output 0 exactly,
    lse +inf (documented: docs/attention.md), zero gradient."""
    sq, sk = 40, 24
    o, lse, (dq, _, _) = check(_mha(causal=True), "float32", [(B, sq, HQ, D), (B, sk, HKV, D), (B, sk, HKV, D)],
                               **dense(sq, sk, True))
    blind = sq - sk
    assert np.all(o[:, :blind] == 0) and np.all(np.isposinf(lse[:, :, :blind])) and np.all(dq[:, :blind] == 0)


def test_window_left_of_every_key_masks_whole_rows(device):
    """A non-causal window (0, 0) with seq_q > seq_k: rows whose diagonal lies before key 0 see nothing."""
    sq, sk = 30, 12
    o, lse, _ = check(_mha(window_size=(0, 0)), "float32", [(B, sq, HQ, D), (B, sk, HKV, D), (B, sk, HKV, D)],
                      **dense(sq, sk, False, (0, 0)))
    assert np.all(o[:, :sq - sk] == 0) and np.all(np.isposinf(lse[:, :, :sq - sk]))


# --- softcap, ALiBi, bias, head dims ---------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DT)
def test_softcap(device, dtype):
    """Top-level door (an array); q scaled up so tanh saturates."""
    check(_top(softcap=5.0, causal=True), dtype, SHAPES, with_lse=False, q_mul=3.0, ref_kw={"softcap": 5.0},
          **dense(SQ, SK, True))


@pytest.mark.parametrize("per_batch", [False, True], ids=["heads", "batch-heads"])
def test_alibi(device, per_batch):
    slopes = np.random.default_rng(5).uniform(0.05, 0.5, (B, HQ) if per_batch else (HQ,)).astype(np.float32)
    check(_mha(causal=True, alibi_slopes=slopes), "float32", SHAPES,
          ref_kw={"alibi": slopes if per_batch else slopes[None]}, **dense(SQ, SK, True))


BIAS_SHAPES = [(SQ, SK), (B, 1, SQ, SK), (1, HQ, SQ, SK), (B, HQ, SQ, SK), (B, 1, 1, SK), (SK,)]


@pytest.mark.parametrize("shape", BIAS_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_bias_and_its_gradient(device, shape):
    """Each accepted shape; the gradient comes back in the bias's shape, summed over its broadcast axes."""
    bias = np.random.default_rng(6).standard_normal(shape).astype(np.float32)
    check(_mha(causal=True), "float32", SHAPES, bias=bias, **dense(SQ, SK, True))


HEAD_DIMS = [(1, 1), (40, 40), (59, 59), (111, 111), (160, 160), (256, 256), (192, 128), (32, 200)]


@pytest.mark.parametrize("d,dv", HEAD_DIMS, ids=lambda x: str(x))
def test_head_dims(device, d, dv):
    """Any head dim 1..256 and head_dim_v of its own; the caller never pads."""
    check(_mha(causal=True), "bfloat16" if d == 256 else "float32",
          [(B, 17, HQ, d), (B, 29, HKV, d), (B, 29, HKV, dv)], **dense(17, 29, True))


# --- dropout ---------------------------------------------------------------------------------------------

def _keep(key, p, b, h, sq, sk):
    return dropout_keep_ref(np.asarray(_attn_dropout.seed_from_key(key)), p, b, h, sq, sk)


@pytest.mark.parametrize("extra", [{}, {"window_size": (6, 0)}], ids=["causal", "window"])
def test_dropout(device, extra):
    """The seed enters as dropout_key (a jax.random key): two words of jax.random.bits(key) are the Philox key;
    the mask the kernels apply equals the plain-Python Philox draw of those words (forward and backward)."""
    key, p = jax.random.key(7), 0.3
    keep = _keep(key, p, B, HQ, SQ, SK)
    check(_mha(causal=True, dropout_p=p, dropout_key=key, **extra), "float32", SHAPES,
          ref_kw={"keep": keep, "dropout_p": p}, **dense(SQ, SK, True, extra.get("window_size", (-1, -1))))


def test_dropout_with_bias(device):
    key, p = jax.random.key(8), 0.2
    bias = np.random.default_rng(9).standard_normal((SQ, SK)).astype(np.float32)
    check(_mha(dropout_p=p, dropout_key=key), "float32", SHAPES, bias=bias,
          ref_kw={"keep": _keep(key, p, B, HQ, SQ, SK), "dropout_p": p}, **dense(SQ, SK))


def test_return_attn_probs_carries_the_dropout_mask(device):
    """mha.flash_attn_func's third element: P where kept, -P where dropped (FlashAttention's encoding), the same
    draw as the kernels'; a different key draws a different mask."""
    q, k, v = (jnp.asarray(x) for x in _host(0, SHAPES, "float32"))
    key, p = jax.random.key(3), 0.4
    out, lse, probs = mha.flash_attn_func(q, k, v, dropout_p=p, causal=True, return_lse=True, return_attn_probs=True,
                                          dropout_key=key)
    keep = _keep(key, p, B, HQ, SQ, SK)
    m = dense(SQ, SK, True)
    ro, _, _ = attention_features_ref(np.asarray(q, np.float64), np.asarray(k, np.float64), np.asarray(v, np.float64),
                                      np.zeros(out.shape), scale=D ** -0.5, keep=keep, dropout_p=p, **m)
    probs = np.asarray(probs)
    vis = np.broadcast_to(m["mask"][:, None], probs.shape)
    assert probs.shape == (B, HQ, SQ, SK) and lse.shape == (B, HQ, SQ)
    assert np.array_equal(np.signbit(probs[vis]), ~keep[vis]), "the sign does not carry the mask"
    assert np.all(probs[~vis] == 0)
    assert rel_err(out, ro) <= ATTENTION_RTOL["float32"]
    other = np.asarray(mha.flash_attn_func(q, k, v, dropout_p=p, causal=True, return_attn_probs=True,
                                           dropout_key=jax.random.key(4))[1])
    assert not np.array_equal(np.signbit(other), np.signbit(probs))


def test_dropout_without_a_key_warns_and_is_reproducible(device):
    q, k, v = (jnp.asarray(x) for x in _host(0, SHAPES, "float32"))
    with pytest.warns(UserWarning, match=r"without dropout_key: jax.random.key\(0\) is used"):
        a = mha.flash_attn_func(q, k, v, dropout_p=0.2)[0]
    b = mha.flash_attn_func(q, k, v, dropout_p=0.2, dropout_key=jax.random.key(0))[0]
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# --- varlen and segment ids ------------------------------------------------------------------------------

# four sequences: 7 queries / 9 keys, 0 / 4 (a zero-length query sequence), 13 / 0 (queries that see no key),
# 11 / 27
CU_Q, CU_K = [0, 7, 7, 20, 31], [0, 9, 13, 13, 40]
VARLEN = [("plain", False, (-1, -1)), ("causal", True, (-1, -1)), ("causal-window", True, (5, -1)),
          ("noncausal-window", False, (4, 2))]


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("causal,window", [c[1:] for c in VARLEN], ids=[c[0] for c in VARLEN])
def test_varlen(device, dtype, causal, window):
    """flash_attn_varlen over packed [total, heads, dim] with a zero-length sequence and one without keys:
    (out, lse [heads_q, total_q]); rows without keys give 0 and lse +inf."""
    mask, diag = varlen_mask_ref(CU_Q, CU_K, causal, window)
    cu_q, cu_k = np.asarray(CU_Q, np.int32), np.asarray(CU_K, np.int32)

    def fn(q, k, v):
        out, lse = mha.flash_attn_varlen(q, k, v, cu_q, cu_k, 13, 27, causal=causal, window_size=window,
                                         return_lse=True)
        return out, lse

    o, lse, _ = check(fn, dtype, [(31, HQ, D), (40, HKV, D), (40, HKV, D)], mask=mask[None], diag=diag[None],
                      packed=True)
    assert lse.shape == (HQ, 31) and np.all(o[7:20] == 0) and np.all(np.isposinf(lse[:, 7:20]))


def test_varlen_through_flash_attn_func(device):
    """mha.flash_attn_func with cu_seqlens_q / cu_seqlens_kv: packed in and out, lse [heads_q, total_q]; softcap
    through flash_attn_varlen's logits_soft_cap with the same packing."""
    mask, diag = varlen_mask_ref(CU_Q, CU_K, True, (6, -1))
    shapes = [(31, HQ, D), (40, HKV, D), (40, HKV, D)]
    check(_mha(causal=True, window_size=(6, -1), cu_seqlens_q=np.asarray(CU_Q), cu_seqlens_kv=np.asarray(CU_K)),
          "float32", shapes, mask=mask[None], diag=diag[None], packed=True)
    check(lambda q, k, v: mha.flash_attn_varlen(q, k, v, np.asarray(CU_Q), np.asarray(CU_K), causal=True,
                                                return_lse=True, logits_soft_cap=4.0)[:2],
          "float32", shapes, mask=varlen_mask_ref(CU_Q, CU_K, True)[0][None],
          diag=varlen_mask_ref(CU_Q, CU_K, True)[1][None], packed=True, q_mul=3.0, ref_kw={"softcap": 4.0})


def test_varlen_bias_alibi_and_dropout(device):
    """Upstream's varlen extras: bias [total_q, max_seqlen_k] in the column layout (and its gradient), ALiBi from
    each sequence's own diagonal, dropout (the packed batch is batch row 0 of the draw)."""
    cu_q, cu_k = np.asarray([0, 5, 12]), np.asarray([0, 8, 20])
    mask, diag = varlen_mask_ref(cu_q, cu_k, True)
    slopes = np.random.default_rng(2).uniform(0.1, 0.4, HQ).astype(np.float32)
    key, p = jax.random.key(11), 0.25
    keep = _keep(key, p, 1, HQ, 12, 20)
    width = 12
    col_bias = np.random.default_rng(3).standard_normal((12, width)).astype(np.float32)
    full = np.zeros((12, 20), np.float32)  # the same bias in [total_q, total_k] layout, for the reference
    for s in range(2):
        for t in range(cu_q[s], cu_q[s + 1]):
            for c in range(cu_k[s + 1] - cu_k[s]):
                full[t, cu_k[s] + c] = col_bias[t, c]

    def fn(q, k, v, b):
        out, lse = mha.flash_attn_varlen(q, k, v, cu_q, cu_k, max_seqlen_k=width, causal=True, dropout_p=p,
                                         return_lse=True, bias=b, alibi_slopes=slopes, dropout_key=key)
        return out, lse

    q, k, v = (jnp.asarray(x) for x in _host(0, [(12, HQ, D), (20, HKV, D), (20, HKV, D)], "float32"))
    out, vjp = jax.vjp(fn, q, k, v, jnp.asarray(col_bias))
    do = np.random.default_rng(4).standard_normal(out[0].shape).astype(np.float32)
    dq, dk, dv, dbias = vjp((jnp.asarray(do), jnp.zeros_like(out[1])))
    ro, rlse, (rdq, rdk, rdv, rds) = attention_features_ref(
        np.asarray(q)[None], np.asarray(k)[None], np.asarray(v)[None], do[None], scale=D ** -0.5, mask=mask[None],
        diag=diag[None], alibi=slopes[None], bias=full[None, None], keep=keep, dropout_p=p)
    bound = ATTENTION_RTOL["float32"]
    for name, g, r in (("out", out[0], ro[0]), ("dq", dq, rdq[0]), ("dk", dk, rdk[0]), ("dv", dv, rdv[0])):
        assert rel_err(g, r) <= bound, f"{name}: {rel_err(g, r)}"
    np.testing.assert_allclose(np.asarray(out[1]), rlse[0], atol=2e-5, rtol=0)
    ref_col = np.zeros_like(col_bias)  # the reference's dbias read back in the column layout
    ds = rds[0].sum(0)
    for s in range(2):
        for t in range(cu_q[s], cu_q[s + 1]):
            ref_col[t, :cu_k[s + 1] - cu_k[s]] = ds[t, cu_k[s]:cu_k[s + 1]]
    assert rel_err(dbias, ref_col) <= bound, f"dbias: {rel_err(dbias, ref_col)}"


SEGMENTS = np.asarray([[0] * 5 + [1] * 9 + [2] * 10, [3] * 24], np.int32)


@pytest.mark.parametrize("causal,window", [(False, (-1, -1)), (True, (-1, -1)), (True, (3, -1)), (False, (2, 2))],
                         ids=["plain", "causal", "causal-window", "window"])
def test_segment_ids(device, causal, window):
    """Top-level segment_ids [batch, seq]: each run of equal ids is a document (the varlen rule per batch row)."""
    mask, diag = segment_mask_ref(SEGMENTS, causal, window)
    check(_top(segment_ids=SEGMENTS, causal=causal, window_size=window), "float32",
          [(B, 24, HQ, D), (B, 24, HKV, D), (B, 24, HKV, D)], with_lse=False, mask=mask, diag=diag)


# --- the combinations users run (goal 2) -----------------------------------------------------------------

def test_window_and_softcap(device):
    check(_top(causal=True, window_size=(6, -1), softcap=8.0), "bfloat16", SHAPES, with_lse=False, q_mul=3.0,
          ref_kw={"softcap": 8.0}, **dense(SQ, SK, True, (6, -1)))


def test_gqa_and_alibi(device):
    slopes = np.random.default_rng(12).uniform(0.05, 0.5, (B, 8)).astype(np.float32)
    check(_mha(causal=True, alibi_slopes=slopes), "bfloat16", [(B, SQ, 8, D), (B, SK, 2, D), (B, SK, 2, D)],
          ref_kw={"alibi": slopes}, **dense(SQ, SK, True))


def test_d256_window_softcap(device):
    """Gemma-like: head dim 256, a sliding window, softcap."""
    shapes = [(1, 40, 2, 256), (1, 40, 1, 256), (1, 40, 1, 256)]
    check(_top(causal=True, window_size=(8, -1), softcap=20.0), "bfloat16", shapes, with_lse=False, q_mul=2.0,
          ref_kw={"softcap": 20.0}, **dense(40, 40, True, (8, -1)))


def test_decode_with_window(device):
    """seq_q = 1 against 50 keys, a window of the last 16 (MQA: 8 query heads on one kv head)."""
    shapes = [(B, 1, 8, 64), (B, 50, 1, 64), (B, 50, 1, 64)]
    check(_mha(causal=True, window_size=(15, -1)), "float32", shapes, **dense(1, 50, True, (15, -1)))


@pytest.mark.parametrize("window", [(-1, -1), (7, -1)], ids=["plain", "window"])
def test_decode_with_varlen(device, window):
    """One new token per sequence against caches of 20, 1, 29 and 0 keys (packed)."""
    cu_q, cu_k = [0, 1, 2, 3, 4], [0, 20, 21, 50, 50]
    mask, diag = varlen_mask_ref(cu_q, cu_k, True, window)
    o, lse, _ = check(lambda q, k, v: mha.flash_attn_varlen(q, k, v, np.asarray(cu_q), np.asarray(cu_k), causal=True,
                                                            window_size=window, return_lse=True)[:2],
                      "float32", [(4, 8, 64), (50, 2, 64), (50, 2, 64)], mask=mask[None], diag=diag[None], packed=True)
    assert np.all(o[3] == 0) and np.all(np.isposinf(lse[:, 3]))  # the sequence with no keys


# --- determinism -----------------------------------------------------------------------------------------

def test_deterministic_gradients_are_bitwise_identical_over_ten_runs(device):
    """deterministic=True (jax_aiter.mha.flash_attn_func's default): the same inputs give the same gradients bit
    for bit, ten runs of the compiled program, with a window, a bias and dropout."""
    q, k, v = (jnp.asarray(x) for x in _host(1, [(B, 96, HQ, 64), (B, 130, HKV, 64), (B, 130, HKV, 64)], "bfloat16"))
    bias = jnp.asarray(np.random.default_rng(2).standard_normal((96, 130)).astype(np.float32))

    @jax.jit
    def grads(q, k, v, b):
        def loss(q, k, v, b):
            out, lse = mha.flash_attn_func(q, k, v, dropout_p=0.1, causal=True, window_size=(40, -1), bias=b,
                                           return_lse=True, dropout_key=jax.random.key(5))
            return jnp.sum(out.astype(jnp.float32) ** 2) + jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0.0))
        return jax.grad(loss, argnums=(0, 1, 2, 3))(q, k, v, b)

    first = [np.asarray(g) for g in grads(q, k, v, bias)]
    for _ in range(9):
        again = grads(q, k, v, bias)
        for a, b in zip(first, again):
            assert np.array_equal(a.view(np.uint8), np.asarray(b).view(np.uint8))
