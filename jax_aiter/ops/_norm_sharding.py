"""RMSNorm's math in jax.numpy, and how rms_norm / rms_norm_with_add split over a device mesh (the planner of
_partition.py).

`norm` is the one jax.numpy form of the op (float32 inside, one rounding to x's dtype, as the kernel): for
small and zero-size inputs, for a weight whose dtype differs from x's (the kernel takes one dtype), for the
sharded layouts below, and for the backward's saved 1/rms.

Operands: the row operands (x, and the residual), then the weight [hidden]. Results: the normalised rows,
x + residual (with a residual), and with `stats` the float32 1/rms of every row ([..., 1], what the backward
needs: computed once in the forward, as plain JAX's autodiff saves it, instead of a second reduction, and a
second all-reduce, in the backward). Three layouts, chosen from x's and the weight's proposed shardings,
each what plain JAX does with the same norm written in jax.numpy:

- x's hidden axis split: every shard keeps its slice of the hidden axis (the weight split the same way);
  each row's sum of squares is the sum of the shards' partial sums, one all-reduce of a float32 per row.
  No activation is gathered. (The kernel normalises whole rows, so this layout runs `norm`.)
- x's hidden axis whole, the weight's split over axes the rows do not use (FSDP's weight): each shard
  normalises its whole rows and keeps the columns of its weight slice; the result leaves split over the
  hidden axis as the weight was (plain JAX's propagation does the same) and the weight is not gathered.
  (`norm` too: the kernel takes the whole weight.)
- otherwise: the kernel on the shard's rows, with the hidden axis and the weight whole (a weight split over
  axes the rows use is gathered: one vector).
"""
from __future__ import annotations

from collections.abc import Callable
from functools import partial

import jax
import jax.numpy as jnp

from jax_aiter.ops import _partition
from jax_aiter.ops._partition import Operand, Plan, axes_size, axis_names, shard_index


def summed(x, residual):
    """x + residual in float32, rounded to x's dtype (the next layer's residual, rounded as the kernel does)."""
    return (x.astype(jnp.float32) + residual.astype(jnp.float32)).astype(x.dtype)


def rstd(x, eps: float, hidden: int | None = None, sum_axes: tuple[str, ...] = ()):
    """1 / sqrt(mean(x^2) + eps) per row, float32 [..., 1]. `hidden`: the whole row's length where x holds a
    slice of it whose partial sums of squares are all-reduced over `sum_axes`."""
    xf = x.astype(jnp.float32)
    squares = jnp.sum(xf * xf, axis=-1, keepdims=True)
    if sum_axes:
        squares = jax.lax.psum(squares, sum_axes)
    return jax.lax.rsqrt(squares / (hidden or x.shape[-1]) + eps)


def norm(x, weight, eps: float, *, hidden: int | None = None, sum_axes: tuple[str, ...] = (),
         col_axes: tuple[str, ...] = (), stats: bool = False):
    """x * rstd(x) * weight in float32, rounded to x's dtype; (that, rstd) with `stats`. `col_axes`: x holds
    whole rows and `weight` is this shard's slice of the hidden axis, split over these axes."""
    r = rstd(x, eps, hidden, sum_axes)
    xf = x.astype(jnp.float32)
    if col_axes:
        n = weight.shape[0]
        xf = jax.lax.dynamic_slice_in_dim(xf, shard_index(_partition.entry_of(col_axes)) * n, n, axis=-1)
    out = (xf * r * weight.astype(jnp.float32)).astype(x.dtype)
    return (out, r) if stats else out


def _split(eps: float, stats: bool, n_rows: int, layout: dict, *arrays):
    """The body of the two split layouts: out, or (out, [x + residual], [rstd])."""
    x = arrays[0] if n_rows == 1 else summed(arrays[0], arrays[1])
    out, r = norm(x, arrays[-1], eps, stats=True, **layout)
    results = (out, *([x] if n_rows == 2 else []), *([r] if stats else []))
    return results if len(results) > 1 else out


def planner(kernel: Callable, n_rows: int) -> Callable[..., Plan]:
    """The planner of `kernel(eps, limit, stats, *rows, weight)`: `n_rows` row operands (x, or x and the
    residual) and their results, then the rstd with `stats`."""
    def plan(eps: float, limit: int, stats: bool, mesh, operands: list[Operand], refine: bool) -> Plan:
        x, w = operands[0], operands[-1]
        rows, hx, hw = x.spec[:-1], x.spec[-1], w.spec[0]
        whole = rows + (None,)
        extra = [whole] if stats else []  # the rstd [..., 1]
        if axes_size(mesh, hx) > 1:
            split = rows + (hx,)
            body = partial(_split, eps, stats, n_rows, {"hidden": x.shape[-1], "sum_axes": axis_names(hx)})
            return Plan([split] * n_rows + [(hx,)], [split] * n_rows + extra, body)
        row_axes = {a for e in rows for a in axis_names(e)}
        if axes_size(mesh, hw) > 1 and not row_axes & set(axis_names(hw)):
            body = partial(_split, eps, stats, n_rows, {"col_axes": axis_names(hw)})
            return Plan([whole] * n_rows + [(hw,)], [rows + (hw,)] + [whole] * (n_rows - 1) + extra, body)
        return Plan([whole] * n_rows + [(None,)], [whole] * n_rows + extra, partial(kernel, eps, limit, stats))
    return plan
