"""The attention probabilities in jax.numpy, for `return_attn_probs` (testing only, as upstream says).

The kernels never write the seq_q x seq_k matrix; a caller who asks for it gets it recomputed here
from the same definitions (csrc/include/ja/kernels/mha.h): the score's terms in float32, the mask
from the same rows, the softmax, and the dropout draw of _attn_dropout.py, which equals the
kernels' bit for bit. As FlashAttention returns it, an element that dropout dropped is negated
(-P; -0.0 where P is 0); kept ones are P, before the 1 / (1 - dropout_p) rescaling. A row that
sees no key is all zeros. They carry no gradient. It costs O(batch x heads x seq_q x seq_k) memory: use it on small
problems.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_aiter.ops import _attn_dropout, _attn_mask, _batching


def _probs(dropout_p: float, mask: int, scale: float, softcap: float, q, k, rows, alibi, bias, seed):
    batch, seq_q, heads_q, _ = q.shape
    seq_k, heads_kv = k.shape[1], k.shape[2]
    if mask != _attn_mask.MASK_ROWS:
        diag = jnp.arange(seq_q, dtype=jnp.int32) + (seq_k - seq_q)
        j = jnp.arange(seq_k, dtype=jnp.int32)
        vis = (j[None, :] <= diag[:, None]) if mask == _attn_mask.MASK_CAUSAL else jnp.ones((seq_q, seq_k), bool)
        vis, diag = vis[None], diag[None]
    else:
        vis, diag = _attn_mask.visible(rows, seq_k), rows[:, 2]
    kf = jnp.repeat(k, heads_q // heads_kv, axis=2)
    s = jnp.einsum("bqhd,bkhd->bhqk", q, kf, preferred_element_type=jnp.float32,  # float32 inputs: not TF32
                   precision=jax.lax.Precision.HIGHEST) * jnp.float32(scale)
    if softcap:
        s = softcap * jnp.tanh(s / softcap)
    if alibi.size:
        dist = jnp.abs(diag[:, None, :, None] - jnp.arange(seq_k, dtype=jnp.int32)).astype(jnp.float32)
        s = s - alibi[:, :, None, None] * dist
    if bias.size:
        s = s + bias
    vis = vis[:, None]
    s = jnp.where(vis, s, -jnp.inf)
    m = jnp.max(s, axis=-1, keepdims=True)
    e = jnp.where(vis, jnp.exp(s - jnp.where(jnp.isfinite(m), m, 0.0)), 0.0)
    den = jnp.sum(e, axis=-1, keepdims=True)
    p = jnp.where(den > 0, e / jnp.where(den > 0, den, 1.0), 0.0)
    if dropout_p > 0:
        keep = _attn_dropout.keep_mask(seed, dropout_p, batch, heads_q, seq_q, seq_k)
        p = jnp.where(keep, p, -p)
    return p


def probabilities(q, k, *, mask: int, rows, scale: float, softcap: float, alibi, bias, seed,
                  dropout_p: float) -> jax.Array:
    """float32 [batch, heads_q, seq_q, seq_k]: P, or with dropout the FlashAttention encoding (-P where dropped).

    rows: int32 [rows_batch, 3, seq_q] for the ROWS mask, else None; alibi float32 [1 or batch, heads_q] or
    None; bias float32 [1 or batch, 1 or heads_q, seq_q, seq_k] or None; seed uint32 [4] (dropout) or None."""
    present = (rows is not None, alibi is not None, bias is not None, seed is not None)
    # testing only, with no gradient (as upstream's): the call under vmap's custom rule is not differentiable
    args = [jax.lax.stop_gradient(a) for a in (q, k, rows, alibi, bias, seed) if a is not None]
    # the kernels' fold (attention.py), so that under vmap the draw sees the kernels' batch indices
    kinds = (_batching.BATCH, _batching.BATCH) + tuple(
        kind for kind, p in zip((_batching.ROWS, _batching.ROWS, _batching.ROWS, _batching.SHARED), present) if p)
    empty = jnp.zeros((0,), jnp.float32)

    def call(*xs):
        it = iter(xs)
        qq, kk = next(it), next(it)
        r, a, b, s = (next(it) if p else None for p in present)
        return _probs(dropout_p, mask, scale, softcap, qq, kk, r, empty if a is None else a,
                      empty if b is None else b, s)

    return _batching.fold_into_batch(call, kinds)(*args)


def varlen_columns(probs: jax.Array, cu_q, cu_k, max_seqlen_k: int) -> jax.Array:
    """Packed probabilities [heads_q, total_q, total_k] in upstream's varlen layout [heads_q, total_q,
    max_seqlen_k]: column c of query t is key cu_k[s] + c of t's sequence s (0 past the sequence's end)."""
    _, total_q, total_k = probs.shape
    if total_k == 0:
        return jnp.zeros((probs.shape[0], total_q, max_seqlen_k), probs.dtype)
    idx, valid = _attn_mask.key_columns(cu_q, cu_k, total_q, total_k, max_seqlen_k)
    picked = jnp.take_along_axis(probs, jnp.broadcast_to(idx, (probs.shape[0], *idx.shape)), axis=-1)
    return jnp.where(valid[None], picked, 0.0)
