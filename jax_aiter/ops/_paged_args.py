"""The paged KV cache's argument checks (jax_aiter/ops/paged.py): shapes, dtypes and static values, each error
naming the argument, what it got, what is allowed and the fix.

What is checked where (docs/serving.md, "Bad input"): everything known when the op is traced (shapes, dtypes,
Python values) is checked here, before any kernel; the values of the page table and the slots (which a jitted
server step holds as traced arrays) are checked by the kernels' entry points on every call
(csrc/include/ja/kernels/paged_check.h), which return the same kind of error, naming the argument and the entry.
"""
from __future__ import annotations

import numbers

import jax
import jax.numpy as jnp
import numpy as np

from jax_aiter.ops import _checks

FP8 = jnp.dtype(jnp.float8_e4m3fn)
# kv_cache_dtype: "auto" takes the pools' dtype; the others (vLLM's and upstream's names) say the pools are FP8.
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")
INDEX = jnp.dtype(jnp.int32)


def array(op: str, name: str, x) -> jax.Array:
    return _checks.as_array(op, name, x)


def pools(op: str, k_pool, v_pool, kv_cache_dtype: str) -> tuple[jax.Array, jax.Array]:
    """k_pool and v_pool: rank 4 [num_pages, tokens_per_page, kv_heads, head_dim], one shape and one dtype (a
    compute dtype, or float8_e4m3fn), which kv_cache_dtype agrees with."""
    k_pool, v_pool = array(op, "k_pool", k_pool), array(op, "v_pool", v_pool)
    if k_pool.ndim != 4:
        raise ValueError(f"{op}: k_pool must have rank 4 [num_pages, tokens_per_page, kv_heads, head_dim] (NHD), got "
                         f"shape {tuple(k_pool.shape)}")
    if v_pool.shape != k_pool.shape:
        raise ValueError(f"{op}: v_pool has shape {tuple(v_pool.shape)} but k_pool has {tuple(k_pool.shape)}; the "
                         "pools hold the same pages of the same tokens, heads and head_dim: allocate them alike")
    if v_pool.dtype != k_pool.dtype:
        raise TypeError(f"{op}: v_pool has dtype {v_pool.dtype.name} but k_pool has {k_pool.dtype.name}; allocate "
                        "both pools with one dtype")
    if k_pool.dtype != FP8:
        _checks.check_dtype(op, "k_pool", k_pool)
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"{op}: kv_cache_dtype must be one of {', '.join(map(repr, KV_CACHE_DTYPES))}, got "
                         f"{kv_cache_dtype!r}")
    if kv_cache_dtype != "auto" and k_pool.dtype != FP8:
        raise TypeError(f"{op}: kv_cache_dtype={kv_cache_dtype!r} says the pools hold float8_e4m3fn, but they are "
                        f"{k_pool.dtype.name}; allocate them with dtype=jnp.float8_e4m3fn, or pass "
                        "kv_cache_dtype='auto'")
    if k_pool.shape[1] == 0:
        raise ValueError(f"{op}: k_pool's tokens_per_page (dimension 1) is 0; a page holds at least one token")
    return k_pool, v_pool


def scale(op: str, name: str, value, fp8: bool) -> jax.Array | None:
    """A pool's per-tensor scale (float32 [1]; a scalar is taken as [1]). Required with FP8 pools: the stored
    value is x / scale, read back as value * scale. Without FP8 pools it is not used (upstream passes ones)."""
    if not fp8:
        return None
    if value is None:
        raise ValueError(f"{op}: the pools hold float8_e4m3fn, so {name} is required: the pool holds x / {name} and "
                         f"is read back as value * {name} (pass e.g. {name}=jnp.ones((1,), jnp.float32), or the "
                         "per-tensor scale your quantization calibrated)")
    x = array(op, name, value)
    if x.size != 1 or x.ndim > 1:
        raise ValueError(f"{op}: {name} must be one float32 value (shape (1,) or ()), got shape {tuple(x.shape)}; the "
                         "FP8 pools take a per-tensor scale")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"{op}: {name} must be float32, got {x.dtype.name}")
    return x.reshape(1).astype(jnp.float32)


def index(op: str, name: str, x, n: int | None = None) -> jax.Array:
    """An int32 vector (of n entries where given)."""
    x = array(op, name, x)
    if x.dtype != INDEX or x.ndim != 1 or (n is not None and x.shape[0] != n):
        want = f"({n},)" if n is not None else "(n,)"
        raise TypeError(f"{op}: {name} must be int32 of shape {want}, got {x.dtype.name} {tuple(x.shape)}; the page "
                        "table is FlashInfer's int32 metadata (convert with .astype(jnp.int32))")
    return x


def page_table(op: str, num_seqs: int, kv_indptr, kv_page_indices, kv_last_page_lens):
    """kv_indptr [num_seqs + 1], kv_page_indices [total_pages], kv_last_page_lens [num_seqs], int32."""
    return (index(op, "kv_indptr", kv_indptr, num_seqs + 1), index(op, "kv_page_indices", kv_page_indices),
            index(op, "kv_last_page_lens", kv_last_page_lens, num_seqs))


def query(op: str, q, k_pool) -> jax.Array:
    """query [tokens, heads, head_dim]: a compute dtype (the pools' unless they are FP8), heads a multiple of the
    pools' kv heads, the pools' head_dim."""
    q = array(op, "query", q)
    _checks.check_dtype(op, "query", q)
    if q.ndim != 3:
        raise ValueError(f"{op}: query must have rank 3 [tokens, heads, head_dim], got shape {tuple(q.shape)}")
    if k_pool.dtype != FP8 and k_pool.dtype != q.dtype:
        raise TypeError(f"{op}: query has dtype {q.dtype.name} but the pools hold {k_pool.dtype.name}; the pools "
                        "hold query's dtype, or float8_e4m3fn (with k_scale and v_scale)")
    heads, kv_heads = q.shape[1], k_pool.shape[2]
    if q.shape[2] != k_pool.shape[3]:
        raise ValueError(f"{op}: query's head_dim {q.shape[2]} differs from the pools' {k_pool.shape[3]}")
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(f"{op}: query's {heads} heads must be a multiple of the pools' {kv_heads} kv heads "
                         "(grouped-query attention: query head h reads kv head h // (heads // kv_heads))")
    return q


def new_kv(op: str, k_new, v_new, k_pool) -> tuple[jax.Array, jax.Array]:
    """k_new and v_new [num_tokens, kv_heads, head_dim]: the pools' kv heads and head dim, one dtype: the pools'
    (copied), or any compute dtype into FP8 pools (quantized)."""
    k_new, v_new = array(op, "k_new", k_new), array(op, "v_new", v_new)
    want = (None, *k_pool.shape[2:])
    for name, x in (("k_new", k_new), ("v_new", v_new)):
        if x.ndim != 3 or tuple(x.shape[1:]) != want[1:]:
            raise ValueError(f"{op}: {name} must be [num_tokens, kv_heads, head_dim] = [n, {want[1]}, {want[2]}] (the "
                             f"pools' kv heads and head_dim), got shape {tuple(x.shape)}")
    if v_new.shape != k_new.shape:
        raise ValueError(f"{op}: v_new has shape {tuple(v_new.shape)} but k_new has {tuple(k_new.shape)}")
    if v_new.dtype != k_new.dtype:
        raise TypeError(f"{op}: v_new has dtype {v_new.dtype.name} but k_new has {k_new.dtype.name}")
    if k_pool.dtype == FP8:
        if k_new.dtype != FP8:
            _checks.check_dtype(op, "k_new", k_new)
    elif k_new.dtype != k_pool.dtype:
        raise TypeError(f"{op}: k_new has dtype {k_new.dtype.name} but the pools hold {k_pool.dtype.name}; cast it "
                        f"(k_new.astype({k_pool.dtype.name})), or allocate FP8 pools to quantize into")
    return k_new, v_new


def slots(op: str, slot_mapping, num_tokens: int) -> jax.Array:
    """slot_mapping: int32 or int64 [num_tokens]: token n goes to pool slot slot_mapping[n] (page slot //
    tokens_per_page, row slot % tokens_per_page); a negative slot skips the token."""
    x = array(op, "slot_mapping", slot_mapping)
    if x.dtype not in (jnp.dtype(jnp.int32), jnp.dtype(jnp.int64)) or x.shape != (num_tokens,):
        raise TypeError(f"{op}: slot_mapping must be int32 or int64 of shape ({num_tokens},) (one slot per token of "
                        f"k_new), got {x.dtype.name} {tuple(x.shape)}")
    return x


def positive_int(op: str, name: str, value, allow_zero: bool = False) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{op}: {name} must be a Python int, got {type(value).__name__}; it is a compile-time "
                        "constant (bucket it: e.g. the next power of two)")
    value = int(value)
    if value < (0 if allow_zero else 1):
        raise ValueError(f"{op}: {name} must be >= {0 if allow_zero else 1}, got {value}")
    return value


def descale(op: str, name: str, value, batch, kv_heads: int) -> jax.Array:
    """FP8 attention's descale: float32 [1] (the whole tensor) or [batch, kv_heads]; required (the float8 values
    stand for value * descale)."""
    if value is None:
        raise ValueError(f"{op}: float8_e4m3fn inputs need {name}: the value a float8 element stands for is element * "
                         f"{name} (FlashAttention 3's convention); pass {name}=jnp.ones((1,), jnp.float32) for "
                         "unscaled inputs, or [batch, kv_heads] per sequence and kv head")
    x = array(op, name, value)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"{op}: {name} must be float32, got {x.dtype.name}")
    if x.shape in ((), (1,)):
        return x.reshape(1).astype(jnp.float32)
    if x.shape == (batch, kv_heads):
        return x.astype(jnp.float32)
    raise ValueError(f"{op}: {name} has shape {tuple(x.shape)}; a descale is [1] (the whole tensor) or [batch, "
                     f"kv_heads] = ({batch}, {kv_heads})")
