"""RMSNorm through the rmsnorm_fwd FFI kernel; the backward is plain JAX."""
from __future__ import annotations

from functools import cache, partial

import jax
import jax.numpy as jnp

from jax_aiter import _loader
from jax_aiter.ops import _batching, _checks, _ffi, _sharding


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


@cache
def _prims(eps: float):
    def plain(x, weight):
        _loader.ensure_registered("rmsnorm_fwd")
        return _ffi.ffi_call("ja_rmsnorm_fwd", jax.ShapeDtypeStruct(x.shape, x.dtype), x, weight, eps=_ffi.f32(eps))

    def with_add(x, residual, weight):
        _loader.ensure_registered("rmsnorm_fwd")
        out = jax.ShapeDtypeStruct(x.shape, x.dtype)
        return _ffi.ffi_call("ja_rmsnorm_fwd_add", (out, out), x, residual, weight, eps=_ffi.f32(eps))

    return _batching.rowwise(plain, 1), _batching.rowwise(with_add, 2)


def _rms_bwd_math(x, weight, g, eps):
    """d/dx and d/dweight of x * rsqrt(mean(x^2) + eps) * weight, in float32."""
    xf, gf, wf = x.astype(jnp.float32), g.astype(jnp.float32), weight.astype(jnp.float32)
    r = jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    xhat = xf * r
    gw = gf * wf
    dx = r * (gw - xhat * jnp.mean(gw * xhat, axis=-1, keepdims=True))
    dw = jnp.sum((gf * xhat).reshape(-1, x.shape[-1]), axis=0)
    return dx, dw


@partial(jax.custom_vjp, nondiff_argnums=(2,))
def _rms_norm(x, weight, eps):
    return _prims(eps)[0](x, weight)


def _rms_norm_fwd(x, weight, eps):
    return _rms_norm(x, weight, eps), (x, weight)


def _rms_norm_bwd(eps, res, g):
    x, weight = res
    dx, dw = _rms_bwd_math(x, weight, g, eps)
    return dx.astype(x.dtype), dw.astype(weight.dtype)


_rms_norm.defvjp(_rms_norm_fwd, _rms_norm_bwd)


@partial(jax.custom_vjp, nondiff_argnums=(3,))
def _rms_norm_add(x, residual, weight, eps):
    return _prims(eps)[1](x, residual, weight)


def _rms_norm_add_fwd(x, residual, weight, eps):
    out, summed = _rms_norm_add(x, residual, weight, eps)
    return (out, summed), (summed, weight)


def _rms_norm_add_bwd(eps, res, cts):
    summed, weight = res
    g_out, g_sum = cts
    dsum, dw = _rms_bwd_math(summed, weight, g_out, eps)
    dsum = dsum + g_sum.astype(jnp.float32)
    return dsum.astype(summed.dtype), dsum.astype(summed.dtype), dw.astype(weight.dtype)


_rms_norm_add.defvjp(_rms_norm_add_fwd, _rms_norm_add_bwd)


def rms_norm(x: jax.Array, weight: jax.Array, eps: float = 1e-6) -> jax.Array:
    """x / sqrt(mean(x**2, -1) + eps) * weight over the last axis (float32 accumulation)."""
    eps = _check("rms_norm", x, weight, eps)
    x, weight = _sharding.vary_like(x, weight)
    return _rms_norm(x, weight, eps)


def rms_norm_with_add(x: jax.Array, residual: jax.Array, weight: jax.Array,
                      eps: float = 1e-6) -> tuple[jax.Array, jax.Array]:
    """Fused residual add and RMSNorm: returns (rms_norm(x + residual), x + residual)."""
    eps = _check("rms_norm_with_add", x, weight, eps, residual)
    x, residual, weight = _sharding.vary_like(x, residual, weight)
    return _rms_norm_add(x, residual, weight, eps)
