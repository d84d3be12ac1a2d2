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
from jax.typing import ArrayLike

from jax_aiter import _loader
from jax_aiter.ops import (
    _attention_sharding,
    _batching,
    _checks,
    _ffi,
    _partition,
    _sharding,
)

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
        padded = min((d for d in SUPPORTED_HEAD_DIMS if d > head_dim), default=None)
        hint = ("" if padded is None else
                f"; pad q, k and v with zeros to head_dim {padded} (jnp.pad on the last axis), pass "
                f"softmax_scale=1/sqrt({head_dim}) = {1.0 / math.sqrt(head_dim):.6g} (the scale of the original "
                f"head_dim, not of {padded}) and keep the output's first {head_dim} columns")
        raise ValueError(f"{OP}: head_dim {head_dim} is not supported; supported head dims are "
                         f"{', '.join(map(str, SUPPORTED_HEAD_DIMS))}{hint}")
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


def _decode_workspace_shape(batch, seq_q, seq_k, heads_q: int, heads_kv: int, head_dim: int) -> tuple:
    """(batch, n): the forward's float32 workspace; n = 0 where the split-KV path cannot split, or where
    the batch or a sequence length is symbolic (jax.export): the kernel then runs one split."""
    if heads_q == 0 or not all(isinstance(n, int) for n in (batch, seq_q, seq_k)):
        return (batch, 0)
    rows = heads_q // heads_kv * seq_q
    if rows > _DECODE_MAX_ROWS or batch == 0:
        return (batch, 0)
    blocks_per_batch = heads_kv * -(-rows // 16)  # one per kv head and 16 query rows, per split
    splits = min(_DECODE_MAX_SPLITS, -(-_DECODE_BLOCKS // (batch * blocks_per_batch)),
                 -(-seq_k // _DECODE_TILE_KEYS) // _DECODE_MIN_TILES)
    if splits <= 1:
        return (batch, 0)
    return (batch, blocks_per_batch * splits * 16 * (head_dim + 1))


def _fwd_call(causal, scale, q, k, v):
    """The forward FFI call on whatever shapes it gets: the whole arrays, or one shard of them."""
    _loader.ensure_registered("mha_fwd")
    batch, seq_q, heads_q, head_dim = q.shape
    ws = _decode_workspace_shape(batch, seq_q, k.shape[1], heads_q, k.shape[2], head_dim)
    outs = (jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((batch, heads_q, seq_q), jnp.float32),
            jax.ShapeDtypeStruct(ws, jnp.float32))  # workspace: split-KV partial results
    o, lse, _ = _ffi.ffi_call("ja_mha_fwd", outs, q, k, v, causal=np.bool_(causal), scale=_ffi.f32(scale))
    return o, lse


def _bwd_call(causal, scale, q, k, v, o, do, lse):
    _loader.ensure_registered("mha_bwd")
    outs = (jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(k.shape, k.dtype),
            jax.ShapeDtypeStruct(v.shape, v.dtype),
            jax.ShapeDtypeStruct(q.shape, jnp.float32),      # workspace: dQ accumulator
            jax.ShapeDtypeStruct(lse.shape, jnp.float32))    # workspace: rowsum(dO * O)
    dq, dk, dv, _, _ = _ffi.ffi_call("ja_mha_bwd", outs, q, k, v, o, do, lse, causal=np.bool_(causal),
                                     scale=_ffi.f32(scale))
    return dq, dk, dv


# Sharding: jax_aiter/ops/_attention_sharding.py (the layout of every operand, and the per-shard body).
_FWD = _partition.partitioned(_fwd_call, _attention_sharding.rule(False), _attention_sharding.planner(_fwd_call, False),
                              n_static=2)
_BWD = _partition.partitioned(_bwd_call, _attention_sharding.rule(True), _attention_sharding.planner(_bwd_call, True),
                              n_static=2)


def _first_order_only(f):
    """f with a derivative rule that refuses clearly. First-order reverse mode differentiates neither
    kernel call; grad of grad would differentiate both, and the kernels have no derivative (JAX would
    say "Differentiation rule for 'custom_partitioning' not implemented")."""
    g = jax.custom_jvp(f)

    @g.defjvp
    def _jvp(primals, tangents):
        raise NotImplementedError(
            f"{OP}: higher-order derivatives (grad of grad, hessian, jvp of a gradient) are not supported: "
            "the mha_fwd/mha_bwd kernels have no derivative of their own. Use jax.nn.dot_product_attention "
            "where second derivatives of attention are needed (docs/transformations.md).")
    return g


@cache
def _prims(causal: bool, scale: float):
    """The forward and backward FFI calls for one (causal, scale), batched by folding into batch."""
    def fwd(q, k, v):
        return tuple(_FWD(causal, scale, q, k, v))

    def bwd(q, k, v, o, do, lse):
        return tuple(_BWD(causal, scale, q, k, v, o, do, lse))

    return _first_order_only(_batching.fold_into_batch(fwd)), _first_order_only(_batching.fold_into_batch(bwd))


@partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _flash(q, k, v, causal, scale):
    return _partition.like(_prims(causal, scale)[0](q, k, v)[0], q)


def _flash_fwd(q, k, v, causal, scale):
    o, lse = _prims(causal, scale)[0](q, k, v)
    return _partition.like(o, q), (q, k, v, o, lse)


def _flash_bwd(causal, scale, res, do):
    q, k, v, o, lse = res
    grads = _prims(causal, scale)[1](q, k, v, o, do.astype(o.dtype), lse)
    return tuple(_partition.like(g, p) for g, p in zip(grads, (q, k, v)))


_flash.defvjp(_flash_fwd, _flash_bwd)


def flash_attn_func(q: ArrayLike, k: ArrayLike, v: ArrayLike, causal: bool = False,
                    softmax_scale: float | None = None) -> jax.Array:
    """Attention softmax(q k^T * softmax_scale) v, without materialising the seq_q x seq_k matrix.

    Parameters
    ----------
    q : array_like, shape [batch, seq_q, heads_q, head_dim]
        Queries. float16, bfloat16 or float32; head_dim 32, 64, 96, 128 or 256.
    k, v : array_like, shape [batch, seq_k, heads_kv, head_dim]
        Keys and values, the dtype of q. heads_q must be a multiple of heads_kv
        (grouped-query attention: query head h reads kv head h // (heads_q // heads_kv);
        heads_kv == 1 is multi-query attention).
    causal : bool
        Mask key j for query i unless j <= i + seq_k - seq_q: the mask is aligned to the
        bottom-right corner (as FlashAttention 2 does), so with seq_q < seq_k the last
        query sees every key. A query row that sees no key (causal with seq_q > seq_k,
        or seq_k == 0) outputs 0.
    softmax_scale : float, optional
        Multiplies q k^T; default 1/sqrt(head_dim).

    Returns
    -------
    jax.Array, shape [batch, seq_q, heads_q, head_dim], the dtype of q
        Softmax and accumulation run in float32.

    Notes
    -----
    Inputs are converted with jax.numpy.asarray, so lists and NumPy arrays follow
    jax.numpy's dtype rules (a float64 NumPy array becomes float32 unless jax_enable_x64
    is on, and float64 is refused). Zero-size inputs (batch, seq_q, seq_k or heads 0)
    give a zero-filled output of q's shape and zero gradients, with no kernel call.

    Works under jit, vmap, grad (a custom VJP calling the mha_bwd kernel), remat, scan,
    jax.shard_map (any mix of sharded and replicated q, k, v) and jax.jit with
    NamedSharding inputs under Auto or Explicit mesh axes (batch, heads and the query
    sequence stay sharded; K/V's sequence and a sharded head_dim are gathered), and
    jax.export with symbolic batch and sequence sizes (docs/transformations.md).

    Not supported: forward-mode autodiff (jax.jvp, jax.jacfwd, jax.hessian; JAX raises
    "can't apply forward-mode autodiff (jvp) to a custom_vjp function") and
    higher-order gradients (grad of grad raises NotImplementedError). Use
    jax.nn.dot_product_attention where those are needed.
    """
    q, k, v = (_checks.as_array(OP, name, x) for name, x in (("q", q), ("k", k), ("v", v)))
    scale = _check(q, k, v, causal, softmax_scale)
    if _checks.is_empty(q) or _checks.is_empty(k):
        return jnp.zeros_like(q)  # nothing to attend to: rows that see no key give 0
    q, k, v = _sharding.vary_like(q, k, v)
    return _flash(q, k, v, bool(causal), scale)
