"""The attention mask's own partitioned ops: the ROWS mask of segment ids and the backward's cols, each split over a
mesh as the query rows are (jax_aiter/ops/_attention_sharding.py: their rules and planners), so a split sequence
gathers only the int32 ids (or the rows' bounds) once, as plain JAX's mask does."""
from __future__ import annotations

from functools import cache, partial

from jax_aiter.ops import (
    _attention_sharding,
    _attn_mask,
    _batching,
    _checks,
    _partition,
)


def _segment_rows_call(left: int, right: int, ids):
    return _attn_mask.window_rows(ids, left, right)


_SEGMENT_ROWS = _partition.partitioned(_segment_rows_call, _attention_sharding.segment_rows_rule,
                                       _attention_sharding.segment_rows_planner(_segment_rows_call), n_static=2)


@cache
def _segment_rows_prim(left: int, right: int):
    return _batching.fold_into_batch(partial(_SEGMENT_ROWS, left, right))


def _cols_call(seq_k: int, rows):
    return _attn_mask.cols_from_rows(rows, seq_k)


_COLS = _partition.partitioned(_cols_call, _attention_sharding.cols_rule,
                               _attention_sharding.cols_planner(_cols_call), n_static=1, check_vma=False)


@cache
def _cols_prim(seq_k: int):
    return _batching.fold_into_batch(partial(_COLS, seq_k))


def cols(rows, seq_k: int):
    """The backward's cols of a ROWS mask (_attn_mask.cols_from_rows), whole along the keys on every shard."""
    return _attn_mask.cols_from_rows(rows, seq_k) if _checks.is_empty(rows) else _cols_prim(seq_k)(rows)


def segment_rows(ids, causal: bool, window: tuple[int, int]):
    """The ROWS mask of segment ids (_attn_mask.segment_rows), split over a mesh as the query rows are."""
    left, right = _attn_mask.effective_window(causal, window)
    if _checks.is_empty(ids):
        return _attn_mask.window_rows(ids, left, right)
    return _segment_rows_prim(left, right)(ids)
