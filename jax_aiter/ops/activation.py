"""SiLU-and-mul through the silu_and_mul FFI kernel; the backward is plain JAX."""
from __future__ import annotations

from functools import cache, partial

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from jax_aiter import _loader
from jax_aiter.ops import _batching, _checks, _ffi, _partition, _small


def _xla_silu_and_mul(x):
    """SiLU-and-mul in jax.numpy (float32 inside, one rounding, as the kernel), which XLA compiles and fuses: for
    zero-size inputs (no kernel call) and for inputs under JA_KERNEL_MIN_BYTES (_small)."""
    a, b = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return (jax.nn.silu(a) * b).astype(x.dtype)


def _call(limit, x):
    _loader.ensure_registered("silu_and_mul")
    if _small.in_xla("silu_and_mul", x, limit):
        return _xla_silu_and_mul(x)
    out = jax.ShapeDtypeStruct((*x.shape[:-1], x.shape[-1] // 2), x.dtype)
    return _ffi.ffi_call("ja_silu_and_mul", out, x)


def _plan(limit, mesh, operands, refine):
    """Rows keep their sharding; the last axis ([gate | up] in, d out) stays whole."""
    row = operands[0].spec[:-1] + (None,)
    return _partition.Plan([row], [row], partial(_call, limit))


# The last axis is 2*d in and d out: two factors, neither shardable (a shard would split gate from up).
# Every leading axis is a row for the kernel, so a vmapped batch folds into the rows (_batching.rowwise).
_PARTITIONED = _partition.partitioned(_call, "... i -> ... j", _plan, n_static=1, need_replication_factors=("i", "j"))


@cache
def _prim(limit: int):
    """The op's call at this JA_KERNEL_MIN_BYTES (static: a new value is a new trace)."""
    return _batching.rowwise(partial(_PARTITIONED, limit), 1)


@partial(jax.custom_vjp, nondiff_argnums=(1,))
def _silu_and_mul(x, limit):
    return _prim(limit)(x)


def _fwd(x, limit):
    # the custom_vjp itself, not the kernel call: grad of grad then differentiates this call through
    # _bwd (plain JAX) instead of asking the kernel for a derivative it does not have
    return _silu_and_mul(x, limit), x


def _bwd(limit, x, g):
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
    Input conversion, zero-size inputs, small inputs (JA_KERNEL_MIN_BYTES), the
    transformations that work (grad of grad included: the backward is plain JAX) and the
    one that does not (forward-mode autodiff) are as for rms_norm. Under jax.jit with
    NamedSharding inputs the rows stay sharded; a sharded last axis is gathered first.
    """
    x = _checks.as_array("silu_and_mul", "x", x)
    _checks.check_dtype("silu_and_mul", "x", x)
    if x.ndim < 1 or x.shape[-1] % 2:
        raise ValueError(f"silu_and_mul: x's last dimension must be even ([gate | up] halves), got shape {x.shape}")
    if _checks.is_empty(x):
        return _xla_silu_and_mul(x)
    return _silu_and_mul(x, _small.limit())
