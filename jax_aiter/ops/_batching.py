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


# Operand kinds of fold_into_batch:
BATCH = "b"   # leading axis is the batch the kernel loops over (q, k, v, o, lse, ...)
ROWS = "r"    # leading axis is 1 (one value for every batch row) or the batch (attention's rows, ALiBi, bias)
SHARED = "s"  # no batch axis (a dropout seed, an absent operand's empty placeholder)


def fold_into_batch(prim: Callable, kinds: tuple[str, ...] | None = None,
                    out_kinds: tuple[str, ...] | None = None) -> Callable:
    """Wrap prim(*args) with a vmap rule that folds the mapped axis into axis 0.

    For ops whose inputs and outputs have a leading batch axis the kernel loops over
    (attention: [batch, seq, heads, head_dim] and lse [batch, heads, seq]), a vmapped axis
    of size n becomes batch n * batch: one kernel call, no loop. `kinds` gives each operand's
    kind (default: all BATCH): a BATCH operand that is not mapped is broadcast first; a ROWS
    operand whose leading axis is 1 stays shared while it is not mapped, and is broadcast to
    the batch and folded when it is (one set of rows per example); a SHARED operand has no
    batch axis, so a mapped one (a dropout key per example) cannot fold: the examples then run
    one after another (lax.map), each call with its own operand. `out_kinds` likewise for the
    results (a SHARED result, an empty placeholder, is broadcast over the mapped axis). A
    mapped axis or batch of size 0 gives zero-filled results without a kernel call.
    """

    @jax.custom_batching.custom_vmap
    def op(*args):
        return prim(*args)

    @op.def_vmap
    def _rule(axis_size, in_batched, *args):
        ks = kinds or (BATCH,) * len(args)
        if any(b and k == SHARED for b, k in zip(in_batched, ks)):
            full = [a if b else jnp.broadcast_to(a, (axis_size, *a.shape)) for a, b in zip(args, in_batched)]
            out = jax.lax.map(lambda xs: op(*xs), tuple(full))
            return out, jax.tree_util.tree_map(lambda _: True, out)
        first = next(i for i, k in enumerate(ks) if k == BATCH)
        batch = args[first].shape[1] if in_batched[first] else args[first].shape[0]
        folded = [_fold(a, b, k, axis_size, batch) for a, b, k in zip(args, in_batched, ks)]
        if axis_size * batch == 0:
            shapes = jax.eval_shape(prim, *folded)
            out = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
        else:
            out = op(*folded)
        leaves, tree = jax.tree_util.tree_flatten(out)
        oks = out_kinds or (BATCH,) * len(leaves)
        leaves = [o.reshape(axis_size, batch, *o.shape[1:]) if k == BATCH
                  else jnp.broadcast_to(o, (axis_size, *o.shape)) for o, k in zip(leaves, oks)]
        out = jax.tree_util.tree_unflatten(tree, leaves)
        return out, jax.tree_util.tree_map(lambda _: True, out)

    return op


def _fold(a, batched: bool, kind: str, n: int, batch):
    """Operand `a` of a call whose mapped axis (size n) folds into its batch (size batch)."""
    if kind == SHARED:
        return a
    if kind == ROWS and not batched and a.shape[0] == 1:
        return a  # one set for every row of the folded batch too
    if not batched:
        a = jnp.broadcast_to(a, (n, *a.shape))
    if kind == ROWS:
        a = jnp.broadcast_to(a, (n, batch, *a.shape[2:]))
    return a.reshape(n * batch, *a.shape[2:])
