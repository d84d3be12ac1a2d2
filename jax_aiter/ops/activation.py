"""SiLU-and-mul through the silu_and_mul FFI kernel; the backward is plain JAX.

Two forms, one kernel: x [..., 2d] holding [gate | up] (jax_aiter.silu_and_mul(x)), and gate and up [..., d] as
two arrays (upstream's jax_aiter.activation.silu_and_mul(gate, up)), which each shard joins locally into the
kernel's [gate | up] rows: gate and up split alike (rows or the last axis) stay split with no collective, as
plain JAX's silu(gate) * up does."""
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


def _kernel(limit, x):
    """silu_and_mul of x [..., 2d] on whatever shapes it gets: the whole array or one shard's [gate_i | up_i]."""
    _loader.ensure_registered("silu_and_mul")
    if _small.in_xla("silu_and_mul", x, limit):
        return _xla_silu_and_mul(x)
    out = jax.ShapeDtypeStruct((*x.shape[:-1], x.shape[-1] // 2), x.dtype)
    return _ffi.ffi_call("ja_silu_and_mul", out, x)


def _pairs(x):
    """x [..., 2d] as [..., 2, d]: gate and up, each in the output's columns (what the backward reads)."""
    return x.reshape(*x.shape[:-1], 2, x.shape[-1] // 2)


def _call(limit, stats, x):
    """The op; with `stats` (the forward of a gradient) also x as pairs, which a shard of a split last axis has
    after its exchange below, so the backward need not move x again."""
    out = _kernel(limit, x)
    return (out, _pairs(x)) if stats else out


def _paired(x, axes: tuple[str, ...], n: int):
    """[gate_i | up_i] of this shard, from x's last axis split n ways over `axes` (shard j holds columns
    [j c, (j + 1) c) of [gate | up], c = 2d / n): output shard i needs the i-th c/2 columns of gate and of up,
    half-chunks that live on shards i // 2 and (n + i) // 2. Four collective-permutes at most, one per
    (gate or up, first or second half-chunk), as plain JAX's jnp.split of a split axis has; a half-chunk that
    stays on its own shard is not sent."""
    i = _partition.shard_index(_partition.entry_of(axes))
    half = x.shape[-1] // 2
    halves = (x[..., :half], x[..., half:])

    def gather(offset: int):  # gate: global half-chunk k = i (offset 0); up: k = n + i (offset n)
        got = jnp.zeros_like(halves[0])
        for t in (0, 1):  # half-chunk k = 2 j + t sits on shard j
            pairs = [(j, 2 * j + t - offset) for j in range(n) if 0 <= 2 * j + t - offset < n]
            moved = [(a, b) for a, b in pairs if a != b]
            if moved:
                got = jnp.where((i + offset) % 2 == t, jax.lax.ppermute(halves[t], axes, moved), got)
            if any(a == b for a, b in pairs):  # the shard that holds its own half-chunk
                own = next(a for a, b in pairs if a == b)
                got = jnp.where(i == own, halves[t], got)
        return got

    return jnp.concatenate([gather(0), gather(n)], axis=-1)


def _split_call(limit, stats, axes, n, x):
    return _call(limit, stats, _paired(x, axes, n))


def _plan(limit, stats, mesh, operands, refine):
    """Rows keep their sharding. A split last axis stays split (d % n == 0): the shards trade half-chunks so that
    each holds [gate_i | up_i] of its own output columns, then the kernel runs on those; otherwise it is
    gathered (the kernel needs gate and up of the same columns)."""
    x = operands[0]
    rows, last = x.spec[:-1], x.spec[-1]
    n = _partition.axes_size(mesh, last)
    if not (n > 1 and (x.shape[-1] // 2) % n == 0):
        last = None
    outs = [rows + (last,)] + ([rows + (None, last)] if stats else [])
    body = (partial(_call, limit, stats) if last is None else
            partial(_split_call, limit, stats, _partition.axis_names(last), n))
    return _partition.Plan([rows + (last,)], outs, body)


def _rule(limit, stats, mesh, operand_types, result_types):
    """x's last axis (2d) is, for propagation, the compound (j two), j major: a split of it is then the same split
    of the output's d, which is what the plan does (shard i's output columns are the i-th of d, as jnp.split
    gives in plain JAX); the rule says nothing of which columns pair up, the plan does. The pairs [..., 2, d]
    share j; their pair axis p is never split."""
    if not stats:
        return "... (j two) -> ... j", {"two": 2}
    return "... (j two) -> ... j, ... p j", {"two": 2, "need_replication_factors": ("p",)}


# Every leading axis is a row for the kernel, so a vmapped batch folds into the rows (_batching.rowwise).
_PARTITIONED = _partition.partitioned(_call, _rule, _plan, n_static=2)


@cache
def _prim(limit: int, stats: bool):
    """The op's call at this JA_KERNEL_MIN_BYTES (static: a new value is a new trace). With `stats` it also gives
    x as pairs, and has the derivative of its jax.numpy form, so grad of grad differentiates it."""
    if not stats:
        return _batching.rowwise(partial(_PARTITIONED, limit, False), 1)
    op = _batching.rowwise(lambda x: tuple(_PARTITIONED(limit, True, x)), 1)
    return _partition.tangents_from(op, lambda x: (_xla_silu_and_mul(x), _pairs(x)))


@partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _silu_and_mul(x, limit, spec):
    """`spec`: x's spec under Explicit mesh axes (_partition.spec_of), the gradient's; static."""
    return _prim(limit, False)(x)


def _fwd(x, limit, spec):
    out, pairs = _prim(limit, True)(x)
    return out, pairs


def _grads(gate, up, g):
    """float32 (d gate, d up) of silu(gate) * up for the output's cotangent g."""
    a, b, gf = (x.astype(jnp.float32) for x in (gate, up, g))
    s = jax.nn.sigmoid(a)
    return gf * b * s * (1.0 + a * (1.0 - s)), gf * a * s


def _bwd(limit, spec, pairs, g):
    """dx = [dgate | dup], put together as plain JAX's autodiff of the definition's slices does (each half padded
    to x's width, then summed): with x's last axis split, XLA moves the halves with collective-permutes. (A
    concatenate of them costs three all-to-alls over that axis: an FSDP MLP's hidden axis.)"""
    da, db = (x.astype(pairs.dtype) for x in _grads(pairs[..., 0, :], pairs[..., 1, :], g))
    d, rows = da.shape[-1], [(0, 0)] * (da.ndim - 1)
    dx = jnp.pad(da, [*rows, (0, d)]) + jnp.pad(db, [*rows, (d, 0)])
    return (_partition.to_spec(dx, spec),)


_silu_and_mul.defvjp(_fwd, _bwd)


# --- gate and up as two arrays ----------------------------------------------------------------------------

def _pair_call(limit, gate, up):
    """The kernel on this shard's (or the whole) gate and up: joined into its [gate | up] rows here, locally."""
    return _kernel(limit, jnp.concatenate([gate, up], axis=-1))


def _pair_plan(limit, mesh, operands, refine):
    """gate's split for both (up follows it, as plain JAX's elementwise product reshards one to the other) and the
    output: every axis, the last included, splits elementwise."""
    spec = operands[0].spec
    return _partition.Plan([spec, spec], [spec], partial(_pair_call, limit))


_PAIR = _partition.partitioned(_pair_call, "... j, ... j -> ... j", _pair_plan, n_static=1)


def _xla_pair(gate, up):
    return (jax.nn.silu(gate.astype(jnp.float32)) * up.astype(jnp.float32)).astype(gate.dtype)


@cache
def _pair_prim(limit: int):
    op = _batching.rowwise(partial(_PAIR, limit), 2)
    return _partition.tangents_from(op, _xla_pair)


@partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _silu_and_mul_pair(gate, up, limit, gate_spec, up_spec):
    return _pair_prim(limit)(gate, up)


def _pair_fwd(gate, up, limit, gate_spec, up_spec):
    return _pair_prim(limit)(gate, up), (gate, up)


def _pair_bwd(limit, gate_spec, up_spec, res, g):
    gate, up = res
    da, db = _grads(gate, up, g)
    return _partition.to_spec(da.astype(gate.dtype), gate_spec), _partition.to_spec(db.astype(up.dtype), up_spec)


_silu_and_mul_pair.defvjp(_pair_fwd, _pair_bwd)


def _gate_and_up(gate, up) -> jax.Array:
    op = "silu_and_mul"
    gate, up = _checks.as_array(op, "gate", gate), _checks.as_array(op, "up", up)
    _checks.check_dtype(op, "gate", gate)
    _checks.check_same_dtype(op, "gate", gate, "up", up)
    if gate.shape != up.shape:
        raise ValueError(f"{op}: gate has shape {tuple(gate.shape)} but up has {tuple(up.shape)}; they are the two "
                         "halves of one projection and must have one shape")
    if gate.ndim < 1:
        raise ValueError(f"{op}: gate and up must have rank >= 1 ([..., d]), got shape {tuple(gate.shape)}")
    if _checks.is_empty(gate):
        return _xla_pair(gate, up)
    return _silu_and_mul_pair(gate, up, _small.limit(), _partition.spec_of(gate), _partition.spec_of(up))


def silu_and_mul(x: ArrayLike, up: ArrayLike | None = None) -> jax.Array:
    """SwiGLU's activation: silu(x[..., :d]) * x[..., d:], or silu(gate) * up given two arrays.

    Parameters
    ----------
    x : array_like, shape [..., 2 * d]
        float32, bfloat16 or float16: the gate half then the up half on the last axis.
        Every leading axis is a row. With `up`: the gate, shape [..., d].
    up : array_like, shape [..., d], optional
        The up projection, gate's shape and dtype (upstream's jax_aiter.activation.silu_and_mul(gate,
        up)). Differentiable in both.

    Returns
    -------
    jax.Array, shape [..., d], the dtype of x
        Computed in float32 and rounded once.

    Notes
    -----
    Input conversion, zero-size inputs, small inputs (JA_KERNEL_MIN_BYTES), the
    transformations that work (grad of grad included: the backward is plain JAX) and the
    one that does not (forward-mode autodiff) are as for rms_norm. Under jax.jit with
    NamedSharding inputs (Auto or Explicit mesh axes) the rows stay sharded, and a split
    last axis stays split: the output's columns split as plain JAX's jnp.split gives
    (docs/transformations.md). Given gate and up, each shard joins its own gate and up
    columns (a copy of both, in the shard), so gate and up split alike stay split with no
    collective, as plain JAX's silu(gate) * up.
    """
    if up is not None:
        return _gate_and_up(x, up)
    x = _checks.as_array("silu_and_mul", "x", x)
    _checks.check_dtype("silu_and_mul", "x", x)
    if x.ndim < 1 or x.shape[-1] % 2:
        raise ValueError(f"silu_and_mul: x's last dimension must be even ([gate | up] halves), got shape {x.shape}")
    if _checks.is_empty(x):
        return _xla_silu_and_mul(x)
    return _silu_and_mul(x, _small.limit(), _partition.spec_of(x))
