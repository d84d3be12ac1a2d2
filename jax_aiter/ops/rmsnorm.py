"""RMSNorm through the rmsnorm_fwd FFI kernel; the backward is plain JAX."""
from __future__ import annotations

from functools import cache, partial

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from jax_aiter import _loader
from jax_aiter.ops import (
    _batching,
    _checks,
    _ffi,
    _norm_sharding,
    _partition,
    _sharding,
    _small,
)


def _check(op: str, x, weight, eps, residual=None) -> float:
    _checks.check_dtype(op, "x", x)
    _checks.check_dtype(op, "weight", weight)  # may differ from x's (a float32 parameter): computed in float32
    if residual is not None:
        _checks.check_same_dtype(op, "x", x, "residual", residual)
        if residual.shape != x.shape:
            raise ValueError(f"{op}: residual shape {residual.shape} must equal x shape {x.shape}")
    if x.ndim < 1:
        raise ValueError(f"{op}: x must have rank >= 1 (rows x hidden), got a scalar")
    if weight.ndim != 1 or weight.shape[0] != x.shape[-1]:
        raise ValueError(f"{op}: weight shape {weight.shape} must be (hidden,) = ({x.shape[-1]},), "
                         "the size of x's last dimension")
    return _checks.check_eps(op, eps)


def _in_xla(op: str, x, weight, limit: int) -> bool:
    """The op is written in jax.numpy (_norm_sharding.norm): for inputs under JA_KERNEL_MIN_BYTES (_small), and
    for a weight of another dtype than x (the kernel takes one dtype; a float32 weight with bfloat16 rows is
    Flax's default), which XLA fuses as it would the user's own norm."""
    return weight.dtype != x.dtype or _small.in_xla(op, x, limit)


def _plain(eps, limit, stats, x, weight):
    """rms_norm on whatever shapes it gets (the whole arrays or one shard); with `stats` also the float32 1/rms
    of every row, for the backward."""
    _loader.ensure_registered("rmsnorm_fwd")
    if _in_xla("rms_norm", x, weight, limit):
        return _norm_sharding.norm(x, weight, eps, stats=stats)
    out = _ffi.ffi_call("ja_rmsnorm_fwd", jax.ShapeDtypeStruct(x.shape, x.dtype), x, weight, eps=_ffi.f32(eps))
    return (out, _norm_sharding.rstd(x, eps)) if stats else out


def _with_add(eps, limit, stats, x, residual, weight):
    """rms_norm_with_add as _plain: (out, x + residual), then the 1/rms with `stats`."""
    _loader.ensure_registered("rmsnorm_fwd")
    if _in_xla("rms_norm_with_add", x, weight, limit):
        total = _norm_sharding.summed(x, residual)
        out, r = _norm_sharding.norm(total, weight, eps, stats=True)
    else:
        shape = jax.ShapeDtypeStruct(x.shape, x.dtype)
        out, total = _ffi.ffi_call("ja_rmsnorm_fwd_add", (shape, shape), x, residual, weight, eps=_ffi.f32(eps))
        r = _norm_sharding.rstd(total, eps) if stats else None
    return (out, total, r) if stats else (out, total)


def _rule(n_rows: int):
    """The Shardy rule: the hidden dimension h is one factor in the rows, the weight and the results (the
    planner, _norm_sharding.py, keeps it split as plain JAX would, with the sums of squares all-reduced); the
    rstd's last dimension (size 1) is a factor of its own."""
    def rule(eps, limit, stats, mesh, operand_types, result_types):
        rows = ["... h"] * n_rows
        return ", ".join([*rows, "h"]) + " -> " + ", ".join(rows + (["... one"] if stats else []))
    return rule


_PLAIN = _partition.partitioned(_plain, _rule(1), _norm_sharding.planner(_plain, 1), n_static=3)
_WITH_ADD = _partition.partitioned(_with_add, _rule(2), _norm_sharding.planner(_with_add, 2), n_static=3)


@cache
def _prims(eps: float, limit: int, stats: bool):
    """The two ops' calls at this eps and JA_KERNEL_MIN_BYTES (both static: a new value is a new trace). With
    `stats` (the forward of a gradient) the rows' rstd is a last result, and the calls have the derivative of
    their jax.numpy form, so grad of grad differentiates them."""
    def plain(x, w):
        out = _PLAIN(eps, limit, stats, x, w)
        return tuple(out) if stats else out

    ops = (_batching.rowwise(plain, 1),
           _batching.rowwise(lambda x, r, w: tuple(_WITH_ADD(eps, limit, stats, x, r, w)), 2))
    if not stats:
        return ops

    def with_add(x, residual, w):
        total = _norm_sharding.summed(x, residual)
        out, r = _norm_sharding.norm(total, w, eps, stats=True)
        return out, total, r
    return (_partition.tangents_from(ops[0], partial(_norm_sharding.norm, eps=eps, stats=True)),
            _partition.tangents_from(ops[1], with_add))


def _rms_bwd_math(x, weight, g, r):
    """d/dx and d/dweight of x * r * weight (r = rstd(x), saved by the forward), in float32.

    The row reduction is mean(g * weight * x), which does not need r: with the hidden axis split, its
    all-reduce is independent of the forward's, and XLA combines the two into one (as in plain JAX)."""
    xf, gf, wf = x.astype(jnp.float32), g.astype(jnp.float32), weight.astype(jnp.float32)
    # Under Explicit axes g * weight has the output's sharding, which splits the hidden axis where x may not (a
    # split weight's columns); it takes x's before the row reduction (plain JAX's transpose gathers there too),
    # so the reduction is local and dx needs no gather after it.
    gw = _partition.like(gf * wf, x)
    dx = r * gw - xf * (r * r * r) * jnp.mean(gw * xf, axis=-1, keepdims=True)
    dw = jnp.sum(gf * (xf * r), axis=tuple(range(x.ndim - 1)))  # no reshape: a sharded row axis stays local
    return dx, dw


def _grads(cts, primals):
    """Each cotangent in its primal's dtype and (Explicit mesh axes) sharding, as custom_vjp requires."""
    return tuple(_partition.like(c.astype(p.dtype), p) for c, p in zip(cts, primals))


@partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _rms_norm(x, weight, eps, limit):
    return _prims(eps, limit, False)[0](x, weight)


def _rms_norm_fwd(x, weight, eps, limit):
    out, r = _prims(eps, limit, True)[0](x, weight)
    return out, (x, weight, r)


def _rms_norm_bwd(eps, limit, res, g):
    x, weight, r = res
    return _grads(_rms_bwd_math(x, weight, g, r), (x, weight))


_rms_norm.defvjp(_rms_norm_fwd, _rms_norm_bwd)


@partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _rms_norm_add(x, residual, weight, eps, limit, specs):
    """`specs`: the inputs' specs under Explicit mesh axes (_partition.spec_of), which the gradients take; static,
    so the backward keeps no copy of x and the residual, only of their sum."""
    return _prims(eps, limit, False)[1](x, residual, weight)


def _rms_norm_add_fwd(x, residual, weight, eps, limit, specs):
    out, total, r = _prims(eps, limit, True)[1](x, residual, weight)
    return (out, total), (total, weight, r)


def _rms_norm_add_bwd(eps, limit, specs, res, cts):
    total, weight, r = res
    g_out, g_sum = cts
    dsum, dw = _rms_bwd_math(total, weight, g_out, r)
    dsum = (dsum + g_sum.astype(jnp.float32)).astype(total.dtype)
    return tuple(_partition.to_spec(g, s) for g, s in zip((dsum, dsum, dw.astype(weight.dtype)), specs))


_rms_norm_add.defvjp(_rms_norm_add_fwd, _rms_norm_add_bwd)


def rms_norm(x: ArrayLike, weight: ArrayLike, eps: float = 1e-6) -> jax.Array:
    """RMSNorm over the last axis: x / sqrt(mean(x**2, axis=-1) + eps) * weight.

    Parameters
    ----------
    x : array_like, shape [..., hidden]
        float32, bfloat16 or float16. Every leading axis is a row.
    weight : array_like, shape [hidden]
        float32, bfloat16 or float16; the dtype of x, or another (a float32 parameter with
        bfloat16 activations, Flax's default): it is used in float32 either way. With the
        dtype of x the kernel runs; with another the op is written in jax.numpy, which XLA
        fuses (the kernel takes one dtype).
    eps : float
        Added to the mean of squares; finite and non-negative in float32.

    Returns
    -------
    jax.Array, the shape and dtype of x
        The mean of squares and the scaling are computed in float32.

    Notes
    -----
    Inputs are converted with jax.numpy.asarray, so lists and NumPy arrays follow
    jax.numpy's dtype rules (a float64 NumPy array becomes float32 unless
    jax_enable_x64 is on, and float64 is refused).
    Zero-size inputs (no rows, or hidden 0) give empty results and gradients,
    with no kernel call. An x smaller than JA_KERNEL_MIN_BYTES (1 MiB by default; one
    call's bytes: per device under sharding, a vmapped batch folded into the rows) is
    computed in jax.numpy with the kernel's precision instead, which XLA fuses with the
    ops around it, as for a decode step's few rows (docs/transformations.md).

    Works under jit, vmap, grad (the backward is plain JAX, so grad of grad works
    too), remat, scan, jax.shard_map (replicated or sharded weight) and jax.jit
    with NamedSharding inputs under Auto or Explicit mesh axes (the rows stay sharded;
    a split hidden axis stays split, its sums of squares all-reduced, as plain JAX does;
    docs/transformations.md), and jax.export with symbolic leading dimensions
    (docs/transformations.md). Not supported: forward-mode autodiff (jax.jvp,
    jax.jacfwd, jax.hessian; JAX raises "can't apply forward-mode autodiff (jvp) to a
    custom_vjp function").
    """
    x, weight = _checks.as_array("rms_norm", "x", x), _checks.as_array("rms_norm", "weight", weight)
    eps = _check("rms_norm", x, weight, eps)
    if _checks.is_empty(x):
        return _norm_sharding.norm(x, weight, eps)
    x, weight = _sharding.vary_like(x, weight)
    return _rms_norm(x, weight, eps, _small.limit())


def rms_norm_with_add(x: ArrayLike, residual: ArrayLike, weight: ArrayLike,
                      eps: float = 1e-6) -> tuple[jax.Array, jax.Array]:
    """Fused residual add and RMSNorm: (rms_norm(x + residual, weight, eps), x + residual).

    Parameters
    ----------
    x, residual : array_like, shape [..., hidden]
        float32, bfloat16 or float16, one shape and dtype. Every leading axis is a row.
        (The weight may have another dtype, as for rms_norm.)
    weight, eps
        As for rms_norm.

    Returns
    -------
    (jax.Array, jax.Array), each the shape and dtype of x
        The normalised sum, and the sum x + residual rounded to x's dtype (the
        next layer's residual). The norm is computed from the rounded sum, in float32.

    Notes
    -----
    Input conversion, zero-size inputs, small inputs (JA_KERNEL_MIN_BYTES), the
    transformations that work and the one that does not (forward-mode autodiff) are as
    for rms_norm.
    """
    op = "rms_norm_with_add"
    x, residual, weight = (_checks.as_array(op, n, a) for n, a in (("x", x), ("residual", residual),
                                                                   ("weight", weight)))
    eps = _check(op, x, weight, eps, residual)
    if _checks.is_empty(x):
        total = _norm_sharding.summed(x, residual)
        return _norm_sharding.norm(total, weight, eps), total
    x, residual, weight = _sharding.vary_like(x, residual, weight)
    specs = tuple(_partition.spec_of(a) for a in (x, residual, weight))
    return _rms_norm_add(x, residual, weight, eps, _small.limit(), specs)
