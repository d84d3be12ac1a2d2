"""The paged KV cache (jax_aiter.ops.append_kv, paged_attention, paged_prefill) against float64 references, and the
combinations a server runs: GQA with FP8 pools, prefill over a history that ends mid-page, decode over a single
page and over 32k tokens, a sliding window with softcap in prefill.

The pools are filled here by NumPy (test_append_kv_* check append_kv against a NumPy scatter, and the attention
tests do not depend on it), the pages of each sequence scattered over the pool in a random order, so a kernel
that read a sequence's keys contiguously, or one page off, fails. Outputs are poisoned (tests/ops/conftest.py).
Bounds: tests/ops/reference.py's TOL, times the output's scale; FP8 pools are compared with the float64
attention of the values they hold (the quantization is append_kv's test, not the attention's).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from jax_aiter.ops import append_kv, paged_attention, paged_prefill
from tests.ops.reference import TOL, f64, paged_attention_ref

FP8 = jnp.dtype(jnp.float8_e4m3fn)


@pytest.fixture
def cpu(device):
    """The paged kernels run on the CPU only: issue 83's CUDA and HIP kernels are not written (docs/serving.md)."""
    if device.platform != "cpu":
        pytest.skip("the paged KV cache has CPU kernels only so far (docs/serving.md, Backends); no GPU kernel to test")
    return device


class Cache:
    """A paged KV cache built in NumPy: seq_lens tokens per sequence, their pages scattered over the pool."""

    def __init__(self, seq_lens, page_size: int, kv_heads: int, head_dim: int, dtype, seed: int = 0,
                 spare_pages: int = 3, scale: float = 1.0, pool_dtype=None):
        rng = np.random.default_rng(seed)
        self.page_size, self.seq_lens = page_size, list(seq_lens)
        pages_per_seq = [-(-n // page_size) for n in seq_lens]
        num_pages = sum(pages_per_seq) + spare_pages
        order = rng.permutation(num_pages).astype(np.int32)
        self.indptr = np.cumsum([0, *pages_per_seq]).astype(np.int32)
        self.indices = order[:self.indptr[-1]]
        self.last = np.array([(n - 1) % page_size + 1 if n else 0 for n in seq_lens], np.int32)
        pool_dtype = jnp.dtype(pool_dtype or dtype)
        shape = (num_pages, page_size, kv_heads, head_dim)
        # every slot, used or not, holds a value: a kernel that reads a slot a sequence does not own gets a wrong sum
        self.k_pool, self.v_pool = ((rng.standard_normal(shape) * scale).astype(pool_dtype) for _ in range(2))

    def slots(self, s: int, first: int, count: int) -> np.ndarray:
        """The pool slots of tokens first .. first + count - 1 of sequence s."""
        j = np.arange(first, first + count)
        return self.indices[self.indptr[s] + j // self.page_size].astype(np.int64) * self.page_size + j % self.page_size

    def table(self):
        return self.indptr, self.indices, self.last


def _check(got, want, dtype, what: str):
    tol = TOL[jnp.dtype(dtype)]
    got = f64(got)
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, rtol=tol["rtol"], atol=tol["atol"] * scale, err_msg=what)


def _queries(tokens: int, heads: int, head_dim: int, dtype, seed: int = 1):
    return np.random.default_rng(seed).standard_normal((tokens, heads, head_dim)).astype(jnp.dtype(dtype))


def _decode(cache: Cache, heads: int, dtype, seed: int = 1, **kw):
    q = _queries(len(cache.seq_lens), heads, cache.k_pool.shape[3], dtype, seed)
    got = paged_attention(q, jnp.asarray(cache.k_pool), jnp.asarray(cache.v_pool), *cache.table(),
                          max_seq_len=max(cache.seq_lens), **kw)
    cu = np.arange(len(cache.seq_lens) + 1)
    return got, q, cu


# --- append_kv ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("slot_dtype", [np.int32, np.int64])
def test_append_kv_writes_each_token_into_its_slot(cpu, dtype, slot_dtype):
    """Tokens land in their slots (scattered pages, the middle of a page, a negative slot skipped); every other slot
    keeps its value; under a jit that donates the pools."""
    cache = Cache([5, 9, 2], page_size=4, kv_heads=2, head_dim=48, dtype=dtype)
    rng = np.random.default_rng(7)
    slots = np.concatenate([cache.slots(0, 3, 2), [-1], cache.slots(1, 6, 3), [-5], cache.slots(2, 0, 2)])
    k_new, v_new = (rng.standard_normal((len(slots), 2, 48)).astype(jnp.dtype(dtype)) for _ in range(2))
    step = jax.jit(append_kv, donate_argnums=(3, 4))
    k_pool, v_pool = step(k_new, v_new, slots.astype(slot_dtype), jnp.asarray(cache.k_pool), jnp.asarray(cache.v_pool))
    want_k, want_v = cache.k_pool.copy(), cache.v_pool.copy()
    for n, slot in enumerate(slots):
        if slot >= 0:
            want_k.reshape(-1, 2, 48)[slot], want_v.reshape(-1, 2, 48)[slot] = k_new[n], v_new[n]
    np.testing.assert_array_equal(np.asarray(k_pool), want_k)
    np.testing.assert_array_equal(np.asarray(v_pool), want_v)


def test_append_kv_quantizes_into_fp8_pools(cpu):
    """Into float8_e4m3fn pools: x / scale rounded to nearest even, saturated at +-448 (also infinity), NaN kept;
    bfloat16 and float32 rows alike; each pool its own scale."""
    cache = Cache([6], page_size=8, kv_heads=1, head_dim=32, dtype=jnp.float32, pool_dtype=FP8)
    x = np.random.default_rng(3).standard_normal((6, 1, 32)).astype(np.float32) * 100
    x[0, 0, :6] = [1e4, -1e4, np.inf, -np.inf, np.nan, 448 * 0.5 * 1.03]
    for dtype in (np.float32, ml_dtypes.bfloat16):
        new = x.astype(dtype)
        k_pool, v_pool = append_kv(new, new, cache.slots(0, 0, 6), jnp.asarray(cache.k_pool),
                                   jnp.asarray(cache.v_pool), k_scale=jnp.array([0.5]), v_scale=jnp.array([2.0]),
                                   kv_cache_dtype="fp8")
        for pool, scale in ((k_pool, 0.5), (v_pool, 2.0)):
            want = np.clip(new.astype(np.float32) / np.float32(scale), -448, 448).astype(FP8)
            got = np.asarray(pool)[cache.indices[0], :6]
            np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8), err_msg=f"{dtype} scale {scale}")


# --- decode ---------------------------------------------------------------------------------------------------

DECODE = [  # (seq_lens, page_size, heads, kv_heads, head_dim)
    ([7], 16, 4, 4, 64),                   # one sequence on a single, partly filled page
    ([1, 16, 17, 40], 16, 8, 2, 128),      # one token; a full page; one past it; GQA 4
    ([33, 5, 64, 1], 1, 8, 1, 64),         # pages of one token; MQA
    ([100, 3], 64, 12, 4, 80),             # head_dim 80 (a padded instance), GQA 3
]


@pytest.mark.parametrize("seq_lens,page_size,heads,kv_heads,head_dim", DECODE)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_decode_matches_float64(cpu, seq_lens, page_size, heads, kv_heads, head_dim, dtype):
    cache = Cache(seq_lens, page_size, kv_heads, head_dim, dtype)
    got, q, cu = _decode(cache, heads, dtype)
    want, _ = paged_attention_ref(q, cache.k_pool, cache.v_pool, cu, *cache.table(), scale=head_dim ** -0.5)
    assert got.dtype == dtype and got.shape == q.shape
    _check(got, want, dtype, "decode")


def test_decode_over_32k_tokens(cpu):
    """One sequence of 32768 tokens beside a short one, bfloat16, GQA 4: the softmax over 512 key tiles."""
    cache = Cache([32768, 70], page_size=64, kv_heads=2, head_dim=128, dtype=jnp.bfloat16, spare_pages=0)
    got, q, cu = _decode(cache, 8, jnp.bfloat16, logits_soft_cap=30.0)
    want, _ = paged_attention_ref(q, cache.k_pool, cache.v_pool, cu, *cache.table(), scale=128 ** -0.5, softcap=30.0)
    _check(got, want, jnp.bfloat16, "32k decode")


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
def test_decode_gqa_over_fp8_pools(cpu, dtype):
    """float8_e4m3fn pools with per-tensor scales, GQA 4: the attention of the values the pools stand for
    (stored * scale)."""
    cache = Cache([37, 1, 90], page_size=16, kv_heads=2, head_dim=64, dtype=dtype, pool_dtype=FP8, scale=4.0)
    ks, vs = 0.25, 3.0
    got, q, cu = _decode(cache, 8, dtype, k_scale=jnp.array([ks], jnp.float32), v_scale=jnp.array([vs], jnp.float32),
                         kv_cache_dtype="fp8_e4m3")
    want, _ = paged_attention_ref(q, cache.k_pool, cache.v_pool, cu, *cache.table(), scale=64 ** -0.5,
                                  descales=(1.0, ks, vs))
    assert got.dtype == dtype
    _check(got, want, dtype, "fp8 decode")


# --- prefill --------------------------------------------------------------------------------------------------

PREFILL = [  # (seq_lens in the pool, new tokens of each (the last of its keys), page_size, causal, window, softcap)
    ([21, 8, 35], [5, 8, 1], 8, True, (-1, -1), 0.0),    # histories end mid-page; one whole prompt; one token
    ([70, 12], [70, 3], 16, True, (16, -1), 20.0),       # a window with softcap over a long prompt
    ([9, 30], [4, 30], 4, False, (3, 2), 0.0),           # not causal: a window on both sides
    ([0, 13], [0, 13], 8, True, (-1, -1), 0.0),          # a sequence with no page and no query
]


@pytest.mark.parametrize("seq_lens,new,page_size,causal,window,softcap", PREFILL)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_prefill_matches_float64(cpu, seq_lens, new, page_size, causal, window, softcap, dtype):
    """New tokens (the last of each sequence's keys) over their history, GQA 2, bottom-right aligned."""
    cache = Cache(seq_lens, page_size, kv_heads=2, head_dim=64, dtype=dtype)
    cu = np.cumsum([0, *new]).astype(np.int32)
    q = _queries(int(cu[-1]), 4, 64, dtype)
    got = paged_prefill(q, jnp.asarray(cache.k_pool), jnp.asarray(cache.v_pool), cu, *cache.table(),
                        max_seqlen_q=max(new), max_seqlen_k=max(seq_lens), causal=causal, window_size=window,
                        logits_soft_cap=softcap)
    want, _ = paged_attention_ref(q, cache.k_pool, cache.v_pool, cu, *cache.table(), scale=0.125, causal=causal,
                                  window=window, softcap=softcap)
    _check(got, want, dtype, "prefill")


def test_prefill_over_fp8_pools_with_padding_rows(cpu):
    """FP8 pools in prefill, and query rows past cu_seqlens_q[-1] (a padded bucket): they belong to no sequence
    and give 0."""
    cache = Cache([19, 6], 8, kv_heads=1, head_dim=32, dtype=jnp.bfloat16, pool_dtype=FP8)
    cu = np.array([0, 4, 6], np.int32)
    q = _queries(9, 2, 32, jnp.bfloat16)
    got = paged_prefill(q, jnp.asarray(cache.k_pool), jnp.asarray(cache.v_pool), cu, *cache.table(), max_seqlen_q=4,
                        max_seqlen_k=19, k_scale=jnp.array([0.5]), v_scale=jnp.array([2.0]))
    want, _ = paged_attention_ref(q, cache.k_pool, cache.v_pool, cu, *cache.table(), scale=32 ** -0.5,
                                  descales=(1.0, 0.5, 2.0))
    _check(got, want, jnp.bfloat16, "fp8 prefill")
    assert np.all(np.asarray(got)[6:] == 0)


# --- a server's step: append, then attend ------------------------------------------------------------------

def test_prefill_then_decode_steps_through_append_kv(cpu):
    """Prompts appended with append_kv and attended by paged_prefill, then decode steps (each token appended, then
    paged_attention), all through one jitted, donating step each; against the float64 attention of every token so
    far, per sequence (the keys and values as append_kv stored them, bfloat16)."""
    page, heads, kv_heads, d = 4, 4, 2, 32
    rng = np.random.default_rng(11)
    prompts = [6, 3]
    num_pages = 8
    pages = [[5, 0, 3], [7, 2]]  # each sequence's pages, in order
    k_pool = jnp.zeros((num_pages, page, kv_heads, d), jnp.bfloat16)
    v_pool = jnp.zeros_like(k_pool)
    keys = [np.zeros((0, kv_heads, d), np.float32) for _ in prompts]
    vals = [np.zeros((0, kv_heads, d), np.float32) for _ in prompts]

    def slot(s, j):
        return pages[s][j // page] * page + j % page

    def table(lens):
        used = [-(-n // page) for n in lens]
        indptr = np.cumsum([0, *used]).astype(np.int32)
        indices = np.array([p for s, n in enumerate(used) for p in pages[s][:n]], np.int32)
        last = np.array([(n - 1) % page + 1 for n in lens], np.int32)
        return indptr, indices, last

    append = jax.jit(append_kv, donate_argnums=(3, 4))
    prefill = jax.jit(paged_prefill, static_argnames=("max_seqlen_q", "max_seqlen_k"))
    decode = jax.jit(paged_attention, static_argnames=("max_seq_len",))
    lens = [0, 0]
    for step, new in enumerate([prompts, [1, 1], [1, 1], [1, 1]]):
        k_new = rng.standard_normal((sum(new), kv_heads, d)).astype(ml_dtypes.bfloat16)
        v_new = rng.standard_normal((sum(new), kv_heads, d)).astype(ml_dtypes.bfloat16)
        q = rng.standard_normal((sum(new), heads, d)).astype(ml_dtypes.bfloat16)
        slots, n0 = [], 0
        for s, count in enumerate(new):
            slots += [slot(s, lens[s] + j) for j in range(count)]
            keys[s] = np.concatenate([keys[s], k_new[n0:n0 + count].astype(np.float32)])
            vals[s] = np.concatenate([vals[s], v_new[n0:n0 + count].astype(np.float32)])
            n0 += count
            lens[s] += count
        k_pool, v_pool = append(k_new, v_new, np.array(slots, np.int32), k_pool, v_pool)
        cu = np.cumsum([0, *new]).astype(np.int32)
        if step == 0:
            got = prefill(q, k_pool, v_pool, cu, *table(lens), max_seqlen_q=8, max_seqlen_k=16)
        else:
            got = decode(q, k_pool, v_pool, *table(lens), max_seq_len=16)
        dense_k = np.zeros((sum(lens), 1, kv_heads, d))  # each sequence a page of its own: the reference's table
        for s in range(len(lens)):
            dense_k[sum(lens[:s]):sum(lens[:s + 1]), 0] = keys[s]
        dense_v = np.zeros_like(dense_k)
        for s in range(len(lens)):
            dense_v[sum(lens[:s]):sum(lens[:s + 1]), 0] = vals[s]
        ref_table = (np.cumsum([0, *lens]).astype(np.int32), np.arange(sum(lens), dtype=np.int32),
                     np.ones(len(lens), np.int32))
        want, _ = paged_attention_ref(q, dense_k, dense_v, cu, *ref_table, scale=d ** -0.5)
        _check(got, want, jnp.bfloat16, f"step {step}")
