"""Upstream jax-aiter's attention API (`jax_aiter.mha`): code written against it runs unchanged.

A facade over jax_aiter.ops.attention: it takes upstream's argument names and order and gives back
upstream's return conventions (a tuple: (out,), then lse with return_lse, then the probabilities with
return_attn_probs), and holds no attention logic; every feature lives once, in jax_aiter/ops
(docs/attention.md, "Upstream API"). Upstream's module paths work too: jax_aiter.mha.mha.flash_attn_func and
jax_aiter.mha.mha_varlen.flash_attn_varlen are the same functions. Both take FP8 inputs as upstream does:
float8_e4m3fn q, k, v with keyword-only q_descale, k_descale, v_descale (docs/serving.md, "FP8 attention").
Beyond upstream, both take a keyword-only `dropout_key` (a jax.random key): without one, dropout uses a fixed
key and says so in a warning; and a keyword-only `implementation` (the kernel family, as jax_aiter.flash_attn_func's).
"""
from __future__ import annotations

from typing import Literal, TypedDict, Unpack, overload

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from jax_aiter.ops import _attn_args, _attn_mask, _attn_probs
from jax_aiter.ops import attention as _attention

__all__ = ["flash_attn_func", "flash_attn_varlen"]


def flash_attn_func(q: ArrayLike, k: ArrayLike, v: ArrayLike, dropout_p: float = 0.0,
                    softmax_scale: float | None = None, causal: bool = False,
                    window_size: tuple[int, int] = (-1, -1), bias: ArrayLike | None = None,
                    alibi_slopes: ArrayLike | None = None, deterministic: bool = True, return_lse: bool = False,
                    return_attn_probs: bool = False, cu_seqlens_q: ArrayLike | None = None,
                    cu_seqlens_kv: ArrayLike | None = None, *, dropout_key: jax.Array | None = None,
                    q_descale: ArrayLike | None = None, k_descale: ArrayLike | None = None,
                    v_descale: ArrayLike | None = None, implementation: str | None = None) -> tuple[jax.Array, ...]:
    """Upstream's flash_attn_func: a tuple (out,), then lse (float32 [batch, heads_q, seq_q]; packed inputs:
    [heads_q, total_q]) if return_lse, then the attention probabilities (float32 [batch, heads_q, seq_q,
    seq_k], dropped elements negated; testing only) if return_attn_probs.

    Arguments as jax_aiter.flash_attn_func's (q [batch, seq_q, heads_q, head_dim], or packed [total_q,
    heads_q, head_dim] with cu_seqlens_q/cu_seqlens_kv); deterministic defaults to True, as upstream's.
    FP8: float8_e4m3fn q, k and v, each with its descale (float32 [1] or [batch, heads_kv]; an element stands
    for element * descale), give a bfloat16 out (forward only)."""
    out, lse, probs = _attention.attend(
        q, k, v, causal=causal, softmax_scale=softmax_scale, dropout_p=dropout_p, window_size=window_size,
        bias=bias, alibi_slopes=alibi_slopes, cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv,
        deterministic=deterministic, dropout_key=dropout_key, return_lse=return_lse,
        return_probs=return_attn_probs, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
        implementation=implementation, op="jax_aiter.mha.flash_attn_func")
    return _returns(out, lse if return_lse else None, probs if return_attn_probs else None)


def _returns(out, lse, probs) -> tuple[jax.Array, ...]:
    """Upstream's tuple: (out,), then lse where asked, then the probabilities where asked."""
    return (out,) + tuple(x for x in (lse, probs) if x is not None)


class _VarlenOptions(TypedDict, total=False):
    """flash_attn_varlen's keyword-only arguments but return_attn_probs: the tail its overloads share."""
    min_seqlen_q: int
    logits_soft_cap: float
    bias: ArrayLike | None
    alibi_slopes: ArrayLike | None
    block_table: None
    out: None
    cu_seqlens_q_padded: None
    cu_seqlens_k_padded: None
    dropout_key: jax.Array | None
    q_descale: ArrayLike | None
    k_descale: ArrayLike | None
    v_descale: ArrayLike | None
    implementation: str | None


# The return's type follows return_lse and return_attn_probs (Literal overloads): (out,) by default, (out, lse)
# with return_lse=True (lse not Optional), a tuple of arrays where a flag is known only at run time (or return_lse
# is given positionally).
@overload
def flash_attn_varlen(q: ArrayLike, k: ArrayLike, v: ArrayLike, cu_seqlens_q: ArrayLike,
                      cu_seqlens_k: ArrayLike | None = ..., max_seqlen_q: int | None = ...,
                      max_seqlen_k: int | None = ...,
                      dropout_p: float = ..., softmax_scale: float | None = ..., causal: bool = ...,
                      window_size: tuple[int, int] = ..., deterministic: bool = ..., return_lse: Literal[False] = ...,
                      *, return_attn_probs: Literal[False] = ...,
                      **options: Unpack[_VarlenOptions]) -> tuple[jax.Array]: ...
@overload
def flash_attn_varlen(q: ArrayLike, k: ArrayLike, v: ArrayLike, cu_seqlens_q: ArrayLike,
                      cu_seqlens_k: ArrayLike | None = ..., max_seqlen_q: int | None = ...,
                      max_seqlen_k: int | None = ...,
                      dropout_p: float = ..., softmax_scale: float | None = ..., causal: bool = ...,
                      window_size: tuple[int, int] = ..., deterministic: bool = ..., *, return_lse: Literal[True],
                      return_attn_probs: Literal[False] = ...,
                      **options: Unpack[_VarlenOptions]) -> tuple[jax.Array, jax.Array]: ...
@overload
def flash_attn_varlen(q: ArrayLike, k: ArrayLike, v: ArrayLike, cu_seqlens_q: ArrayLike,
                      cu_seqlens_k: ArrayLike | None = ..., max_seqlen_q: int | None = ...,
                      max_seqlen_k: int | None = ...,
                      dropout_p: float = ..., softmax_scale: float | None = ..., causal: bool = ...,
                      window_size: tuple[int, int] = ..., deterministic: bool = ..., return_lse: bool = ..., *,
                      return_attn_probs: bool = ..., **options: Unpack[_VarlenOptions]) -> tuple[jax.Array, ...]: ...


def flash_attn_varlen(q: ArrayLike, k: ArrayLike, v: ArrayLike, cu_seqlens_q: ArrayLike,
                      cu_seqlens_k: ArrayLike | None = None, max_seqlen_q: int | None = 0,
                      max_seqlen_k: int | None = 0, dropout_p: float = 0.0, softmax_scale: float | None = None,
                      causal: bool = False, window_size: tuple[int, int] = (-1, -1), deterministic: bool = False,
                      return_lse: bool = False, *, min_seqlen_q: int = 0, logits_soft_cap: float = 0.0,
                      bias: ArrayLike | None = None, alibi_slopes: ArrayLike | None = None,
                      return_attn_probs: bool = False, block_table: None = None, out: None = None,
                      cu_seqlens_q_padded: None = None, cu_seqlens_k_padded: None = None,
                      dropout_key: jax.Array | None = None, q_descale: ArrayLike | None = None,
                      k_descale: ArrayLike | None = None, v_descale: ArrayLike | None = None,
                      implementation: str | None = None) -> tuple[jax.Array, ...]:
    """Upstream's flash_attn_varlen over packed sequences: q [total_q, heads_q, head_dim], k [total_k, heads_kv,
    head_dim], v [total_k, heads_kv, head_dim_v]; sequence s is rows [cu_seqlens_q[s], cu_seqlens_q[s + 1]) of q
    (cu_seqlens_k: of k and v; None: the same as cu_seqlens_q).

    Returns what current upstream returns: (out,) with out [total_q, heads_q, head_dim_v]; (out, lse) with
    return_lse (lse float32 [heads_q, total_q]); the probabilities appended with return_attn_probs (float32
    [heads_q, total_q, max_seqlen_k], column c is key cu_seqlens_k[s] + c of the query's sequence, dropped
    elements negated; testing only). max_seqlen_q/max_seqlen_k: 0 or None means not given; given, every
    sequence must fit (checked when cu_seqlens are concrete).

    Upstream's keyword-only extras: min_seqlen_q (every query sequence has at least this many tokens; checked
    when concrete), logits_soft_cap (softcap), bias ([total_q, max_seqlen_k] in the probabilities' column
    layout, differentiable; it is expanded to [total_q, total_k] float32, so it costs that memory),
    alibi_slopes, return_attn_probs, q_descale/k_descale/v_descale (FP8: float8_e4m3fn q, k, v; [1] or
    [num_sequences, heads_kv]; bfloat16 out); block_table (paged KV: use jax_aiter.ops.paged_prefill), out (JAX
    arrays are immutable) and cu_seqlens_*_padded (padded THD layouts) are accepted as None only."""
    op = "jax_aiter.mha.flash_attn_varlen"
    for name, value in (("block_table", block_table), ("out", out), ("cu_seqlens_q_padded", cu_seqlens_q_padded),
                        ("cu_seqlens_k_padded", cu_seqlens_k_padded)):
        if value is not None:
            raise ValueError(f"{op}: {name} is not supported (give None): {_UNSUPPORTED[name]}")
    cu_k = cu_seqlens_q if cu_seqlens_k is None else cu_seqlens_k
    max_q, max_k = (0 if m is None else m for m in (max_seqlen_q, max_seqlen_k))
    _check_min_seqlen(op, cu_seqlens_q, min_seqlen_q)
    dense_bias = None if bias is None else _varlen_bias(op, bias, q, k, cu_seqlens_q, cu_k, max_k)
    result, lse, probs = _attention.attend(
        q, k, v, causal=causal, softmax_scale=softmax_scale, dropout_p=dropout_p, window_size=window_size,
        bias=dense_bias, alibi_slopes=alibi_slopes, softcap=logits_soft_cap, cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_kv=cu_k, max_seqlen_q=max_q, max_seqlen_k=max_k, deterministic=deterministic,
        dropout_key=dropout_key, return_lse=return_lse, return_probs=return_attn_probs, q_descale=q_descale,
        k_descale=k_descale, v_descale=v_descale, implementation=implementation, op=op)
    if probs is not None:
        probs = _attn_probs.varlen_columns(probs if probs.ndim == 3 else probs[0], cu_seqlens_q, cu_k,
                                           _max_len(op, cu_k, max_k))
    return _returns(result, lse, probs)


_UNSUPPORTED = {
    "block_table": "a paged KV cache is read by jax_aiter.ops.paged_prefill (and paged_attention for decode), with "
                   "FlashInfer's page table (docs/serving.md)",
    "out": "JAX arrays are immutable; use the returned output",
    "cu_seqlens_q_padded": "padded layouts are not implemented; pack the sequences (no gaps) and pass cu_seqlens_q",
    "cu_seqlens_k_padded": "padded layouts are not implemented; pack the sequences (no gaps) and pass cu_seqlens_k",
}


def _check_min_seqlen(op: str, cu, min_len) -> None:
    if isinstance(min_len, bool) or not isinstance(min_len, (int, np.integer)) or min_len < 0:
        raise TypeError(f"{op}: min_seqlen_q must be a Python int >= 0, got {min_len!r}")
    if min_len and _attn_args.is_concrete(cu):
        lengths = np.diff(np.asarray(cu).astype(np.int64))
        if lengths.size and lengths.min() < min_len:
            raise ValueError(f"{op}: sequence {int(np.argmin(lengths))} has {int(lengths.min())} query tokens, "
                             f"fewer than min_seqlen_q {min_len}; pass a smaller min_seqlen_q (0: no minimum)")


def _max_len(op: str, cu, given: int) -> int:
    """max_seqlen_k for the column layout: given, else read from concrete boundaries."""
    if given:
        return given
    if not _attn_args.is_concrete(cu):
        raise ValueError(f"{op}: with traced cu_seqlens_k, the column layout of bias and return_attn_probs needs "
                         "max_seqlen_k; pass max_seqlen_k=<longest key sequence>")
    return int(np.diff(np.asarray(cu).astype(np.int64)).max(initial=0))


def _varlen_bias(op: str, bias, q, k, cu_q, cu_k, max_k: int) -> jax.Array:
    """Upstream's varlen bias [total_q, max_seqlen_k] (column c: key cu_k[s] + c) as a [total_q, total_k] one."""
    bias = jnp.asarray(bias)
    total_q, total_k = q.shape[-3], k.shape[-3]
    width = _max_len(op, cu_k, max_k)
    if bias.shape != (total_q, width):
        raise ValueError(f"{op}: bias must have shape [total_q, max_seqlen_k] = ({total_q}, {width}), got "
                         f"{tuple(bias.shape)}")
    idx, valid = _attn_mask.key_columns(cu_q, cu_k, total_q, total_k, width)
    values = jnp.where(valid, bias.astype(jnp.float32), 0.0)
    return jnp.zeros((total_q, total_k), jnp.float32).at[jnp.arange(total_q)[:, None], idx].add(values)
