"""RMSNorm through the rmsnorm_fwd FFI kernel; the backward is plain JAX."""
from __future__ import annotations

from functools import cache, partial

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from jax_aiter import _loader
from jax_aiter.ops import _batching, _checks, _ffi, _partition, _sharding, _small


def _check(op: str, x, weight, eps, residual=None) -> float:
    _checks.check_dtype(op, "x", x)
    _checks.check_same_dtype(op, "x", x, "weight", weight)
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


def _row_planner(fn, n_rows: int):
    """Rows keep their sharding; the hidden dimension (normalised over) and the weight are whole."""
    def plan(eps, limit, mesh, operands, refine):
        row = operands[0].spec[:-1] + (None,)
        return _partition.Plan([row] * n_rows + [(None,)], [row] * n_rows, partial(fn, eps, limit))
    return plan


def _plain(eps, limit, x, weight):
    _loader.ensure_registered("rmsnorm_fwd")
    if _small.in_xla("rms_norm", x, limit):
        return _xla_norm(x, weight, eps)
    return _ffi.ffi_call("ja_rmsnorm_fwd", jax.ShapeDtypeStruct(x.shape, x.dtype), x, weight, eps=_ffi.f32(eps))


def _with_add(eps, limit, x, residual, weight):
    _loader.ensure_registered("rmsnorm_fwd")
    if _small.in_xla("rms_norm_with_add", x, limit):
        return _xla_norm_add(x, residual, weight, eps)
    out = jax.ShapeDtypeStruct(x.shape, x.dtype)
    return _ffi.ffi_call("ja_rmsnorm_fwd_add", (out, out), x, residual, weight, eps=_ffi.f32(eps))


# The hidden dimension h is one factor in x, residual, weight and the results; it must not be sharded
# (the row's mean of squares would be a partial sum).
_PLAIN = _partition.partitioned(_plain, "... h, h -> ... h", _row_planner(_plain, 1), n_static=2,
                                need_replication_factors=("h",))
_WITH_ADD = _partition.partitioned(_with_add, "... h, ... h, h -> ... h, ... h", _row_planner(_with_add, 2),
                                   n_static=2,
                                   need_replication_factors=("h",))


@cache
def _prims(eps: float, limit: int):
    """The two ops' calls at this eps and JA_KERNEL_MIN_BYTES (both static: a new value is a new trace)."""
    return (_batching.rowwise(partial(_PLAIN, eps, limit), 1),
            _batching.rowwise(lambda x, r, w: tuple(_WITH_ADD(eps, limit, x, r, w)), 2))


def _rms_bwd_math(x, weight, g, eps):
    """d/dx and d/dweight of x * rsqrt(mean(x^2) + eps) * weight, in float32."""
    xf, gf, wf = x.astype(jnp.float32), g.astype(jnp.float32), weight.astype(jnp.float32)
    r = jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    xhat = xf * r
    gw = gf * wf
    dx = r * (gw - xhat * jnp.mean(gw * xhat, axis=-1, keepdims=True))
    dw = jnp.sum(gf * xhat, axis=tuple(range(x.ndim - 1)))  # no reshape: a sharded row axis stays local
    return dx, dw


@partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _rms_norm(x, weight, eps, limit):
    return _prims(eps, limit)[0](x, weight)


def _rms_norm_fwd(x, weight, eps, limit):
    return _rms_norm(x, weight, eps, limit), (x, weight)


def _rms_norm_bwd(eps, limit, res, g):
    x, weight = res
    dx, dw = _rms_bwd_math(x, weight, g, eps)
    return dx.astype(x.dtype), dw.astype(weight.dtype)


_rms_norm.defvjp(_rms_norm_fwd, _rms_norm_bwd)


@partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _rms_norm_add(x, residual, weight, eps, limit):
    return _prims(eps, limit)[1](x, residual, weight)


def _rms_norm_add_fwd(x, residual, weight, eps, limit):
    out, summed = _rms_norm_add(x, residual, weight, eps, limit)
    return (out, summed), (summed, weight)


def _rms_norm_add_bwd(eps, limit, res, cts):
    summed, weight = res
    g_out, g_sum = cts
    dsum, dw = _rms_bwd_math(summed, weight, g_out, eps)
    dsum = dsum + g_sum.astype(jnp.float32)
    return dsum.astype(summed.dtype), dsum.astype(summed.dtype), dw.astype(weight.dtype)


_rms_norm_add.defvjp(_rms_norm_add_fwd, _rms_norm_add_bwd)


def _xla_norm(x, weight, eps):
    """The norm in jax.numpy (float32 inside, one rounding, as the kernel), which XLA compiles and fuses: for
    zero-size inputs (no kernel call) and for inputs under JA_KERNEL_MIN_BYTES (_small)."""
    xf = x.astype(jnp.float32)
    r = jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return (xf * r * weight.astype(jnp.float32)).astype(x.dtype)


def _xla_norm_add(x, residual, weight, eps):
    """rms_norm_with_add in jax.numpy: the sum in float32 rounded to x's dtype, then its norm (as the kernel)."""
    summed = (x.astype(jnp.float32) + residual.astype(jnp.float32)).astype(x.dtype)
    return _xla_norm(summed, weight, eps), summed


def rms_norm(x: ArrayLike, weight: ArrayLike, eps: float = 1e-6) -> jax.Array:
    """RMSNorm over the last axis: x / sqrt(mean(x**2, axis=-1) + eps) * weight.

    Parameters
    ----------
    x : array_like, shape [..., hidden]
        float32, bfloat16 or float16. Every leading axis is a row.
    weight : array_like, shape [hidden]
        The dtype of x.
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
    jax_enable_x64 is on, and float64 is refused); all inputs must then share one
    dtype. Zero-size inputs (no rows, or hidden 0) give empty results and gradients,
    with no kernel call. An x smaller than JA_KERNEL_MIN_BYTES (1 MiB by default; one
    call's bytes: per device under sharding, a vmapped batch folded into the rows) is
    computed in jax.numpy with the kernel's precision instead, which XLA fuses with the
    ops around it, as for a decode step's few rows (docs/transformations.md).

    Works under jit, vmap, grad (the backward is plain JAX, so grad of grad works
    too), remat, scan, jax.shard_map (replicated or sharded weight) and jax.jit
    with NamedSharding inputs (the rows stay sharded; a sharded hidden
    dimension is gathered first), and jax.export with symbolic leading dimensions
    (docs/transformations.md). Not supported: forward-mode autodiff (jax.jvp,
    jax.jacfwd, jax.hessian; JAX raises "can't apply forward-mode autodiff (jvp) to a
    custom_vjp function").
    """
    x, weight = _checks.as_array("rms_norm", "x", x), _checks.as_array("rms_norm", "weight", weight)
    eps = _check("rms_norm", x, weight, eps)
    if _checks.is_empty(x):
        return _xla_norm(x, weight, eps)
    x, weight = _sharding.vary_like(x, weight)
    return _rms_norm(x, weight, eps, _small.limit())


def rms_norm_with_add(x: ArrayLike, residual: ArrayLike, weight: ArrayLike,
                      eps: float = 1e-6) -> tuple[jax.Array, jax.Array]:
    """Fused residual add and RMSNorm: (rms_norm(x + residual, weight, eps), x + residual).

    Parameters
    ----------
    x, residual : array_like, shape [..., hidden]
        float32, bfloat16 or float16, one shape and dtype. Every leading axis is a row.
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
        return _xla_norm_add(x, residual, weight, eps)
    x, residual, weight = _sharding.vary_like(x, residual, weight)
    return _rms_norm_add(x, residual, weight, eps, _small.limit())
