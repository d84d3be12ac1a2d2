"""SiLU-and-mul through the silu_and_mul FFI kernel; the backward is plain JAX."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from jax_aiter import _loader
from jax_aiter.ops import _batching, _checks, _ffi, _partition


def _call(x):
    _loader.ensure_registered("silu_and_mul")
    out = jax.ShapeDtypeStruct((*x.shape[:-1], x.shape[-1] // 2), x.dtype)
    return _ffi.ffi_call("ja_silu_and_mul", out, x)


def _specs(mesh, arg_shapes):
    """Rows keep their sharding; the last axis ([gate | up] in, d out) stays whole."""
    row = _partition.padded_spec(arg_shapes[0])[:-1] + (None,)
    return [row], [row], {}


# The last axis is 2*d in and d out: two factors, neither shardable (a shard would split gate from up).
# Every leading axis is a row for the kernel, so a vmapped batch folds into the rows (_batching.rowwise).
_silu_and_mul_prim = _batching.rowwise(
    _partition.partitioned(_call, "... i -> ... j", _specs, need_replication_factors=("i", "j")), 1)


@jax.custom_vjp
def _silu_and_mul(x):
    return _silu_and_mul_prim(x)


def _fwd(x):
    # the custom_vjp itself, not the kernel call: grad of grad then differentiates this call through
    # _bwd (plain JAX) instead of asking the kernel for a derivative it does not have
    return _silu_and_mul(x), x


def _bwd(x, g):
    a, b = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    gf = g.astype(jnp.float32)
    s = jax.nn.sigmoid(a)
    da = gf * b * s * (1.0 + a * (1.0 - s))
    db = gf * a * s
    return (jnp.concatenate([da, db], axis=-1).astype(x.dtype),)


_silu_and_mul.defvjp(_fwd, _bwd)


def silu_and_mul(x: ArrayLike) -> jax.Array:
    """SwiGLU's activation: silu(x[..., :d]) * x[..., d:].

    Parameters
    ----------
    x : array_like, shape [..., 2 * d]
        float32, bfloat16 or float16: the gate half then the up half on the last axis.
        Every leading axis is a row.

    Returns
    -------
    jax.Array, shape [..., d], the dtype of x
        Computed in float32 and rounded once.

    Notes
    -----
    Input conversion, zero-size inputs, the transformations that work (grad of grad
    included: the backward is plain JAX) and the one that does not (forward-mode
    autodiff) are as for rms_norm. Under jax.jit with NamedSharding inputs the rows stay sharded; a sharded
    last axis is gathered first.
    """
    x = _checks.as_array("silu_and_mul", "x", x)
    _checks.check_dtype("silu_and_mul", "x", x)
    if x.ndim < 1 or x.shape[-1] % 2:
        raise ValueError(f"silu_and_mul: x's last dimension must be even ([gate | up] halves), got shape {x.shape}")
    if _checks.is_empty(x):
        a, b = jnp.split(x.astype(jnp.float32), 2, axis=-1)
        return (jax.nn.silu(a) * b).astype(x.dtype)
    return _silu_and_mul(x)
