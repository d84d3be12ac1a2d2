"""Serving over a paged KV cache: upstream jax-aiter's append_kv, paged_attention and paged_prefill, and the
attention behind FP8 flash attention (docs/serving.md).

A KV cache is two pools, K and V, NHD: [num_pages, tokens_per_page, kv_heads, head_dim]. `append_kv` writes new
tokens' keys and values into the pools in place (the FFI call aliases both pools to its results, so under a jit
that donates them no pool is ever copied); `paged_attention` (decode: one query token per sequence) and
`paged_prefill` (a ragged batch of new tokens over each sequence's history) read the pools through a
FlashInfer-shaped int32 page table. FP8 pools (float8_e4m3fn, per-tensor k_scale / v_scale) are written
quantized and read dequantized.

Both attention ops are one FFI call, ja_paged_attn (csrc/include/ja/kernels/paged.h): query rows packed by
cu_seqlens_q, keys through the page table, causal bottom-right over each sequence's history, sliding windows,
softcap, GQA, and descales that multiply. FP8 flash attention (jax_aiter.mha.flash_attn_func with float8_e4m3fn
q/k/v, `attend_fp8`) runs the same call: its dense or packed K and V are pools whose page table is the identity.

These ops have no gradient (inference), split over kv heads with no collective (_paged_sharding.py), and map
under vmap as a loop of calls (append_kv refuses vmap: it writes its pools in place).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from jax_aiter import _loader
from jax_aiter.ops import (
    _attn_args,
    _attn_mask,
    _checks,
    _ffi,
    _paged_args,
    _paged_sharding,
    _partition,
)

FP8 = _paged_args.FP8
# The FFI operand indices of append_kv's pools and the results they are written as (upstream's order).
APPEND_KV_ALIASES = {5: 0, 6: 1}


@dataclass(frozen=True)
class AttnConfig:
    """The static arguments of one ja_paged_attn call (hashable; JSON values for an exported sharded program)."""
    scale: float
    softcap: float
    causal: bool
    window_left: int
    window_right: int
    max_seqlen_q: int  # 0: not checked
    max_seqlen_k: int
    lse: bool          # return the log-sum-exp [heads, tokens]
    out_dtype: str     # the output's dtype (the query's; bfloat16 for FP8 attention)


def _attn_call(cfg: AttnConfig, q, k_pool, v_pool, cu_q, indptr, indices, last, qd, kd, vd):
    """The ja_paged_attn call on whatever shapes it gets: the whole arrays, or one shard's heads. Its result: out,
    and lse [heads, tokens] when cfg.lse (the call's (0,) lse result stays inside: a shard's empty array is no
    result of the op)."""
    _loader.ensure_registered("paged_attn")
    outs = (jax.ShapeDtypeStruct((q.shape[0], q.shape[1], v_pool.shape[3]), jnp.dtype(cfg.out_dtype)),
            jax.ShapeDtypeStruct((q.shape[1], q.shape[0]) if cfg.lse else (0,), jnp.float32))
    out, lse = _ffi.ffi_call("ja_paged_attn", outs, q, k_pool, v_pool, cu_q, indptr, indices, last, qd, kd, vd,
                             scale=_ffi.f32(cfg.scale), softcap=_ffi.f32(cfg.softcap), causal=np.bool_(cfg.causal),
                             window_left=np.int64(cfg.window_left), window_right=np.int64(cfg.window_right),
                             max_seqlen_q=np.int64(cfg.max_seqlen_q), max_seqlen_k=np.int64(cfg.max_seqlen_k))
    return (out, lse) if cfg.lse else out


def _append_call(k_new, v_new, slots, k_scale, v_scale, k_pool, v_pool):
    """The ja_append_kv call: the pools (operands 5, 6) written in place as results 0, 1."""
    _loader.ensure_registered("append_kv")
    outs = (jax.ShapeDtypeStruct(k_pool.shape, k_pool.dtype), jax.ShapeDtypeStruct(v_pool.shape, v_pool.dtype))
    return _ffi.ffi_call("ja_append_kv", outs, k_new, v_new, slots, k_scale, v_scale, k_pool, v_pool,
                         aliases=APPEND_KV_ALIASES)


_ATTN = _partition.partitioned(_attn_call, _paged_sharding.rule("attn"), _paged_sharding.attn_planner(_attn_call),
                               n_static=1)
_APPEND = _partition.partitioned(_append_call, _paged_sharding.rule("append"),
                                 _paged_sharding.append_planner(_append_call))


def _no_derivative(f, op: str):
    """f with a derivative rule that refuses clearly: the paged kernels are inference kernels."""
    g = jax.custom_jvp(f)

    @g.defjvp
    def _jvp(primals, tangents):
        raise NotImplementedError(
            f"{op} has no derivative: the paged KV cache's kernels (and FP8 attention's) are inference kernels. "
            "Differentiate jax_aiter.flash_attn_func over gathered keys and values instead (docs/serving.md).")
    return g


@cache
def _attn_prim(cfg: AttnConfig, op: str):
    """The call of one configuration: no derivative, and under vmap a loop of calls (lax.map: each example its own
    pools and page table, as a stack of layers has)."""
    def run(*args):
        if cfg.lse:
            return tuple(_ATTN(cfg, *args))
        return _ATTN(cfg, *args), jnp.zeros((0,), jnp.float32)

    @jax.custom_batching.custom_vmap
    def prim(*args):
        return run(*args)

    @prim.def_vmap
    def _rule(axis_size, in_batched, *args):
        full = [a if b else jnp.broadcast_to(a, (axis_size, *a.shape)) for a, b in zip(args, in_batched)]
        out = jax.lax.map(lambda xs: prim(*xs), tuple(full))
        return out, (True, True)

    return _no_derivative(prim, op)


@cache
def _append_prim():
    @jax.custom_batching.custom_vmap
    def prim(*args):
        return tuple(_APPEND(*args))

    @prim.def_vmap
    def _rule(axis_size, in_batched, *args):
        raise NotImplementedError(
            "append_kv cannot be vmapped: it writes its pools in place, and a mapped pool is one array for every "
            "example. Give each layer its own pools and call append_kv per layer (a Python loop), or fold the "
            "examples into the tokens: one call with every token and its slot (docs/serving.md).")

    return _no_derivative(prim, "append_kv")


def _scale(op: str, scale, head_dim: int) -> float:
    """The softmax scale: a finite float, default 1 / sqrt(head_dim)."""
    return _checks.check_scale(op, scale, 1.0 / math.sqrt(head_dim) if head_dim else 1.0)


def _unit() -> jax.Array:
    """An absent scale or descale: one float32 1 (it multiplies). Not a (0,) placeholder: a zero-size operand made
    outside the shard_map of Explicit mesh axes crashes XLA's CPU compiler when it reaches the call (JAX 0.11)."""
    return jnp.ones((1,), jnp.float32)


def _pool_scales(op: str, k_pool, k_scale, v_scale):
    """The pools' descales: their k_scale / v_scale for FP8 pools (required), 1 otherwise."""
    fp8 = k_pool.dtype == FP8
    ks, vs = (_paged_args.scale(op, n, s, fp8) for n, s in (("k_scale", k_scale), ("v_scale", v_scale)))
    return (_unit() if ks is None else ks), (_unit() if vs is None else vs)


def _attend(op: str, q, k_pool, v_pool, cu_q, indptr, indices, last, qd, kd, vd, *, scale: float, softcap: float,
            causal: bool, window, max_q: int, max_k: int, lse: bool, out_dtype) -> tuple:
    cfg = AttnConfig(scale, softcap, causal, window[0], window[1], max_q, max_k, lse, jnp.dtype(out_dtype).name)
    if _checks.is_empty(q) or v_pool.shape[3] == 0:  # no kernel call: nothing to compute, or rows of width 0
        out = jnp.zeros((q.shape[0], q.shape[1], v_pool.shape[3]), out_dtype)
        return out, jnp.full((q.shape[1], q.shape[0]) if lse else (0,), jnp.inf, jnp.float32)
    return _attn_prim(cfg, op)(q, k_pool, v_pool, cu_q, indptr, indices, last, qd, kd, vd)


def append_kv(k_new: ArrayLike, v_new: ArrayLike, slot_mapping: ArrayLike, k_pool: jax.Array, v_pool: jax.Array, *,
              k_scale: ArrayLike | None = None, v_scale: ArrayLike | None = None,
              kv_cache_dtype: str = "auto") -> tuple[jax.Array, jax.Array]:
    """Write new keys and values into a paged KV cache, in place: upstream jax-aiter's append_kv.

    Parameters
    ----------
    k_new, v_new : array_like, shape [num_tokens, kv_heads, head_dim]
        The new tokens' keys and values, one dtype: the pools' (copied), or float32, bfloat16 or float16
        into float8_e4m3fn pools (quantized).
    slot_mapping : array_like, int32 or int64 [num_tokens]
        Token n goes to slot slot_mapping[n]: page slot // tokens_per_page, row slot % tokens_per_page.
        A negative slot skips the token (padding). A slot at or past num_pages * tokens_per_page is an
        error naming it. Two tokens given one slot: the later one stays.
    k_pool, v_pool : jax.Array, shape [num_pages, tokens_per_page, kv_heads, head_dim]
        The pools (NHD), one shape and dtype (float32, bfloat16, float16 or float8_e4m3fn).
    k_scale, v_scale : array_like, float32 [1], optional
        Required with float8_e4m3fn pools: a value x is stored as x / k_scale, rounded to nearest even
        and saturated at +-448, and read back as stored * k_scale (the scale multiplies on read). Not
        used with other pools.
    kv_cache_dtype : str
        "auto" (the pools' dtype), "fp8" or "fp8_e4m3" (the pools must be float8_e4m3fn).

    Returns
    -------
    (k_pool, v_pool) after the write. The FFI call aliases both pools to its results: under a jit that
    donates the pools (donate_argnums) they are written in place and no pool-sized copy exists; without
    donation XLA copies each pool once per call to keep the caller's arrays (correct, but it costs the
    copy). Use the returned pools: the arguments are consumed (donated) or stale.
    """
    op = "append_kv"
    k_pool, v_pool = _paged_args.pools(op, k_pool, v_pool, kv_cache_dtype)
    k_new, v_new = _paged_args.new_kv(op, k_new, v_new, k_pool)
    slots = _paged_args.slots(op, slot_mapping, k_new.shape[0])
    fp8_write = k_pool.dtype == FP8 and k_new.dtype != FP8
    ks, vs = (_paged_args.scale(op, n, s, fp8_write) for n, s in (("k_scale", k_scale), ("v_scale", v_scale)))
    if _checks.is_empty(k_new) or _checks.is_empty(k_pool):
        return k_pool, v_pool
    return _append_prim()(k_new, v_new, slots, _unit() if ks is None else ks, _unit() if vs is None else vs, k_pool,
                          v_pool)


def paged_attention(query: ArrayLike, k_pool: jax.Array, v_pool: jax.Array, kv_indptr: ArrayLike,
                    kv_page_indices: ArrayLike, kv_last_page_lens: ArrayLike, *, max_seq_len: int,
                    scale: float | None = None, logits_soft_cap: float = 0.0, kv_cache_dtype: str = "auto",
                    k_scale: ArrayLike | None = None, v_scale: ArrayLike | None = None,
                    workspace: ArrayLike | None = None) -> jax.Array:
    """Decode attention over a paged KV cache, one query token per sequence: upstream jax-aiter's paged_attention.

    Parameters
    ----------
    query : array_like, shape [num_seqs, heads, head_dim]
        Each sequence's new token (already appended to the pools: it sees itself). float32, bfloat16 or
        float16; heads a multiple of the pools' kv heads (GQA).
    k_pool, v_pool : jax.Array, shape [num_pages, tokens_per_page, kv_heads, head_dim]
        The pools, in query's dtype or float8_e4m3fn (then k_scale and v_scale are required).
    kv_indptr : int32 [num_seqs + 1]
        Sequence i's pages are kv_page_indices[kv_indptr[i]:kv_indptr[i + 1]]; starts at 0, never decreases.
    kv_page_indices : int32 [total_pages]
        Page ids, each in [0, num_pages), in token order.
    kv_last_page_lens : int32 [num_seqs]
        Tokens in each sequence's last page, 1 .. tokens_per_page (0 for a sequence without pages).
    max_seq_len : int
        The longest context the call may see (bucket it: it is a compile-time constant); a sequence
        holding more keys is an error.
    scale : float, optional
        Softmax scale, default 1 / sqrt(head_dim).
    logits_soft_cap : float
        > 0: scores pass through logits_soft_cap * tanh(s / logits_soft_cap).
    kv_cache_dtype, k_scale, v_scale : as append_kv's (the scales multiply the stored values).
    workspace : ignored
        Upstream's preallocated scratch; the kernels here take none (accepted so upstream's calls run).

    Returns
    -------
    jax.Array [num_seqs, heads, head_dim], query's dtype. A sequence without keys outputs 0.
    """
    op = "paged_attention"
    k_pool, v_pool = _paged_args.pools(op, k_pool, v_pool, kv_cache_dtype)
    q = _paged_args.query(op, query, k_pool)
    n = q.shape[0]
    meta = _paged_args.page_table(op, n, kv_indptr, kv_page_indices, kv_last_page_lens)
    max_k = _paged_args.positive_int(op, "max_seq_len", max_seq_len)
    ks, vs = _pool_scales(op, k_pool, k_scale, v_scale)
    cu_q = jnp.arange(n + 1, dtype=jnp.int32)
    out, _ = _attend(op, q, k_pool, v_pool, cu_q, *meta, _unit(), ks, vs,
                     scale=_scale(op, scale, q.shape[2]), softcap=_attn_args.softcap(op, logits_soft_cap),
                     causal=True, window=(-1, -1), max_q=1, max_k=max_k, lse=False, out_dtype=q.dtype)
    return out


def paged_prefill(query: ArrayLike, k_pool: jax.Array, v_pool: jax.Array, cu_seqlens_q: ArrayLike,
                  kv_indptr: ArrayLike, kv_page_indices: ArrayLike, kv_last_page_lens: ArrayLike, *,
                  max_seqlen_q: int, max_seqlen_k: int, scale: float | None = None, causal: bool = True,
                  logits_soft_cap: float = 0.0, window_size: tuple[int, int] = (-1, -1),
                  kv_cache_dtype: str = "auto", k_scale: ArrayLike | None = None,
                  v_scale: ArrayLike | None = None) -> jax.Array:
    """Prefill attention of a ragged batch of new tokens over each sequence's history in a paged KV cache: upstream
    jax-aiter's paged_prefill.

    Parameters
    ----------
    query : array_like, shape [total_q, heads, head_dim]
        Every sequence's new tokens, packed: sequence i owns rows cu_seqlens_q[i] .. cu_seqlens_q[i + 1] - 1.
        Their keys and values are in the pools already (append_kv first), as the last tokens of the sequence.
    cu_seqlens_q : int32 [num_seqs + 1]
        Starts at 0, never decreases; rows past its last entry belong to no sequence and output 0.
    k_pool, v_pool, kv_indptr, kv_page_indices, kv_last_page_lens : as paged_attention's.
    max_seqlen_q, max_seqlen_k : int
        The most query tokens and keys a sequence may have (compile-time constants; exceeding them is an
        error).
    causal : bool
        Bottom-right aligned in each sequence's keys: query token t of a sequence of seq_q new tokens and
        seq_k keys sees keys up to t + seq_k - seq_q (its history and itself).
    window_size : (int, int)
        (left, right), -1 unbounded, measured from that diagonal, as flash_attn_func's.
    logits_soft_cap, scale : as paged_attention's.
    kv_cache_dtype, k_scale, v_scale : FP8 pools, as paged_attention's (beyond upstream's signature).

    Returns
    -------
    jax.Array [total_q, heads, head_dim], query's dtype.
    """
    op = "paged_prefill"
    k_pool, v_pool = _paged_args.pools(op, k_pool, v_pool, kv_cache_dtype)
    q = _paged_args.query(op, query, k_pool)
    n = _paged_args.index(op, "kv_last_page_lens", kv_last_page_lens).shape[0]
    cu_q = _paged_args.index(op, "cu_seqlens_q", cu_seqlens_q, n + 1)
    meta = _paged_args.page_table(op, n, kv_indptr, kv_page_indices, kv_last_page_lens)
    max_q = _paged_args.positive_int(op, "max_seqlen_q", max_seqlen_q)
    max_k = _paged_args.positive_int(op, "max_seqlen_k", max_seqlen_k)
    ks, vs = _pool_scales(op, k_pool, k_scale, v_scale)
    out, _ = _attend(op, q, k_pool, v_pool, cu_q, *meta, _unit(), ks, vs,
                     scale=_scale(op, scale, q.shape[2]), softcap=_attn_args.softcap(op, logits_soft_cap),
                     causal=_attn_args.check_bool(op, "causal", causal), window=_attn_args.window(op, window_size),
                     max_q=max_q, max_k=max_k, lse=False, out_dtype=q.dtype)
    return out


# --- FP8 attention: dense or packed K and V as pools ----------------------------------------------------

def attend_fp8(op: str, q, k, v, *, descales: tuple, causal: bool, window, softcap: float, scale: float,
               cu_seqlens_q, cu_seqlens_kv, return_lse: bool):
    """FP8 flash attention (float8_e4m3fn q, k, v with descales that multiply), bfloat16 out: (out, lse or None).

    q [batch, seq_q, heads_q, d] with k, v [batch, seq_k, heads_kv, d(v)] (batch row b is sequence b: one page of
    seq_k tokens), or packed q [total_q, heads_q, d], k, v [total_k, heads_kv, d(v)] with cu_seqlens (a page per
    key). The boundaries are made valid as varlen attention's (clipped, their running maximum), and each starts
    at 0. descales: (q_descale, k_descale, v_descale), each [1] or [num_sequences, heads_kv] (checked by the
    caller). lse as flash_attn_func's: [batch, heads_q, seq_q], packed [heads_q, total_q]."""
    packed = cu_seqlens_q is not None
    if packed:
        total_q, total_k = q.shape[0], k.shape[0]
        cu_q = _attn_mask.sanitize_cu_seqlens(cu_seqlens_q, total_q).at[0].set(0)
        cu_k = _attn_mask.sanitize_cu_seqlens(cu_seqlens_kv, total_k).at[0].set(0)
        pools = (k[:, None], v[:, None])              # [total_k, 1, heads_kv, d]: one key a page
        indices = jnp.arange(total_k, dtype=jnp.int32)
        last = (cu_k[1:] > cu_k[:-1]).astype(jnp.int32)
        rows, seq_q, seq_k = q, 0, 0
    else:
        b, seq_q, seq_k = q.shape[0], q.shape[1], k.shape[1]
        cu_q = jnp.arange(b + 1, dtype=jnp.int32) * seq_q
        cu_k = jnp.arange(b + 1, dtype=jnp.int32)
        pools = (k, v)                                # [batch, seq_k, heads_kv, d]: a batch row a page
        indices = jnp.arange(b, dtype=jnp.int32)
        last = jnp.full((b,), seq_k, jnp.int32)
        rows = q.reshape(b * seq_q, *q.shape[2:])
    if pools[0].shape[1] == 0:  # no key at all: every row outputs 0
        pools, indices, last = (k.reshape(0, 1, *k.shape[-2:]), v.reshape(0, 1, *v.shape[-2:])), indices[:0], last * 0
        cu_k = cu_k * 0
    out, lse = _attend(op, rows, *pools, cu_q, cu_k, indices, last, *descales, scale=scale, softcap=softcap,
                       causal=causal, window=window, max_q=seq_q, max_k=seq_k, lse=return_lse,
                       out_dtype=jnp.bfloat16)
    if not packed:
        out = out.reshape(q.shape[0], seq_q, *out.shape[1:])
        lse = lse.reshape(lse.shape[0], q.shape[0], seq_q).transpose(1, 0, 2) if return_lse else lse
    return out, (lse if return_lse else None)
