"""The CPU attention kernels (mha_fwd / mha_bwd) through their FFI targets, every feature of the C ABI
(csrc/include/ja/kernels/mha.h), against float64 NumPy.

These call ja_mha_fwd / ja_mha_bwd with docs/attention.md's operands (its FFI spec) directly
(tests/ops/mha_ffi_calls.py), below the
public API: masks arrive as rows (lo, hi, diag) and cols from jax_aiter/ops/_attn_mask.py, dropout as a seed.
The reference is tests/ops/reference.py's attention_features_ref with masks and dropout draws written there
with explicit loops (independent of _attn_mask.py and of the kernels). Every call runs on the CPU device with
poisoned outputs (JA_POISON_OUTPUTS=1: every result element must be written).

Error measure and bounds: tests/ops/test_attention.py's (normwise, per dtype).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_aiter.ops import _attn_dropout, _attn_mask
from tests.ops import mha_ffi_calls as ffi
from tests.ops.reference import (
    ATTENTION_RTOL,
    attention_features_ref,
    dropout_keep_ref,
    rel_err,
    varlen_mask_ref,
    window_diag_ref,
    window_mask_ref,
)

NONE, CAUSAL, ROWS = _attn_mask.MASK_NONE, _attn_mask.MASK_CAUSAL, _attn_mask.MASK_ROWS


@pytest.fixture(autouse=True)
def _cpu_and_poison(monkeypatch):
    """Every call on the CPU device (the GPU kernels take these features later), outputs poisoned."""
    monkeypatch.setenv("JA_POISON_OUTPUTS", "1")
    with jax.default_device(jax.devices("cpu")[0]):
        yield


def inputs(seed, dtype, b, sq, sk, hq, hkv, d, dv=None, q_mul=1.0):
    """Unit-normal q, k, v, dout rounded to dtype on the CPU device, and their float64 values."""
    rng = np.random.default_rng(seed)
    dv = d if dv is None else dv
    shapes = [(b, sq, hq, d), (b, sk, hkv, d), (b, sk, hkv, dv), (b, sq, hq, dv)]
    host = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    host[0] = host[0] * np.float32(q_mul)
    host = [h.astype(jnp.dtype(dtype)) for h in host]
    cpu = jax.devices("cpu")[0]
    return [jax.device_put(h, cpu) for h in host], [h.astype(np.float64) for h in host]


def window(sq, sk, left=-1, right=-1):
    """(kernel rows [1, 3, sq] from _attn_mask, reference mask [1, sq, sk] and diag [1, sq] from loops)."""
    return (_attn_mask.dense_rows_np(sq, sk, left, right), window_mask_ref(sq, sk, False, (left, right))[None],
            window_diag_ref(sq, sk)[None])


def varlen(cu_q, cu_k, causal=False, win=(-1, -1)):
    """The same for packed sequences (one batch row)."""
    rows = np.asarray(_attn_mask.varlen_rows(jnp.asarray(cu_q), jnp.asarray(cu_k), cu_q[-1], cu_k[-1], causal, win))
    mask, diag = varlen_mask_ref(cu_q, cu_k, causal, win)
    return rows, mask[None], diag[None]


def check(dtype, b, sq, sk, hq, hkv, d, dv=None, *, mask=NONE, rows=None, ref_mask=None, ref_diag=None,
          alibi=None, bias=None, softcap=0.0, scale=None, seed=0, dropout=None, q_mul=1.0, dbias=False):
    """Forward and backward of one case against the reference; returns the kernel's (o, lse, grads).

    mask NONE / CAUSAL: the reference mask is the dense one; ROWS: `rows` for the kernel (cols derived by
    _attn_mask.cols_from_rows) and ref_mask / ref_diag for the reference. dropout: (p, seed of 4 uint32)."""
    (q, k, v, do), (qe, ke, ve, doe) = inputs(seed, dtype, b, sq, sk, hq, hkv, d, dv, q_mul)
    scale = d ** -0.5 if scale is None else scale
    if mask != ROWS:
        ref_mask, ref_diag = window_mask_ref(sq, sk, mask == CAUSAL)[None], window_diag_ref(sq, sk)[None]
    kw = {"mask": mask, "rows": rows, "alibi": alibi, "bias": bias, "scale": scale, "softcap": softcap}
    keep, drop_kw = None, {}
    if dropout is not None:
        keep = dropout_keep_ref(dropout[1], dropout[0], b, hq, sq, sk)
        drop_kw = {"seed": np.asarray(dropout[1], np.uint32), "dropout_p": dropout[0]}
    o, lse = jax.jit(lambda q, k, v: ffi.fwd(q, k, v, **kw, **drop_kw))(q, k, v)
    cols = None if rows is None else _attn_mask.cols_from_rows(jnp.asarray(rows), sk)
    got = jax.jit(lambda *a: ffi.bwd(*a, **kw, cols=cols, **drop_kw, dbias=dbias))(q, k, v, o, do, lse)
    ro, rlse, rg = attention_features_ref(qe, ke, ve, doe, scale=scale, mask=ref_mask, diag=ref_diag,
                                          softcap=softcap, alibi=alibi, bias=bias, keep=keep,
                                          dropout_p=dropout[0] if dropout else 0.0)
    bound = ATTENTION_RTOL[dtype]
    assert o.shape == ro.shape and o.dtype == q.dtype
    assert rel_err(o, ro) <= bound, f"o: {rel_err(o, ro)}"
    lse = np.asarray(lse)
    assert np.array_equal(np.isinf(lse), np.isinf(rlse)) and np.all(lse[np.isinf(lse)] > 0), "lse: +inf rows differ"
    fin = np.isfinite(rlse)
    np.testing.assert_allclose(lse[fin], rlse[fin], rtol=0, atol=2e-3 if dtype != "float32" else 2e-5)
    for name, x, r in zip(("dq", "dk", "dv"), got[:3], rg[:3]):
        assert x.dtype == q.dtype and x.shape == r.shape
        assert rel_err(x, r) <= bound, f"{name}: {rel_err(x, r)}"
    if dbias:
        assert rel_err(got[3], rg[3]) <= bound, f"dbias: {rel_err(got[3], rg[3])}"
    return np.asarray(o, np.float32), lse, [np.asarray(g, np.float32) for g in got[:3]]


# --- one feature at a time -------------------------------------------------------------------------------

DT = ["float32", "bfloat16"]


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("mask", [NONE, CAUSAL], ids=["none", "causal"])
def test_dense_and_causal(dtype, mask):
    check(dtype, 2, 70, 150, 4, 2, 64, mask=mask)


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("win", [(16, 0), (-1, 0), (20, 7), (0, 0), (3, -1), (1000, 1000)],
                         ids=lambda w: f"w{w[0]}_{w[1]}")
def test_rows_window(dtype, win):
    """Sliding windows as ROWS, causal (right 0) and not; (0, 0) sees only the diagonal; 1000 exceeds the
    sequence; (3, -1) is unbounded on the right; (20, 7): keys inside the right window count, not beyond."""
    rows, m, dg = window(150, 200, *win)
    check(dtype, 2, 150, 200, 4, 2, 64, mask=ROWS, rows=rows, ref_mask=m, ref_diag=dg)


def test_rows_per_batch():
    """rows [batch, 3, sq] (a different window per batch row), cols [batch, 2, sk]."""
    (r0, m0, d0), (r1, m1, d1) = window(90, 90, 10, 0), window(90, 90, -1, 5)
    check("float32", 2, 90, 90, 2, 1, 32, mask=ROWS, rows=np.concatenate([r0, r1]), ref_mask=np.concatenate([m0, m1]),
          ref_diag=np.concatenate([d0, d1]))


@pytest.mark.parametrize("dtype", DT)
def test_softcap(dtype):
    check(dtype, 1, 80, 130, 4, 4, 64, softcap=5.0, q_mul=3.0)


@pytest.mark.parametrize("alibi_batch", [1, 2])
def test_alibi(alibi_batch):
    slopes = np.random.default_rng(1).uniform(0.01, 0.5, (alibi_batch, 4)).astype(np.float32)
    check("float32", 2, 70, 100, 4, 2, 64, mask=CAUSAL, alibi=slopes)


@pytest.mark.parametrize("bias_shape", [(1, 1), (2, 1), (1, 4), (2, 4)], ids=lambda s: f"b{s[0]}h{s[1]}")
def test_bias_and_its_gradient(bias_shape):
    """Bias broadcast over batch and/or heads (strides 0); dbias is dS [b, hq, sq, sk] against float64."""
    bias = np.random.default_rng(2).standard_normal((*bias_shape, 70, 90)).astype(np.float32)
    check("float32", 2, 70, 90, 4, 2, 64, mask=CAUSAL, bias=bias, dbias=True)


def test_bias_minus_inf_rows_are_empty():
    """A bias of -inf hides keys as a mask does; a row whose visible scores are all -inf outputs 0, lse +inf."""
    bias = np.zeros((1, 1, 40, 70), np.float32)
    bias[..., ::3, :] = -np.inf
    bias[..., 1::3, 10:] = -np.inf
    o, lse, (dq, _, _) = check("float32", 1, 40, 70, 2, 2, 32, bias=bias)
    assert np.all(o[:, ::3] == 0) and np.all(lse[:, :, ::3] == np.inf) and np.all(dq[:, ::3] == 0)


HEAD_DIMS = [(1, 1), (40, 40), (59, 59), (111, 111), (160, 160), (192, 128), (32, 200), (256, 256)]


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("d,dv", HEAD_DIMS, ids=lambda x: str(x))
def test_head_dims(dtype, d, dv):
    """Any head dim 1..256, head_dim_v != head_dim: zero-padded on load inside the kernel."""
    check(dtype, 1, 67, 131, 4, 2, d, dv, mask=CAUSAL, seed=d)


# --- combinations users run -----------------------------------------------------------------------------

def test_varlen_causal_window_with_empty_sequences():
    """Packed sequences as one batch row, causal + window: one with no queries, one with no keys (its query
    row 170 sees nothing: output 0, lse +inf, zero dq)."""
    cu_q, cu_k = [0, 50, 50, 170, 171, 230], [0, 60, 75, 200, 200, 290]
    rows, m, dg = varlen(cu_q, cu_k, True, (32, -1))
    o, lse, (dq, _, _) = check("bfloat16", 1, 230, 290, 4, 2, 64, mask=ROWS, rows=rows, ref_mask=m, ref_diag=dg)
    assert np.all(lse[0, :, 170] == np.inf) and np.all(o[0, 170] == 0) and np.all(dq[0, 170] == 0)


def test_varlen_non_causal():
    rows, m, dg = varlen([0, 33, 100, 101], [0, 40, 41, 140])
    check("float32", 1, 101, 140, 2, 1, 64, mask=ROWS, rows=rows, ref_mask=m, ref_diag=dg)


def test_window_and_softcap():
    rows, m, dg = window(130, 130, 40, 0)
    check("bfloat16", 2, 130, 130, 4, 2, 64, mask=ROWS, rows=rows, ref_mask=m, ref_diag=dg, softcap=20.0, q_mul=4.0)


def test_gqa_and_alibi():
    slopes = (2.0 ** -np.arange(1, 9, dtype=np.float32))[None]
    rows, m, dg = window(100, 150, 50, 0)
    check("float32", 1, 100, 150, 8, 2, 64, mask=ROWS, rows=rows, ref_mask=m, ref_diag=dg, alibi=slopes)
    check("float32", 2, 100, 150, 8, 1, 64, mask=CAUSAL, alibi=np.tile(slopes, (2, 1)) * [[1.0], [0.5]])


def test_head_dim_256_window_softcap():
    rows, m, dg = window(140, 140, 48, 0)
    check("bfloat16", 1, 140, 140, 4, 2, 256, mask=ROWS, rows=rows, ref_mask=m, ref_diag=dg, softcap=30.0, q_mul=3.0)


def test_decode_one_query_with_a_window():
    rows, m, dg = window(1, 700, 256, 0)
    check("bfloat16", 2, 1, 700, 8, 2, 128, mask=ROWS, rows=rows, ref_mask=m, ref_diag=dg)


def test_decode_one_query_per_packed_sequence():
    rows, m, dg = varlen([0, 1, 2, 3], [0, 300, 301, 700], True, (100, -1))
    check("bfloat16", 1, 3, 700, 8, 2, 128, mask=ROWS, rows=rows, ref_mask=m, ref_diag=dg)


def test_causal_seq_q_longer_than_seq_k():
    o, lse, (dq, _, _) = check("float32", 1, 90, 20, 2, 2, 64, mask=CAUSAL)
    assert np.all(lse[:, :, :70] == np.inf) and np.all(o[:, :70] == 0) and np.all(dq[:, :70] == 0)


def test_all_masked_rows_have_zero_output_lse_inf_zero_grads():
    """Rows 10..29 see no key (lo = hi, as a window past a sequence's end gives them)."""
    rows, _, dg = window(70, 80, 5, 0)
    rows[0, 0, 10:30] = rows[0, 1, 10:30] = 20
    j = np.arange(80)
    m = (rows[0, 0][:, None] <= j) & (j < rows[0, 1][:, None])
    o, lse, (dq, _, _) = check("float32", 1, 70, 80, 2, 1, 64, mask=ROWS, rows=rows, ref_mask=m[None], ref_diag=dg)
    assert np.all(lse[:, :, 10:30] == np.inf) and np.all(o[:, 10:30] == 0) and np.all(dq[:, 10:30] == 0)


# --- dropout --------------------------------------------------------------------------------------------

def test_dropout_mask_is_the_philox_draw():
    """With v = identity (seq_k = head_dim_v), o = Pd: its zeros are exactly the dropped elements of the
    reference Philox draw (and of jax_aiter's own jax.numpy draw), its values P / (1 - p) where kept."""
    b, sq, sk, hq, p = 2, 40, 64, 3, 0.3
    rng = np.random.default_rng(5)
    q = jnp.asarray(rng.standard_normal((b, sq, hq, 32)).astype(np.float32))
    k = jnp.asarray(rng.standard_normal((b, sk, hq, 32)).astype(np.float32))
    v = jnp.asarray(np.broadcast_to(np.eye(sk, dtype=np.float32)[None, :, None], (b, sk, hq, sk)).copy())
    seed = np.asarray((7, 11, 3, 5), np.uint32)  # batch and head offsets 3 and 5: a shard of a larger call
    o, _ = ffi.fwd(q, k, v, seed=seed, dropout_p=p, scale=0.2)
    got = np.asarray(o).transpose(0, 2, 1, 3) != 0  # [b, hq, sq, sk]
    keep = dropout_keep_ref(seed, p, b, hq, sq, sk)
    assert np.array_equal(got, keep) and 0.25 < 1 - keep.mean() < 0.35
    assert np.array_equal(np.asarray(_attn_dropout.keep_mask(jnp.asarray(seed), p, b, hq, sq, sk)), got)
    mask = np.ones((1, sq, sk), bool)
    ro, _, _ = attention_features_ref(q, k, v, np.zeros((b, sq, hq, sk)), scale=0.2, mask=mask, keep=keep,
                                      dropout_p=p)
    assert rel_err(o, ro) <= 1e-5


@pytest.mark.parametrize("mask", [NONE, CAUSAL], ids=["none", "causal"])
def test_dropout_gradients_use_the_forward_mask(mask):
    """The backward recomputes the forward's mask: gradients against float64 with the same Philox draw, delta =
    rowsum(dO * O) included; with a window, a bias and its gradient."""
    check("float32", 2, 70, 90, 4, 2, 64, mask=mask, dropout=(0.2, (0x1234, 0xBEEF, 0, 0)))
    rows, m, dg = window(50, 50, 8, 0)
    check("bfloat16", 1, 50, 50, 2, 2, 64, mask=ROWS, rows=rows, ref_mask=m, ref_diag=dg, dropout=(0.5, (1, 2, 0, 0)),
          bias=np.zeros((1, 1, 50, 50), np.float32), dbias=True)


# --- determinism, NaN/Inf where the mask hides it, accuracy -------------------------------------------------

def test_backward_is_bitwise_deterministic():
    (q, k, v, do), _ = inputs(9, "bfloat16", 2, 150, 150, 8, 2, 64)
    kw = {"mask": CAUSAL, "scale": 0.125}
    o, lse = ffi.fwd(q, k, v, **kw)
    runs = [jax.jit(lambda *a: ffi.bwd(*a, **kw, deterministic=True))(q, k, v, o, do, lse)[:3] for _ in range(5)]
    for other in runs[1:]:
        for x, y in zip(runs[0], other):
            assert np.array_equal(np.asarray(x).view(np.uint16), np.asarray(y).view(np.uint16))


@pytest.mark.parametrize("where", ["k", "v", "q", "do"])
def test_non_finite_values_hidden_by_the_mask_stay_hidden(where):
    """NaN/Inf in K or V at keys a window hides from a row never reach that row's output or dq; NaN/Inf in Q or
    dO at rows a key is hidden from never reach that key's dk/dv (tiles straddle the window's edges)."""
    sq = sk = 200
    rows, m, dg = window(sq, sk, 30, 0)
    (q, k, v, do), (qe, ke, ve, doe) = inputs(3, "float32", 1, sq, sk, 2, 1, 64)
    bad = 100  # key index (k, v) or row index (q, dO)
    named = {"q": q, "k": k, "v": v, "do": do}
    arr = np.asarray(named[where]).copy()
    arr[0, bad, 0, :] = np.nan
    arr[0, bad, -1, 3] = np.inf
    named[where] = jnp.asarray(arr)
    q, k, v, do = named["q"], named["k"], named["v"], named["do"]
    kw = {"mask": ROWS, "rows": rows, "scale": 0.125}
    o, lse = ffi.fwd(q, k, v, **kw)
    dq, dk, dv, _ = ffi.bwd(q, k, v, o, do, lse, cols=_attn_mask.cols_from_rows(jnp.asarray(rows), sk), **kw)
    ro, _, (rdq, rdk, rdv, _) = attention_features_ref(qe, ke, ve, doe, scale=0.125, mask=m, diag=dg)
    lo, hi = rows[0, 0], rows[0, 1]
    bad_rows = (lo <= bad) & (bad < hi) if where in ("k", "v") else np.arange(sq) == bad
    bad_keys = np.zeros(sk, bool)  # keys a bad row sees (their gradients take its NaN), and the bad key
    for i in np.flatnonzero(bad_rows):
        bad_keys[lo[i]:hi[i]] = True
    bad_keys[bad] |= where in ("k", "v")
    good_rows, good_keys = ~bad_rows, ~bad_keys
    assert good_rows.sum() > 100 and good_keys.sum() > 100
    o, dq, dk, dv = (np.asarray(x) for x in (o, dq, dk, dv))
    if where != "do":  # dO does not enter the forward
        assert np.all(np.isfinite(o[:, good_rows])) and rel_err(o[:, good_rows], ro[:, good_rows]) <= 1e-4
        assert not np.all(np.isfinite(o[:, bad_rows]))  # NaN/Inf reached the rows that see it
    if where == "q":  # a NaN query row's scores are all NaN: its output and lse are NaN, never an empty row's 0
        assert np.isnan(o[0, bad, 0]).all() and np.isnan(np.asarray(lse)[0, 0, bad])
    assert np.all(np.isfinite(dq[:, good_rows])) and rel_err(dq[:, good_rows], rdq[:, good_rows]) <= 1e-4
    for got, want in ((dk, rdk), (dv, rdv)):
        assert np.all(np.isfinite(got[:, good_keys])) and rel_err(got[:, good_keys], want[:, good_keys]) <= 1e-4


def test_bf16_gradients_of_a_peaked_softmax():
    """q x 30 (a nearly one-hot softmax): each gradient within 2x the error of rounding the exact one once to
    bfloat16. delta = rowsum(dP * P) comes from float32 P and dP, not from the rounded output (rowsum(dO * O)
    with a bfloat16 O gave dq 4.6x that error)."""
    (q, k, v, do), (qe, ke, ve, doe) = inputs(0, "bfloat16", 1, 128, 128, 4, 4, 64, q_mul=30.0)
    o, lse = ffi.fwd(q, k, v, scale=0.125)
    dq, dk, dv, _ = ffi.bwd(q, k, v, o, do, lse, scale=0.125)
    _, _, (rdq, rdk, rdv, _) = attention_features_ref(qe, ke, ve, doe, scale=0.125, mask=np.ones((1, 128, 128), bool))
    for got, want in ((dq, rdq), (dk, rdk), (dv, rdv)):
        floor = rel_err(want.astype(jnp.bfloat16), want)  # one rounding of the exact result
        assert rel_err(got, want) <= 2 * floor, (rel_err(got, want), floor)


# --- the FFI's checks -----------------------------------------------------------------------------------

def _fwd_error(**kw):
    (q, k, v, _), _ = inputs(0, "float32", 2, 8, 8, 4, 2, 32)
    return ffi.fwd(q, k, v, **{"scale": 0.1, **kw})


BAD_FWD = [
    ("rows without mask", {"rows": np.zeros((1, 3, 8), np.int32)}, r"rows \(1, 3, 8\) is given but mask is 0"),
    ("mask rows without rows", {"mask": ROWS}, r"mask 2 \(rows\) needs rows int32"),
    ("rows shape", {"mask": ROWS, "rows": np.zeros((3, 3, 8), np.int32)}, r"rows has shape \(3, 3, 8\), expected"),
    ("rows not monotonic", {"mask": ROWS, "rows": np.array([[[0] * 8, [8, 7, 8, 8, 8, 8, 8, 8], [0] * 8]], np.int32)},
     r"rows\[0\] row 1: lo 0, hi 7 .*non-decreasing"),
    ("rows past seq_k", {"mask": ROWS, "rows": np.array([[[0] * 8, [9] * 8, [0] * 8]], np.int32)},
     r"rows\[0\] row 0: lo 0, hi 9; need 0 <= lo <= hi <= seq_k = 8"),
    ("mask 3", {"mask": 3}, r"mask 3 is not 0 \(none\), 1 \(causal\) or 2 \(rows\)"),
    ("alibi shape", {"alibi": np.zeros((2, 2), np.float32)}, r"alibi has shape \(2, 2\), expected \(1 or 2, 4\)"),
    ("bias shape", {"bias": np.zeros((1, 2, 8, 8), np.float32)}, r"bias has shape \(1, 2, 8, 8\), expected"),
    ("dropout without seed", {"dropout_p": 0.1}, r"dropout_p > 0 needs seed uint32 \[4\]"),
    ("seed without dropout", {"seed": np.zeros(4, np.uint32)}, r"seed is given but dropout_p is 0"),
    ("seed shape", {"seed": np.zeros(3, np.uint32), "dropout_p": 0.1}, r"seed has shape \(3,\), expected \(4,\)"),
    ("dropout 1", {"seed": np.zeros(4, np.uint32), "dropout_p": 1.0}, r"dropout_p 1 must be in \[0, 1\)"),
    ("softcap", {"softcap": -1.0}, r"softcap -1 must be 0 \(off\) or a finite value > 0"),
]


@pytest.mark.parametrize("kw,msg", [b[1:] for b in BAD_FWD], ids=[b[0] for b in BAD_FWD])
def test_forward_checks_name_the_operand(kw, msg):
    with pytest.raises(Exception, match="INVALID_ARGUMENT: mha_fwd: " + msg):
        jax.block_until_ready(_fwd_error(**kw))


def test_backward_checks_name_the_operand():
    (q, k, v, do), _ = inputs(0, "float32", 1, 8, 8, 2, 2, 32)
    rows = _attn_mask.dense_rows_np(8, 8, 2, 0)
    o, lse = ffi.fwd(q, k, v, mask=ROWS, rows=rows, scale=0.1)
    cases = [
        ({"mask": ROWS, "rows": rows}, r"mask 2 \(rows\) needs cols int32"),
        ({"mask": ROWS, "rows": rows, "cols": np.zeros((1, 2, 8), np.int32)},
         r"cols\[0\] key 0: .* disagree with rows"),
        ({"dbias": True}, r"dbias \(1, 2, 8, 8\) is asked for without a bias"),
    ]
    for kw, msg in cases:
        with pytest.raises(Exception, match="INVALID_ARGUMENT: mha_bwd: " + msg):
            jax.block_until_ready(ffi.bwd(q, k, v, o, do, lse, scale=0.1, **kw))


def test_head_dim_over_256_is_refused():
    (q, k, v, _), _ = inputs(0, "float32", 1, 4, 4, 1, 1, 257)
    with pytest.raises(Exception, match=r"mha_fwd: head_dim 257 \(q, k\) and head_dim_v 257 \(v\) must each be in"):
        jax.block_until_ready(ffi.fwd(q, k, v, scale=0.1))


# --- long sequences (nightly: 9 GB and minutes) ------------------------------------------------------------

@pytest.mark.slow
def test_one_query_against_35m_keys():
    """One query, one kv head of 35.6M keys at head_dim 64 (seq_k x head_dim > 2^31 elements): K = 0 (a uniform
    softmax), V = 0 for the first half of the keys and 1 for the second, so o = 0.5. Each key's P V summed
    straight into O stopped at 2^24 and gave 0.47 (issue 58 saw 0.40)."""
    sk, d = 35_600_000, 64
    half = (jnp.arange(sk) >= sk // 2).astype(jnp.bfloat16)
    q = jnp.zeros((1, 1, 1, d), jnp.bfloat16)
    k = jnp.zeros((1, sk, 1, d), jnp.bfloat16)
    v = half[None, :, None, None] * jnp.ones((1, 1, 1, d), jnp.bfloat16)
    o, lse = jax.jit(lambda q, k, v: ffi.fwd(q, k, v, scale=0.125))(q, k, v)
    want = (sk - sk // 2) / sk
    assert np.allclose(np.asarray(o, np.float32), want, rtol=4e-3), (np.asarray(o, np.float32).ravel()[:4], want)
    assert np.isclose(float(np.asarray(lse).ravel()[0]), np.log(sk), rtol=1e-6)


@pytest.mark.slow
def test_one_key_against_35m_queries():
    """The backward's dV of one key seen by 35.6M query rows is the sum of their dO (P = 1): 35.6M. Summed
    straight into one float32 accumulator it would stop at 2^24 (16.8M)."""
    sq = 35_600_000
    q = jnp.zeros((1, sq, 1, 1), jnp.float32)
    k = jnp.zeros((1, 1, 1, 1), jnp.float32)
    v = jnp.ones((1, 1, 1, 1), jnp.float32)
    do = jnp.ones((1, sq, 1, 1), jnp.float32)
    o, lse = ffi.fwd(q, k, v, scale=1.0)
    dq, dk, dv, _ = jax.jit(lambda *a: ffi.bwd(*a, scale=1.0))(q, k, v, o, do, lse)
    assert float(np.asarray(dv).ravel()[0]) == float(sq)
    assert float(np.asarray(dk).ravel()[0]) == 0.0 and not np.asarray(dq).any()
