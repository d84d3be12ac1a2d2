"""Attention masks as the kernels take them: per query row, the keys [lo, hi) it sees and its diagonal.

Causal attention, sliding windows, varlen (packed) batches, segment ids and their combinations all
reach the kernels as the ROWS mask of csrc/include/ja/kernels/mha.h: int32 [rows_batch, 3, seq_q]
holding lo_i, hi_i and diag_i of every query row i (rows_batch 1: one set for every batch row, or
batch: one set each). The backward also takes the transposed view, `cols` int32 [rows_batch, 2,
seq_k]: the query rows [q_lo_j, q_hi_j) that see key j. This module computes both, in jax.numpy
(under jit the sequence boundaries are traced values), and says when a dense mask needs no rows.

Definitions (docs/attention.md, "Masks"):
- window (left, right), -1 unbounded, is measured from the bottom-right diagonal diag_i = i + seq_k -
  seq_q; causal is right = 0. lo_i = clamp(diag_i - left, 0, seq_k) (0 if left < 0), hi_i =
  clamp(diag_i + right + 1, 0, seq_k) (seq_k if right < 0), then hi_i = max(hi_i, lo_i).
- varlen: sequence s holds queries [cu_q[s], cu_q[s+1]) and keys [cu_k[s], cu_k[s+1]); a query token
  t of it has diag = (t - cu_q[s]) + cu_k[s] + len_k - len_q (its sequence's own bottom-right
  diagonal, in global key indices), and lo, hi as above clipped to its sequence's keys.
- segment ids [batch, seq]: a document is a run of equal ids; each run is a sequence of its own, with
  its queries and keys at the same positions (the varlen rule per batch row).
Every construction gives lo and hi non-decreasing in i with lo <= hi, as the kernels' tile skipping
needs, and indices inside [0, seq_k]: whatever values traced boundaries hold, no kernel can read out
of bounds (a malformed traced cu_seqlens is made valid first: sanitize_cu_seqlens).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

# ja::MhaMask (csrc/include/ja/kernels/mha_features.h)
MASK_NONE, MASK_CAUSAL, MASK_ROWS = 0, 1, 2


def effective_window(causal: bool, window: tuple[int, int]) -> tuple[int, int]:
    """(left, right) with causal folded in: causal means right = 0, as FlashAttention 2 sets it (a right
    window given with causal is replaced, not combined)."""
    left, right = window
    return (left, 0) if causal else (left, right)


def _clamp_rows(diag, left: int, right: int, lo_bound, hi_bound):
    """lo, hi of rows with diagonal `diag` whose keys are limited to [lo_bound, hi_bound)."""
    lo = lo_bound if left < 0 else jnp.clip(diag - left, lo_bound, hi_bound)
    hi = hi_bound if right < 0 else jnp.clip(diag + right + 1, lo_bound, hi_bound)
    lo = jnp.broadcast_to(lo, jnp.shape(diag))
    hi = jnp.broadcast_to(hi, jnp.shape(diag))
    return lo, jnp.maximum(hi, lo)


def _stack(lo, hi, diag) -> jax.Array:
    return jnp.stack([lo, hi, diag], axis=-2).astype(jnp.int32)


def dense_rows_np(seq_q: int, seq_k: int, left: int, right: int) -> np.ndarray:
    """int32 [1, 3, seq_q] of a dense batch (NumPy, for concrete lengths: a constant of the program)."""
    diag = np.arange(seq_q, dtype=np.int64) + seq_k - seq_q
    lo = np.zeros(seq_q, np.int64) if left < 0 else np.clip(diag - left, 0, seq_k)
    hi = np.full(seq_q, seq_k, np.int64) if right < 0 else np.clip(diag + right + 1, 0, seq_k)
    return np.stack([lo, np.maximum(hi, lo), diag]).astype(np.int32)[None]


def dense_mask(seq_q, seq_k, causal: bool, window: tuple[int, int]) -> tuple[int, jax.Array | np.ndarray | None]:
    """(mask kind, rows or None) of a dense batch: NONE or CAUSAL where the window leaves every row as
    those masks have it (window (-1, -1), or one wider than the sequences), else ROWS with rows_batch 1.
    Symbolic lengths (jax.export) with a window give traced rows."""
    left, right = effective_window(causal, window)
    if left < 0 and right < 0:
        return MASK_NONE, None
    if left < 0 and right == 0:
        return MASK_CAUSAL, None
    if isinstance(seq_q, int) and isinstance(seq_k, int):
        rows = dense_rows_np(seq_q, seq_k, left, right)
        for kind, r in ((MASK_NONE, -1), (MASK_CAUSAL, 0)):
            if np.array_equal(rows, dense_rows_np(seq_q, seq_k, -1, r)):
                return kind, None
        return MASK_ROWS, rows
    diag = jnp.arange(seq_q, dtype=jnp.int32) + (seq_k - seq_q)
    return MASK_ROWS, _stack(*_clamp_rows(diag, left, right, 0, seq_k), diag)[None]


def sanitize_cu_seqlens(cu: jax.Array, total) -> jax.Array:
    """cu as int32 made valid whatever it holds: clipped to [0, total], then its running maximum (so an entry
    below its predecessor gives an empty sequence). A no-op on valid boundaries; the op checks concrete ones
    and refuses invalid ones (_attn_args.cu_seqlens), so this matters only for traced values."""
    cu = jnp.clip(jnp.asarray(cu).astype(jnp.int32), 0, total)
    return jax.lax.cummax(cu, axis=0)


def varlen_rows(cu_q: jax.Array, cu_k: jax.Array, total_q, total_k, causal: bool,
                window: tuple[int, int]) -> jax.Array:
    """int32 [1, 3, total_q] of a packed batch (cu_q, cu_k: [n + 1] boundaries, sanitized).

    A token past the last boundary belongs to no sequence: it sees no key (lo = hi = cu_k[-1])."""
    left, right = effective_window(causal, window)
    cu_q, cu_k = sanitize_cu_seqlens(cu_q, total_q), sanitize_cu_seqlens(cu_k, total_k)
    n = cu_q.shape[0] - 1
    t = jnp.arange(total_q, dtype=jnp.int32)
    if isinstance(n, int) and n <= 0:  # no sequence at all: no row sees a key
        zero = jnp.zeros_like(t)
        return _stack(zero, zero, t)[None]
    s = sequence_of(cu_q, total_q)
    q0, q1, k0, k1 = (jnp.take(c, s + i, mode="clip") for c, i in ((cu_q, 0), (cu_q, 1), (cu_k, 0), (cu_k, 1)))
    diag = (t - q0) + k0 + (k1 - k0) - (q1 - q0)
    lo, hi = _clamp_rows(diag, left, right, k0, k1)
    outside = t >= cu_q[-1]
    end = cu_k[-1]
    lo, hi = jnp.where(outside, end, lo), jnp.where(outside, end, hi)
    return _stack(lo, hi, diag)[None]


def count_le(a: jax.Array, n) -> jax.Array:
    """int32 [..., n]: for each j < n, how many entries of the last axis of `a` (values in [0, n]) are <= j. A
    scatter-add and a running sum, linear in the sizes and fine with symbolic ones (jax.export), where a binary
    search (jnp.searchsorted) needs constant lengths."""
    if a.ndim > 1:
        return jax.vmap(lambda x: count_le(x, n))(a)
    counts = jnp.zeros((n + 1,), jnp.int32).at[jnp.clip(a, 0, n)].add(1)
    return jnp.cumsum(counts)[:n]


def sequence_of(cu: jax.Array, total) -> jax.Array:
    """int32 [total]: the sequence each packed token belongs to, for sanitized boundaries cu [n + 1] (a token past
    the last boundary gets the last sequence; empty sequences own no token)."""
    n = cu.shape[0] - 1
    return jnp.clip(count_le(cu[1:], total), 0, jnp.maximum(n - 1, 0)).astype(jnp.int32)


def key_columns(cu_q: jax.Array, cu_k: jax.Array, total_q, total_k, width: int):
    """Upstream's varlen column layout: (index int32 [total_q, width], valid bool [total_q, width]); column c of
    packed query t is key cu_k[s] + c of t's sequence s, valid while inside that sequence (the layout of
    jax_aiter.mha.flash_attn_varlen's bias and probabilities)."""
    cu_q, cu_k = sanitize_cu_seqlens(cu_q, total_q), sanitize_cu_seqlens(cu_k, total_k)
    s = sequence_of(cu_q, total_q)
    k0 = jnp.take(cu_k, s, mode="clip")
    k1 = jnp.take(cu_k, s + 1, mode="clip")
    idx = k0[:, None] + jnp.arange(width, dtype=jnp.int32)[None, :]
    inside = jnp.arange(total_q) < cu_q[-1]
    return jnp.clip(idx, 0, jnp.maximum(total_k - 1, 0)), (idx < k1[:, None]) & inside[:, None]


def segment_rows(segment_ids: jax.Array, causal: bool, window: tuple[int, int]) -> jax.Array:
    """int32 [batch, 3, seq] from segment ids [batch, seq]: each run of equal ids is one sequence."""
    return window_rows(jnp.asarray(segment_ids), *effective_window(causal, window))


def window_rows(ids: jax.Array, left: int, right: int) -> jax.Array:
    """segment_rows of an effective window (left, right): the whole sequence's ids (attention.py splits it)."""
    seq = ids.shape[1]
    pos = jnp.arange(seq, dtype=jnp.int32)
    i = jnp.zeros_like(ids, jnp.int32) + pos  # with ids' sharding (Explicit axes refuse mixing it with none)
    if seq == 0:
        return _stack(i, i, i)
    first = (pos == 0) | (ids != jnp.pad(ids[:, :-1], ((0, 0), (1, 0))))
    last = (pos == seq - 1) | (ids != jnp.pad(ids[:, 1:], ((0, 0), (0, 1))))
    start = jax.lax.cummax(jnp.where(first, i, 0), axis=1)
    end = jax.lax.cummin(jnp.where(last, i + 1, seq), axis=1, reverse=True)
    lo, hi = _clamp_rows(i, left, right, start, end)
    return _stack(lo, hi, i)


def cols_from_rows(rows: jax.Array, seq_k) -> jax.Array:
    """int32 [rows_batch, 2, seq_k]: for key j, q_lo_j = the first row i with hi_i > j and q_hi_j = the first
    row i with lo_i > j; the rows that see key j lie in [q_lo_j, q_hi_j) (lo and hi are non-decreasing)."""
    return jnp.stack([count_le(rows[:, 1], seq_k), count_le(rows[:, 0], seq_k)], axis=1).astype(jnp.int32)


def visible(rows: jax.Array, seq_k: int) -> jax.Array:
    """bool [rows_batch, seq_q, seq_k]: the dense mask the rows describe (for return_attn_probs and tests)."""
    j = jnp.arange(seq_k, dtype=jnp.int32)
    return (rows[:, 0, :, None] <= j) & (j < rows[:, 1, :, None])
