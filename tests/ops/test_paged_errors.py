"""Bad input to the paged KV cache and to FP8 attention: one clear error naming the argument, never an out-of-bounds
access (docs/serving.md, "Bad input").

Shapes, dtypes and Python values are refused when the op is traced (TypeError / ValueError); the values of the page
table and of the slots, which a jitted server step holds as traced arrays, by the kernels' entry points on every
call, eagerly and under jit alike (the handler's InvalidArgument, raised by JAX as an error carrying the text). A
hand-written ffi_call gets the same checks from the handlers.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_aiter import _loader
from jax_aiter.mha import flash_attn_func, flash_attn_varlen
from jax_aiter.ops import append_kv, paged_attention, paged_prefill

P, T, HK, D, HQ = 6, 4, 2, 32, 4


@pytest.fixture
def cpu(device):
    if device.platform != "cpu":
        pytest.skip("the paged KV cache has CPU kernels only so far (docs/serving.md, Backends)")
    return device


def _pools(dtype=jnp.float32):
    rng = np.random.default_rng(0)
    return tuple(jnp.asarray(rng.standard_normal((P, T, HK, D)).astype(np.float32)).astype(dtype) for _ in range(2))


def _table():
    """Two sequences: 6 tokens on pages 2, 0 and 3 tokens on page 5."""
    return np.array([0, 2, 3], np.int32), np.array([2, 0, 5], np.int32), np.array([2, 3], np.int32)


def _q(n=2, dtype=jnp.float32):
    return jnp.ones((n, HQ, D), dtype)


def _decode(table=None, pools=None, jit=False, **kw):
    k, v = pools or _pools()
    indptr, indices, last = table or _table()
    fn = lambda *a: paged_attention(*a, max_seq_len=kw.pop("max_seq_len", 8), **kw)
    fn = jax.jit(fn) if jit else fn
    return jax.block_until_ready(fn(_q(len(last)), k, v, indptr, indices, last))


# --- the page table's values: checked by the kernel's entry point, eagerly and under jit ----------------------

TABLE_CASES = [
    ("page index out of range", (np.array([0, 2, 3]), np.array([2, 6, 5]), np.array([2, 3])),
     r"kv_page_indices\[1\] = 6 is not a page of the pools, whose pages are 0 \.\. 5"),
    ("negative page index", (np.array([0, 2, 3]), np.array([2, -1, 5]), np.array([2, 3])),
     r"kv_page_indices\[1\] = -1 is not a page"),
    ("last page length 0", (np.array([0, 2, 3]), np.array([2, 0, 5]), np.array([0, 3])),
     r"kv_last_page_lens\[0\] = 0 is outside 1 \.\. 4"),
    ("last page length over the page size", (np.array([0, 2, 3]), np.array([2, 0, 5]), np.array([2, 5])),
     r"kv_last_page_lens\[1\] = 5 is outside 1 \.\. 4"),
    ("kv_indptr decreases", (np.array([0, 2, 1]), np.array([2, 0, 5]), np.array([2, 3])),
     r"kv_indptr decreases: kv_indptr\[2\] = 1 < kv_indptr\[1\] = 2"),
    ("kv_indptr does not start at 0", (np.array([1, 2, 3]), np.array([2, 0, 5]), np.array([2, 3])),
     r"kv_indptr\[0\] is 1, not 0"),
    ("kv_indptr past the page list", (np.array([0, 2, 4]), np.array([2, 0, 5]), np.array([2, 3])),
     r"kv_indptr\[2\] = 4 is past the end of kv_page_indices \(3 entries\)"),
    ("a sequence without pages has a last length", (np.array([0, 3, 3]), np.array([2, 0, 5]), np.array([2, 1])),
     r"kv_last_page_lens\[1\] = 1, but sequence 1 has no page"),
]


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("what,table,message", TABLE_CASES, ids=[c[0] for c in TABLE_CASES])
def test_a_bad_page_table_is_refused_naming_the_argument(cpu, what, table, message, jit):
    table = tuple(np.asarray(x, np.int32) for x in table)
    with pytest.raises(Exception, match=message) as info:
        _decode(table, jit=jit)
    assert "INVALID_ARGUMENT" in str(info.value)


def test_a_context_longer_than_max_seq_len_is_refused(cpu):
    with pytest.raises(Exception, match=r"sequence 0 holds 6 keys, more than max_seqlen_k 5 \(paged_attention's "
                                        r"max_seq_len\): raise it"):
        _decode(max_seq_len=5)
    with pytest.raises(Exception, match=r"sequence 0 has 3 query tokens, more than max_seqlen_q 2"):
        k, v = _pools()
        paged_prefill(_q(4), k, v, np.array([0, 3, 4], np.int32), *_table(), max_seqlen_q=2, max_seqlen_k=8)


def test_bad_cu_seqlens_q_is_refused(cpu):
    k, v = _pools()
    for cu, message in ((np.array([0, 3, 1]), r"cu_seqlens_q decreases: cu_seqlens_q\[2\] = 1 < cu_seqlens_q\[1\]"),
                        (np.array([0, 3, 5]), r"cu_seqlens_q\[2\] = 5 is past query's 4 rows"),
                        (np.array([2, 3, 4]), r"cu_seqlens_q\[0\] is 2, not 0")):
        with pytest.raises(Exception, match=message):
            jax.block_until_ready(jax.jit(lambda c: paged_prefill(_q(4), k, v, c, *_table(), max_seqlen_q=4,
                                                                  max_seqlen_k=8))(cu.astype(np.int32)))


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_a_slot_beyond_the_pool_is_refused(cpu, jit):
    k, v = _pools()
    new = jnp.ones((2, HK, D), jnp.float32)
    fn = jax.jit(append_kv) if jit else append_kv
    with pytest.raises(Exception, match=r"slot_mapping\[1\] = 24 is beyond the pools' 24 slots \(6 pages x 4 tokens"):
        jax.block_until_ready(fn(new, new, np.array([3, 24], np.int64), k, v))


# --- shapes, dtypes and Python values: refused when traced ------------------------------------------------------

def test_pools_that_differ_are_refused(cpu):
    k, v = _pools()
    with pytest.raises(ValueError, match=r"paged_attention: v_pool has shape \(6, 4, 2, 16\) but k_pool has"):
        paged_attention(_q(), k, v[..., :16], *_table(), max_seq_len=8)
    with pytest.raises(TypeError, match=r"append_kv: v_pool has dtype bfloat16 but k_pool has float32"):
        append_kv(jnp.ones((1, HK, D)), jnp.ones((1, HK, D)), np.array([0], np.int32), k, v.astype(jnp.bfloat16))
    with pytest.raises(ValueError, match=r"k_pool must have rank 4 \[num_pages, tokens_per_page, kv_heads"):
        paged_prefill(_q(), k[0], v[0], np.array([0, 1, 2], np.int32), *_table(), max_seqlen_q=1, max_seqlen_k=8)


@pytest.mark.parametrize("call,message", [
    (lambda k, v: paged_attention(_q(), k, v, *_table(), max_seq_len=8),
     r"the pools hold float8_e4m3fn, so k_scale is required"),
    (lambda k, v: paged_attention(_q(), k, v, *_table(), max_seq_len=8, k_scale=jnp.ones(1)),
     r"so v_scale is required"),
    (lambda k, v: append_kv(jnp.ones((1, HK, D)), jnp.ones((1, HK, D)), np.array([0], np.int32), k, v),
     r"append_kv: the pools hold float8_e4m3fn, so k_scale is required"),
    (lambda k, v: paged_attention(_q(), k, v, *_table(), max_seq_len=8, k_scale=jnp.ones(2), v_scale=jnp.ones(1)),
     r"k_scale must be one float32 value \(shape \(1,\) or \(\)\), got shape \(2,\)"),
])
def test_fp8_pools_without_their_scales_are_refused(cpu, call, message):
    k, v = _pools(jnp.float8_e4m3fn)
    with pytest.raises(ValueError, match=message):
        call(k, v)


def test_wrong_dtypes_and_kv_cache_dtype_are_refused(cpu):
    k, v = _pools()
    with pytest.raises(TypeError,
                       match=r"kv_cache_dtype='fp8' says the pools hold float8_e4m3fn, but they are float32"):
        paged_attention(_q(), k, v, *_table(), max_seq_len=8, kv_cache_dtype="fp8")
    with pytest.raises(TypeError, match=r"query has dtype bfloat16 but the pools hold float32"):
        paged_attention(_q(dtype=jnp.bfloat16), k, v, *_table(), max_seq_len=8)
    with pytest.raises(TypeError, match=r"kv_indptr must be int32 of shape \(3,\), got float32"):
        indptr, indices, last = _table()
        paged_attention(_q(), k, v, indptr.astype(np.float32), indices, last, max_seq_len=8)
    with pytest.raises(TypeError, match=r"slot_mapping must be int32 or int64 of shape \(1,\)"):
        append_kv(jnp.ones((1, HK, D)), jnp.ones((1, HK, D)), np.array([0.0], np.float32), k, v)
    with pytest.raises(TypeError, match=r"k_new has dtype bfloat16 but the pools hold float32"):
        append_kv(jnp.ones((1, HK, D), jnp.bfloat16), jnp.ones((1, HK, D), jnp.bfloat16), np.array([0], np.int32), k, v)
    with pytest.raises(ValueError, match=r"query's 3 heads must be a multiple of the pools' 2 kv heads"):
        paged_attention(jnp.ones((2, 3, D)), k, v, *_table(), max_seq_len=8)
    with pytest.raises(TypeError, match=r"max_seq_len must be a Python int"):
        paged_attention(_q(), k, v, *_table(), max_seq_len=8.0)


# --- FP8 attention's inputs ------------------------------------------------------------------------------------

def _fp8(*shape):
    return jnp.ones(shape, jnp.float32).astype(jnp.float8_e4m3fn)


ONE = jnp.ones((1,), jnp.float32)


@pytest.mark.parametrize("kw,error,message", [
    ({"k_descale": ONE, "v_descale": ONE}, ValueError, r"float8_e4m3fn inputs need q_descale"),
    ({"q_descale": ONE, "k_descale": jnp.ones((2, 3)), "v_descale": ONE}, ValueError,
     r"k_descale has shape \(2, 3\); a descale is \[1\] \(the whole tensor\) or \[batch, kv_heads\] = \(2, 2\)"),
    ({"q_descale": ONE, "k_descale": ONE, "v_descale": ONE, "bias": jnp.zeros((3, 5))}, ValueError,
     r"bias is not supported with float8 inputs"),
    ({"q_descale": ONE, "k_descale": ONE, "v_descale": ONE, "dropout_p": 0.1}, ValueError,
     r"dropout_p > 0 is not supported with float8 inputs"),
])
def test_fp8_attention_input_errors(cpu, kw, error, message):
    with pytest.raises(error, match=message):
        flash_attn_func(_fp8(2, 3, 4, 32), _fp8(2, 5, 2, 32), _fp8(2, 5, 2, 32), **kw)


def test_descales_of_other_dtypes_and_mixed_fp8_are_refused(cpu):
    q = jnp.ones((2, 3, 4, 32), jnp.bfloat16)
    with pytest.raises(TypeError, match=r"q_descale is for float8_e4m3fn inputs .* but q is bfloat16"):
        flash_attn_func(q, q, q, q_descale=ONE)
    with pytest.raises(TypeError, match=r"FP8 attention takes float8_e4m3fn q, k and v alike, but k is bfloat16"):
        flash_attn_func(_fp8(2, 3, 4, 32), q, q, q_descale=ONE, k_descale=ONE, v_descale=ONE)
    with pytest.raises(ValueError, match=r"v_descale has shape \(3, 2\).*\[batch, kv_heads\] = \(2, 2\)"):
        flash_attn_varlen(_fp8(6, 4, 32), _fp8(6, 2, 32), _fp8(6, 2, 32), np.array([0, 3, 6], np.int32),
                          q_descale=ONE, k_descale=ONE, v_descale=jnp.ones((3, 2)))


# --- the FFI targets, called by hand ----------------------------------------------------------------------------

def test_an_unaliased_append_kv_call_is_refused(cpu):
    """ja_append_kv writes the pools in place: called without input_output_aliases={5: 0, 6: 1} it would write
    copies; the handler refuses it, saying so."""
    _loader.ensure_registered("append_kv")
    k, v = _pools()
    new = jnp.ones((1, HK, D), jnp.float32)
    call = jax.ffi.ffi_call("ja_append_kv", (jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape,
                                                                                                            v.dtype)))
    with pytest.raises(Exception, match=r"append_kv: the results are not the pools' buffers: ja_append_kv writes "
                                        r"k_pool and v_pool in place and must be called with "
                                        r"input_output_aliases=\{5: 0, 6: 1\}"):
        jax.block_until_ready(call(new, new, np.array([0], np.int32), jnp.ones(1), jnp.ones(1), k, v))


def test_a_hand_written_paged_attn_call_with_bad_shapes_is_refused(cpu):
    _loader.ensure_registered("paged_attn")
    k, v = _pools()
    indptr, indices, last = _table()
    none = jnp.zeros((0,), jnp.float32)
    out = (jax.ShapeDtypeStruct((2, HQ, D), jnp.float32), jax.ShapeDtypeStruct((0,), jnp.float32))
    attrs = {"scale": np.float32(1), "softcap": np.float32(0), "causal": np.bool_(True), "window_left": np.int64(-1),
             "window_right": np.int64(-1), "max_seqlen_q": np.int64(0), "max_seqlen_k": np.int64(0)}
    call = jax.ffi.ffi_call("ja_paged_attn", out)
    with pytest.raises(Exception, match=r"paged attention: cu_seqlens_q must be int32 of shape \(3,\), got \(2,\)"):
        jax.block_until_ready(call(_q(), k, v, np.array([0, 1], np.int32), indptr, indices, last, none, none, none,
                                   **attrs))
    with pytest.raises(Exception, match=r"k_descale has shape \(3,\); a descale is \(1,\) \(one value\) or \(2, 2\)"):
        jax.block_until_ready(call(_q(), k, v, np.array([0, 1, 2], np.int32), indptr, indices, last, none,
                                   jnp.ones(3), none, **attrs))
