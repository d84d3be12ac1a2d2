"""Flash attention through the mha_fwd / mha_bwd FFI kernels, with a custom VJP.

The forward kernel returns the output and the row log-sum-exp (lse, float32
[batch, heads_q, seq_q]); lse stays inside the VJP residuals, where the
backward kernel uses it to recompute the softmax instead of storing it.
The backward kernel also takes two float32 workspace buffers (the dQ
accumulator and rowsum(dO * O)), and the forward one (the split-KV decode
path's partial results); they are extra FFI results that XLA allocates and
this module drops.
"""
from __future__ import annotations

import math
from functools import cache, partial

import jax
import jax.numpy as jnp
import numpy as np

from jax_aiter import _loader
from jax_aiter.ops import _batching, _checks, _ffi

OP = "flash_attn_func"
# Head dims with compiled instances: the head_dim axis of the mha_fwd/mha_bwd
# modules in jax_aiter/jit/optCompilerConfig.json (a test keeps them equal).
SUPPORTED_HEAD_DIMS = (32, 64, 96, 128, 256)


def _check(q, k, v, causal, softmax_scale) -> float:
    """Validate the inputs; return the softmax scale as a Python float."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        _checks.check_dtype(OP, name, x)
    _checks.check_same_dtype(OP, "q", q, "k", k)
    _checks.check_same_dtype(OP, "q", q, "v", v)
    for name, x, seq, heads in (("q", q, "seq_q", "heads_q"), ("k", k, "seq_k", "heads_kv"),
                                ("v", v, "seq_k", "heads_kv")):
        if x.ndim != 4:
            raise ValueError(f"{OP}: {name} must have rank 4 [batch, {seq}, {heads}, head_dim], "
                             f"got shape {tuple(x.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"{OP}: k and v must have the same shape [batch, seq_k, heads_kv, head_dim], "
                         f"got k {tuple(k.shape)} and v {tuple(v.shape)}")
    batch, _, heads_q, head_dim = q.shape
    if k.shape[0] != batch:
        raise ValueError(f"{OP}: batch size mismatch: q has {batch}, k and v have {k.shape[0]}")
    if k.shape[3] != head_dim:
        raise ValueError(f"{OP}: head_dim mismatch: q has {head_dim}, k and v have {k.shape[3]}")
    heads_kv = k.shape[2]
    if heads_kv == 0 or heads_q % heads_kv != 0:
        raise ValueError(f"{OP}: heads_q ({heads_q}) must be a multiple of heads_kv ({heads_kv}) "
                         "for grouped-query attention")
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"{OP}: head_dim {head_dim} is not supported; supported head dims are "
                         f"{', '.join(map(str, SUPPORTED_HEAD_DIMS))} (pad q, k and v to one of them)")
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"{OP}: causal must be a Python bool, got {type(causal).__name__}")
    return _checks.check_scale(OP, softmax_scale, 1.0 / math.sqrt(head_dim))


# The GPU's split-KV decode path (csrc/kernels/mha/mha_fwd_gpu_decode.cuh) keeps each
# split's partial output in a float32 workspace, an extra result of the forward FFI call
# that XLA allocates and this module drops. Its size only caps the number of splits the
# kernel may choose (it picks them from the device's multiprocessors); the kernel never
# needs more, and with none it runs one split. The figures mirror the kernel's defaults.
_DECODE_MAX_ROWS = 64      # query rows per kv head (group x seq_q) that take the path
_DECODE_TILE_KEYS = 64     # keys per tile
_DECODE_MIN_TILES = 4      # fewest tiles per split
_DECODE_BLOCKS = 2048      # blocks worth room for: 4 waves of 2 blocks on 256 multiprocessors
_DECODE_MAX_SPLITS = 256


def _decode_workspace_shape(batch: int, seq_q: int, seq_k: int, heads_q: int, heads_kv: int,
                            head_dim: int) -> tuple[int, int]:
    """(batch, n): the forward's float32 workspace; n = 0 where the split-KV path cannot split."""
    rows = heads_q // heads_kv * seq_q
    if rows > _DECODE_MAX_ROWS:
        return (batch, 0)
    blocks_per_batch = heads_kv * -(-rows // 16)  # one per kv head and 16 query rows, per split
    splits = min(_DECODE_MAX_SPLITS, -(-_DECODE_BLOCKS // (batch * blocks_per_batch)),
                 -(-seq_k // _DECODE_TILE_KEYS) // _DECODE_MIN_TILES)
    if splits <= 1:
        return (batch, 0)
    return (batch, blocks_per_batch * splits * 16 * (head_dim + 1))


@cache
def _prims(causal: bool, scale: float):
    """The forward and backward FFI calls for one (causal, scale), batched by folding into batch."""
    attrs = {"causal": np.bool_(causal), "scale": _ffi.f32(scale)}

    def fwd(q, k, v):
        _loader.ensure_registered("mha_fwd")
        batch, seq_q, heads_q, head_dim = q.shape
        ws = _decode_workspace_shape(batch, seq_q, k.shape[1], heads_q, k.shape[2], head_dim)
        outs = (jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((batch, heads_q, seq_q), jnp.float32),
                jax.ShapeDtypeStruct(ws, jnp.float32))  # workspace: split-KV partial results
        o, lse, _ = _ffi.ffi_call("ja_mha_fwd", outs, q, k, v, **attrs)
        return o, lse

    def bwd(q, k, v, o, do, lse):
        _loader.ensure_registered("mha_bwd")
        outs = (jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(k.shape, k.dtype),
                jax.ShapeDtypeStruct(v.shape, v.dtype),
                jax.ShapeDtypeStruct(q.shape, jnp.float32),      # workspace: dQ accumulator
                jax.ShapeDtypeStruct(lse.shape, jnp.float32))    # workspace: rowsum(dO * O)
        dq, dk, dv, _, _ = _ffi.ffi_call("ja_mha_bwd", outs, q, k, v, o, do, lse, **attrs)
        return dq, dk, dv

    return _batching.fold_into_batch(fwd), _batching.fold_into_batch(bwd)


@partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _flash(q, k, v, causal, scale):
    return _prims(causal, scale)[0](q, k, v)[0]


def _flash_fwd(q, k, v, causal, scale):
    o, lse = _prims(causal, scale)[0](q, k, v)
    return o, (q, k, v, o, lse)


def _flash_bwd(causal, scale, res, do):
    q, k, v, o, lse = res
    return _prims(causal, scale)[1](q, k, v, o, do.astype(o.dtype), lse)


_flash.defvjp(_flash_fwd, _flash_bwd)


def flash_attn_func(q: jax.Array, k: jax.Array, v: jax.Array, causal: bool = False,
                    softmax_scale: float | None = None) -> jax.Array:
    """softmax(q k^T * softmax_scale) v without materialising the seq_q x seq_k matrix.

    q is [batch, seq_q, heads_q, head_dim]; k and v are [batch, seq_k, heads_kv,
    head_dim] with heads_q a multiple of heads_kv (grouped-query attention: query
    head h uses kv head h // (heads_q // heads_kv)). float16, bfloat16 or
    float32; head_dim 32, 64, 96, 128 or 256; softmax_scale defaults to 1/sqrt(head_dim).
    causal=True masks key j for query i unless j <= i + seq_k - seq_q (aligned to
    the bottom-right corner, as FlashAttention does); a query row that sees no
    key outputs 0. Accumulation is float32. Differentiable (custom VJP calling
    the mha_bwd kernel); works under jit and vmap.
    """
    scale = _check(q, k, v, causal, softmax_scale)
    return _flash(q, k, v, bool(causal), scale)
