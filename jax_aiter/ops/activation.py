"""SiLU-and-mul through the silu_and_mul FFI kernel; the backward is plain JAX."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_aiter import _loader
from jax_aiter.ops import _checks, _ffi


def _silu_and_mul_prim(x):
    _loader.ensure_registered("silu_and_mul")
    out = jax.ShapeDtypeStruct((*x.shape[:-1], x.shape[-1] // 2), x.dtype)
    # Every leading axis is a row for the kernel, so a vmapped batch folds in.
    return _ffi.ffi_call("ja_silu_and_mul", out, x, vmap_method="broadcast_all")


@jax.custom_vjp
def _silu_and_mul(x):
    return _silu_and_mul_prim(x)


def _fwd(x):
    return _silu_and_mul_prim(x), x


def _bwd(x, g):
    a, b = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    gf = g.astype(jnp.float32)
    s = jax.nn.sigmoid(a)
    da = gf * b * s * (1.0 + a * (1.0 - s))
    db = gf * a * s
    return (jnp.concatenate([da, db], axis=-1).astype(x.dtype),)


_silu_and_mul.defvjp(_fwd, _bwd)


def silu_and_mul(x: jax.Array) -> jax.Array:
    """silu(x[..., :d]) * x[..., d:] for x of last dimension 2*d."""
    _checks.check_dtype("silu_and_mul", "x", x)
    if x.ndim < 1 or x.shape[-1] % 2:
        raise ValueError(f"silu_and_mul: x's last dimension must be even ([gate | up] halves), got shape {x.shape}")
    return _silu_and_mul(x)
