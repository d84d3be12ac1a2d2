"""The shapes of attention's q, k and v: their layout (batched, or packed with cu_seqlens), how they must agree, and
the cu_seqlens pair of a packed call. Shared by the compute-dtype path (attention.attend) and FP8 attention
(_attn_fp8.py), so that both refuse the same shapes with the same words."""
from __future__ import annotations

from jax_aiter.ops import _attn_args


def varlen(op: str, cu_seqlens_q, cu_seqlens_kv, segment_ids=None) -> bool:
    """Whether the call is packed (cu_seqlens given); one of the two without the other is refused, and so is
    segment_ids beside them."""
    if (cu_seqlens_q is None) != (cu_seqlens_kv is None):
        raise ValueError(f"{op}: give both cu_seqlens_q and cu_seqlens_kv (the same array for self-attention), "
                         f"got only {'cu_seqlens_q' if cu_seqlens_kv is None else 'cu_seqlens_kv'}")
    if cu_seqlens_q is not None and segment_ids is not None:
        raise ValueError(f"{op}: give segment_ids or cu_seqlens_q/cu_seqlens_kv, not both (both say where the "
                         "documents of a packed batch start)")
    return cu_seqlens_q is not None


def layout(op, q, k, v, packed_call: bool):
    """q, k, v as rank-4 arrays, and whether the caller gave them packed ([total, heads, dim], varlen)."""
    arrays = (("q", q, "seq_q", "heads_q"), ("k", k, "seq_k", "heads_kv"), ("v", v, "seq_k", "heads_kv"))
    if packed_call and all(x.ndim == 3 for x in (q, k, v)):
        return q[None], k[None], v[None], True
    for name, x, seq, heads in arrays:
        if x.ndim != 4:
            packed = " or [total_tokens, heads, head_dim] (packed, with cu_seqlens)" if packed_call else ""
            raise ValueError(f"{op}: {name} must have rank 4 [batch, {seq}, {heads}, head_dim]{packed}, "
                             f"got shape {tuple(x.shape)}")
    if packed_call and q.shape[0] != 1:
        raise ValueError(f"{op}: with cu_seqlens, q, k and v are packed: [total_tokens, heads, head_dim], or "
                         f"[1, total_tokens, heads, head_dim]; got q of shape {tuple(q.shape)} (batch "
                         f"{q.shape[0]}); reshape to one packed row, or use segment_ids for [batch, seq] inputs")
    return q, k, v, False


def check(op, q, k, v) -> None:
    """q, k and v (rank 4) agree: batch, heads (grouped-query: heads_q a multiple of heads_kv) and head dims."""
    batch, _, heads_q, head_dim = q.shape
    kb, _seq_k, heads_kv, head_dim_k = k.shape
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(f"{op}: k and v must agree in [batch, seq_k, heads_kv] (v's head_dim may differ), got "
                         f"k {tuple(k.shape)} and v {tuple(v.shape)}")
    if kb != batch:
        raise ValueError(f"{op}: batch size mismatch: q has {batch}, k and v have {kb}")
    if head_dim_k != head_dim:
        raise ValueError(f"{op}: head_dim mismatch: q has {head_dim}, k has {head_dim_k} (q and k share one "
                         "head_dim; v's may differ)")
    if heads_kv == 0 and heads_q == 0:
        return
    if heads_kv == 0 or heads_q % heads_kv != 0:
        raise ValueError(f"{op}: heads_q ({heads_q}) must be a multiple of heads_kv ({heads_kv}) "
                         "for grouped-query attention")
    _attn_args.head_dims(op, head_dim, v.shape[3])


def cu_seqlens_pair(op: str, cu_seqlens_q, cu_seqlens_kv, seq_q, seq_k, max_q: int, max_k: int):
    """(cu_q, cu_k): a packed call's boundaries, each checked against its tokens and max_seqlen, counting the same
    sequences."""
    cu_q = _attn_args.cu_seqlens(op, "cu_seqlens_q", cu_seqlens_q, seq_q, max_q, "max_seqlen_q", "q")
    cu_k = _attn_args.cu_seqlens(op, "cu_seqlens_kv", cu_seqlens_kv, seq_k, max_k, "max_seqlen_k", "k")
    if cu_q.shape[0] != cu_k.shape[0]:
        raise ValueError(f"{op}: cu_seqlens_q and cu_seqlens_kv must count the same sequences, got "
                         f"{cu_q.shape[0] - 1} and {cu_k.shape[0] - 1}")
    return cu_q, cu_k


def max_seqlens(op: str, max_seqlen_q, max_seqlen_k) -> tuple[int, int]:
    """max_seqlen_q and max_seqlen_k, checked (Python ints)."""
    return _attn_args.max_seqlen(op, "max_seqlen_q", max_seqlen_q), _attn_args.max_seqlen(op, "max_seqlen_k",
                                                                                           max_seqlen_k)
