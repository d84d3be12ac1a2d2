"""vmap support for row-wise FFI ops that take per-row inputs and shared parameters.

Row-wise kernels treat every leading dimension as rows, so a batch dimension on
the per-row inputs folds into the rows for free. A batched *shared* parameter
(a per-example weight) has no such folding; those cases map over the batch.
"""
from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp


def rowwise(prim: Callable, n_rows: int) -> Callable:
    """Wrap prim(*row_args, *shared_args) with a vmap rule (first n_rows args are per-row)."""

    @jax.custom_batching.custom_vmap
    def op(*args):
        return prim(*args)

    @op.def_vmap
    def _rule(axis_size, in_batched, *args):
        rows, shared = args[:n_rows], args[n_rows:]
        rows_b, shared_b = in_batched[:n_rows], in_batched[n_rows:]
        out_tree_batched = True
        if not any(shared_b):
            rows = [a if b else jnp.broadcast_to(a, (axis_size, *a.shape)) for a, b in zip(rows, rows_b)]
            out = op(*rows, *shared)
        else:
            full = [a if b else jnp.broadcast_to(a, (axis_size, *a.shape)) for a, b in zip(args, in_batched)]
            out = jax.lax.map(lambda xs: op(*xs), tuple(full))
        return out, jax.tree_util.tree_map(lambda _: out_tree_batched, out)

    return op


def fold_into_batch(prim: Callable) -> Callable:
    """Wrap prim(*args) with a vmap rule that folds the mapped axis into axis 0.

    For ops whose every input and output has a leading batch axis the kernel
    loops over (attention: [batch, seq, heads, head_dim] and lse [batch, heads,
    seq]), a vmapped axis of size n becomes batch n * batch: one kernel call,
    no loop. Unbatched inputs are broadcast first.
    """

    @jax.custom_batching.custom_vmap
    def op(*args):
        return prim(*args)

    @op.def_vmap
    def _rule(axis_size, in_batched, *args):
        full = [a if b else jnp.broadcast_to(a, (axis_size, *a.shape)) for a, b in zip(args, in_batched)]
        batch = full[0].shape[1]
        out = op(*(a.reshape(axis_size * batch, *a.shape[2:]) for a in full))
        out = jax.tree_util.tree_map(lambda o: o.reshape(axis_size, batch, *o.shape[1:]), out)
        return out, jax.tree_util.tree_map(lambda _: True, out)

    return op
