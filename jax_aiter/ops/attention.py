"""Flash attention through the mha_fwd / mha_bwd FFI kernels, with a custom VJP.

Every feature of docs/attention.md goes through the same two kernel calls (the FFI spec there):
masks given row by row (causal, sliding windows, varlen batches, segment ids: _attn_mask.py),
softcap, ALiBi, an additive bias (with its gradient), dropout (the kernels' Philox draw:
_attn_dropout.py), head dims 1-256 with head_dim_v of its own, the row log-sum-exp and a
deterministic backward. This module turns the user's arguments into those operands
(`attend`, checked by _attn_args.py), wraps the two calls in a custom VJP, and gives them
their vmap and sharding rules.

The forward kernel returns the output and the row log-sum-exp (lse, float32 [batch, heads_q,
seq_q]); lse stays inside the VJP residuals, where the backward kernel uses it to recompute the
softmax instead of storing it. When the caller also takes lse (return_lse) and differentiates
through it, its cotangent dlse adds P * dlse to the score's gradient, which the backward kernel
cannot give (its dS sums to 0 over each row): two more kernel calls do (_lse_grad). The backward
kernel also takes float32 workspace buffers (the dQ accumulator, rowsum(dO * O), the deterministic ordering words),
and the forward one (the split-KV decode path's partial results); they are extra FFI results
that XLA allocates and this module drops.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from functools import cache, partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name
from jax.custom_derivatives import SymbolicZero
from jax.typing import ArrayLike

from jax_aiter import _loader
from jax_aiter.ops import (
    _attention_sharding,
    _attn_args,
    _attn_dropout,
    _attn_fp8,
    _attn_mask,
    _attn_mask_ops,
    _attn_probs,
    _attn_shapes,
    _attn_sizes,
    _batching,
    _checks,
    _ffi,
    _partition,
    _sharding,
)

OP = "flash_attn_func"
# The names of the forward's residuals, for jax.checkpoint's policies (jax.checkpoint_policies.save_only_these_names and
# its kin): a policy that saves both keeps the forward out of the gradient's recomputation (docs/transformations.md).
RESIDUAL_NAMES = ("attention_out", "attention_lse")


@dataclass(frozen=True)
class Config:
    """The static arguments of one call's two kernels (hashable: the custom VJP's and the partitioner's key). The
    optional operands a call is given follow from it: rows (and cols) with the ROWS mask, the seed with dropout,
    ALiBi and the bias when flagged; the others are (0,) placeholders."""
    mask: int                # _attn_mask.MASK_NONE / MASK_CAUSAL / MASK_ROWS
    scale: float
    softcap: float
    dropout_p: float
    deterministic: bool
    alibi: bool = False
    bias: bool = False
    dbias: bool = False      # the backward writes the bias's gradient
    impl: int = 0            # the forward's kernel family (JaMhaImpl: _attn_args.implementation); 0 automatic

    @property
    def rows(self) -> bool:
        return self.mask == _attn_mask.MASK_ROWS

    @property
    def dropout(self) -> bool:
        return self.dropout_p > 0


_PLACEHOLDER_DTYPES = {"rows": jnp.int32, "alibi": jnp.float32, "bias": jnp.float32, "seed": jnp.uint32}


def _placeholder(name: str) -> jax.Array:
    """An absent optional operand: shape (0,) of its dtype, as the FFI spec passes it."""
    return jnp.zeros((0,), _PLACEHOLDER_DTYPES[name])


# The calls pass every operand and attribute of the FFI spec (docs/attention.md): rows, ALiBi, bias, seed (a
# (0,) placeholder where absent); mask, scale, softcap, dropout_p, deterministic. Which head dims and features a
# backend runs is the kernels' to say: the FFI handlers refuse what no instance takes, naming it.


def _optional(cfg: Config, rows, cols, alibi, bias, seed) -> tuple:
    """The optional operands of a call: those the Config has, and fresh (0,) placeholders for the others, made
    here in the per-shard body. (A placeholder made outside and carried into a shard_map's backward as a residual
    makes XLA's CPU compiler crash (jax 0.11.2) when it reaches the custom call.)"""
    own = lambda has, x, name: x if has else _placeholder(name)
    return (own(cfg.rows, rows, "rows"), own(cfg.rows, cols, "rows"), own(cfg.alibi, alibi, "alibi"),
            own(cfg.bias, bias, "bias"), own(cfg.dropout, seed, "seed"))


def _attrs(cfg: Config, backward: bool) -> dict:
    """The attributes both kernels take."""
    impl = _attn_args.backward_implementation(cfg.impl) if backward else cfg.impl
    return {"mask": np.int32(cfg.mask), "scale": _ffi.f32(cfg.scale), "softcap": _ffi.f32(cfg.softcap),
            "dropout_p": _ffi.f32(cfg.dropout_p), "implementation": np.int32(impl)}


def _fwd_call(cfg: Config, q, k, v, rows, alibi, bias, seed):
    """The forward FFI call on whatever shapes it gets: the whole arrays, or one shard of them."""
    _loader.ensure_registered("mha_fwd")
    batch, seq_q, heads_q, _ = q.shape
    dv = v.shape[3]
    ws = _attn_sizes.decode_workspace_shape(batch, seq_q, k.shape[1], heads_q, k.shape[2], dv)
    outs = (jax.ShapeDtypeStruct((batch, seq_q, heads_q, dv), q.dtype),
            jax.ShapeDtypeStruct((batch, heads_q, seq_q), jnp.float32),
            jax.ShapeDtypeStruct(ws, jnp.float32))  # workspace: split-KV partial results
    rows, _, alibi, bias, seed = _optional(cfg, rows, None, alibi, bias, seed)
    o, lse, _ = _ffi.ffi_call("ja_mha_fwd", outs, q, k, v, rows, alibi, bias, seed, **_attrs(cfg, False))
    return o, lse


def _bwd_call(cfg: Config, q, k, v, o, do, lse, rows, cols, alibi, bias, seed):
    _loader.ensure_registered("mha_bwd")
    batch, seq_q, heads_q, _ = q.shape
    f32 = jnp.float32
    # The deterministic GPU backward orders its dQ updates with one int32 word per query tile (SYNC_TILE_ROWS).
    sync = batch * heads_q * -(-seq_q // _attn_sizes.SYNC_TILE_ROWS) if cfg.deterministic else 0
    outs = (jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(k.shape, k.dtype),
            jax.ShapeDtypeStruct(v.shape, v.dtype),
            jax.ShapeDtypeStruct((batch, heads_q, seq_q, k.shape[1]) if cfg.dbias else (0,), f32),  # dbias
            jax.ShapeDtypeStruct(q.shape, f32),              # workspace: dQ accumulator
            jax.ShapeDtypeStruct(lse.shape, f32),            # workspace: rowsum(dO * O)
            jax.ShapeDtypeStruct((sync,), jnp.int32))        # workspace: the deterministic dQ order
    dq, dk, dv, dbias, _, _, _ = _ffi.ffi_call("ja_mha_bwd", outs, q, k, v, o, do, lse,
                                               *_optional(cfg, rows, cols, alibi, bias, seed), **_attrs(cfg, True),
                                               deterministic=np.bool_(cfg.deterministic))
    # Without a bias gradient: a fresh (0,) array, replicated as the sharding rules declare it, not the call's
    # (0,) result (which varies over a shard_map's manual axes like the call's operands).
    return dq, dk, dv, (dbias if cfg.dbias else jnp.zeros((0,), f32))


# Sharding: jax_aiter/ops/_attention_sharding.py (the layout of every operand, and the per-shard body).
_FWD = _partition.partitioned(_fwd_call, _attention_sharding.rule(False), _attention_sharding.planner(_fwd_call, False),
                              n_static=1)
_BWD = _partition.partitioned(_bwd_call, _attention_sharding.rule(True), _attention_sharding.planner(_bwd_call, True),
                              n_static=1)


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


def _kinds(cfg: Config, backward: bool):
    """fold_into_batch's operand kinds: q, k, v (o, dO, lse) carry the batch; rows, cols, ALiBi and the bias
    have 1 or the batch; the seed and every absent operand's placeholder have none."""
    b, r, s = _batching.BATCH, _batching.ROWS, _batching.SHARED
    rows = r if cfg.rows else s
    return (b,) * (6 if backward else 3) + ((rows, rows) if backward else (rows,)) + (
        r if cfg.alibi else s, r if cfg.bias else s, s)


@cache
def _prims(cfg: Config):
    """The forward and backward FFI calls of one configuration, batched by folding into batch."""
    def fwd(*args):
        return tuple(_FWD(cfg, *args))

    def bwd(*args):
        return tuple(_BWD(cfg, *args))

    b, s = _batching.BATCH, _batching.SHARED
    return (_first_order_only(_batching.fold_into_batch(fwd, _kinds(cfg, False), (b, b))),
            _first_order_only(_batching.fold_into_batch(bwd, _kinds(cfg, True), (b, b, b, b if cfg.dbias else s))))


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _flash(cfg: Config, q, k, v, rows, alibi, bias, seed):
    o, lse = _prims(cfg)[0](q, k, v, rows, alibi, bias, seed)
    return _partition.like(o, q), lse  # Explicit axes: the output keeps q's sharding, as plain JAX's does


def _flash_fwd(cfg: Config, q, k, v, rows, alibi, bias, seed):
    """Primals arrive as CustomVJPPrimal (symbolic zeros): `perturbed` says whether the bias needs a gradient
    (the residuals' marker: () it does, None it does not)."""
    args = [a.value for a in (q, k, v, rows, alibi, bias, seed)]
    o, lse = _prims(cfg)[0](*args)
    o, lse = checkpoint_name(o, RESIDUAL_NAMES[0]), checkpoint_name(lse, RESIDUAL_NAMES[1])
    # absent operands are not residuals (None): a zero-size residual crossing jax.shard_map crashed XLA's SPMD
    # partitioner (JAX 0.11, CPU); the backward makes its own placeholders
    given = [a if a.shape != (0,) else None for a in args]
    return (_partition.like(o, args[0]), lse), (*given, o, lse, () if cfg.bias and bias.perturbed else None)


def _flash_bwd(cfg: Config, res, cts):
    q, k, v, rows, alibi, bias, seed, o, lse, mark = res
    rows, alibi, bias, seed = (_placeholder(n) if x is None else x for n, x in
                               (("rows", rows), ("alibi", alibi), ("bias", bias), ("seed", seed)))
    do, dlse = cts
    cfg = replace(cfg, dbias=mark is not None)
    cols = _attn_mask_ops.cols(rows, k.shape[1]) if cfg.rows else _placeholder("rows")
    do = jnp.zeros_like(o) if isinstance(do, SymbolicZero) else do.astype(o.dtype)
    dq, dk, dv, dbias = _prims(cfg)[1](q, k, v, o, do, lse, rows, cols, alibi, bias, seed)
    if not isinstance(dlse, SymbolicZero):
        dq2, dk2, dbias2 = _lse_grad(cfg, q, k, lse, dlse, rows, cols, alibi, bias)
        dq, dk = (dq.astype(jnp.float32) + dq2).astype(q.dtype), (dk.astype(jnp.float32) + dk2).astype(k.dtype)
        dbias = dbias if dbias2 is None else dbias + dbias2
    dbias = _partition.like(_sum_to(dbias, bias.shape), bias) if cfg.dbias else None
    return (*(_partition.like(g, p) for g, p in zip((dq, dk, dv), (q, k, v))), None, None, dbias, None)


def _lse_grad(cfg: Config, q, k, lse, dlse, rows, cols, alibi, bias):
    """The gradient through lse: d lse / d s = P, so dS = P * dlse (module docstring). The backward kernel cannot
    give it (its dS sums to 0 over each row), so without softcap and a bias gradient two kernel calls do:
    dq_i = scale * dlse_i * sum_j P_ij k_j is the forward with v = k, and dk_j = scale * sum_i P_ij dlse_i q_i is
    the backward's dV with dO = dlse * q (dV = P^T dO). With softcap (whose derivative differs per score) or a
    bias gradient (dbias = dS itself), P is materialised in jax.numpy instead. Returns float32 (dq, dk, dbias or
    None); lse is the softmax's normaliser before dropout, so no dropout here."""
    f32 = jnp.float32
    w = jnp.swapaxes(dlse.astype(f32), 1, 2)[..., None]                    # [b, sq, hq, 1]
    if cfg.softcap or cfg.dbias:
        return _lse_grad_materialised(cfg, q, k, dlse, rows, alibi, bias)
    cfg0 = replace(cfg, dropout_p=0.0)
    seed = _placeholder("seed")
    mean_k, _ = _prims(cfg0)[0](q, k, k, rows, alibi, bias, seed)            # sum_j P_ij k_j
    do = (w * q.astype(f32)).astype(q.dtype)
    _, _, p_t_do, _ = _prims(cfg0)[1](q, k, k, jnp.zeros_like(q), do, lse, rows, cols, alibi, bias, seed)
    return cfg.scale * w * mean_k.astype(f32), cfg.scale * p_t_do.astype(f32), None


# float32 products in float32 (XLA's default on a GPU rounds their inputs to TF32: 1e-4 relative errors in the
# lse's gradient, against the kernels' float32 accumulation)
_EXACT = jax.lax.Precision.HIGHEST


def _lse_grad_materialised(cfg: Config, q, k, dlse, rows, alibi, bias):
    p = _attn_probs.probabilities(q, k, mask=cfg.mask, rows=rows if cfg.rows else None, scale=cfg.scale,
                                  softcap=cfg.softcap, alibi=alibi if cfg.alibi else None,
                                  bias=bias if cfg.bias else None, seed=None, dropout_p=0.0)
    ds = p * dlse.astype(jnp.float32)[..., None]                             # [b, hq, sq, sk]
    hq, hkv = q.shape[2], k.shape[2]
    qf, kf = q.astype(jnp.float32), jnp.repeat(k, hq // hkv, axis=2).astype(jnp.float32)
    dz = ds
    if cfg.softcap:
        t = jnp.tanh(jnp.einsum("bqhd,bkhd->bhqk", qf, kf, precision=_EXACT) * cfg.scale / cfg.softcap)
        dz = ds * (1.0 - t * t)
    dq = cfg.scale * jnp.einsum("bhqk,bkhd->bqhd", dz, kf, precision=_EXACT)
    dk = cfg.scale * jnp.einsum("bhqk,bqhd->bkhd", dz, qf, precision=_EXACT)
    dk = dk.reshape(*k.shape[:3], hq // hkv, k.shape[3]).sum(3)
    return dq, dk, (ds if cfg.dbias else None)


def _sum_to(g, shape):
    """The kernel's dbias [batch, heads_q, seq_q, seq_k] summed over the bias's broadcast axes (1 in `shape`)."""
    axes = tuple(i for i in (0, 1) if shape[i] == 1 and g.shape[i] != 1)
    return jnp.sum(g, axis=axes, keepdims=True) if axes else g


_flash.defvjp(_flash_fwd, _flash_bwd, symbolic_zeros=True)


# --- the public functions --------------------------------------------------------------------------------

def _default_key(op: str, p: float):
    warnings.warn(
        f"{op}: dropout_p={p} without dropout_key: jax.random.key(0) is used, so every call draws the same "
        "dropout mask (every step, every layer). Pass dropout_key=jax.random.key(...) split per step and layer "
        "(docs/attention.md, Dropout).", UserWarning, stacklevel=4)
    return jax.random.key(0)


def attend(q: ArrayLike, k: ArrayLike, v: ArrayLike, *, causal: bool = False, softmax_scale: float | None = None,
           dropout_p: float = 0.0, window_size=(-1, -1), bias: ArrayLike | None = None,
           alibi_slopes: ArrayLike | None = None, softcap: float = 0.0, segment_ids: ArrayLike | None = None,
           cu_seqlens_q: ArrayLike | None = None, cu_seqlens_kv: ArrayLike | None = None, max_seqlen_q: int = 0,
           max_seqlen_k: int = 0, deterministic: bool = False, dropout_key=None, return_lse: bool = False,
           return_probs: bool = False, q_descale: ArrayLike | None = None, k_descale: ArrayLike | None = None,
           v_descale: ArrayLike | None = None, implementation: str | None = None, op: str = OP):
    """Attention with every feature: (out, lse or None, probabilities or None). The one implementation behind
    flash_attn_func and the upstream facades (jax_aiter/mha.py), which translate their conventions to it;
    the arguments are flash_attn_func's (docs/attention.md). float8_e4m3fn q, k and v with their descales run FP8
    attention (_attn_fp8.py)."""
    q, k, v = (_checks.as_array(op, name, x) for name, x in (("q", q), ("k", k), ("v", v)))
    descales = {"q_descale": q_descale, "k_descale": k_descale, "v_descale": v_descale}
    if _attn_fp8.is_fp8(q, k, v):
        return _attn_fp8.attend(op, q, k, v, descales, implementation=implementation, causal=causal,
                                softmax_scale=softmax_scale, dropout_p=dropout_p, window_size=window_size,
                                softcap=softcap, cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv,
                                max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, return_lse=return_lse,
                                unsupported={"bias": bias, "alibi_slopes": alibi_slopes, "segment_ids": segment_ids,
                                             "return_attn_probs": return_probs or None})
    _attn_fp8.refuse_descales(op, q, descales)
    for name, x in (("q", q), ("k", k), ("v", v)):
        _checks.check_dtype(op, name, x)
    _checks.check_same_dtype(op, "q", q, "k", k), _checks.check_same_dtype(op, "q", q, "v", v)
    causal, deterministic = (_attn_args.check_bool(op, n, x) for n, x in (("causal", causal),
                                                                          ("deterministic", deterministic)))
    impl = _attn_args.implementation(op, implementation)
    window = _attn_args.window(op, window_size)
    p = _attn_args.dropout_p(op, dropout_p)
    cap = _attn_args.softcap(op, softcap)
    max_q, max_k = _attn_shapes.max_seqlens(op, max_seqlen_q, max_seqlen_k)
    varlen = _attn_shapes.varlen(op, cu_seqlens_q, cu_seqlens_kv, segment_ids)
    q, k, v, packed = _attn_shapes.layout(op, q, k, v, varlen)
    _attn_shapes.check(op, q, k, v)
    (batch, seq_q, heads_q, head_dim), seq_k, dv = q.shape, k.shape[1], v.shape[3]
    scale = _checks.check_scale(op, softmax_scale, _attn_args.default_scale(head_dim))

    mask, rows = _mask_rows(op, (batch, seq_q, seq_k), causal, window, segment_ids,
                            (cu_seqlens_q, cu_seqlens_kv, max_q, max_k) if varlen else None)
    alibi = None if alibi_slopes is None else _attn_args.alibi(op, alibi_slopes, batch, heads_q)
    bias_f32 = None if bias is None else _attn_args.bias(op, bias, batch, heads_q, seq_q, seq_k)
    seed = _dropout_seed(op, p, dropout_key)
    if head_dim == 0:  # every score is 0 before the other terms: a zero column gives the same attention
        q, k = (jnp.pad(x, ((0, 0), (0, 0), (0, 0), (0, 1))) for x in (q, k))

    empty = _checks.is_empty(q) or _checks.is_empty(k) or _checks.is_empty(v)
    if empty:  # no kernel call: rows that see no key give 0 (lse +inf)
        out = jnp.zeros((batch, seq_q, heads_q, dv), q.dtype)
        lse = jnp.full((batch, heads_q, seq_q), jnp.inf, jnp.float32)
    else:
        cfg = Config(mask, scale, cap, p, deterministic, alibi=alibi is not None, bias=bias_f32 is not None,
                     impl=impl)
        q, k, v, alibi, bias_f32 = _vary(q, k, v, alibi, bias_f32)
        operands = [x if x is not None else _placeholder(n) for n, x in
                    (("rows", rows), ("alibi", alibi), ("bias", bias_f32), ("seed", seed))]
        out, lse = _flash(cfg, q, k, v, *operands)
    probs = None
    if return_probs:
        probs = (jnp.zeros((batch, heads_q, seq_q, seq_k), jnp.float32) if empty else
                 _attn_probs.probabilities(q, k, mask=mask, rows=rows, scale=scale, softcap=cap, alibi=alibi,
                                           bias=bias_f32, seed=seed, dropout_p=p))
    if packed:
        out, lse, probs = out[0], lse[0], None if probs is None else probs[0]
    return out, (lse if return_lse else None), probs


def _dropout_seed(op: str, p: float, dropout_key):
    """The kernels' dropout seed (uint32 [4]) from the call's key (a fixed one, with a warning, when none is given);
    None without dropout."""
    if p <= 0:
        return None
    key = _default_key(op, p) if dropout_key is None else _attn_args.dropout_key(op, dropout_key)
    return _attn_dropout.seed_from_key(key)


def _mask_rows(op: str, shape, causal: bool, window, segment_ids, varlen) -> tuple:
    """(mask, rows): the kernels' mask for a call of (batch, seq_q, seq_k): varlen's (cu_seqlens_q, cu_seqlens_kv,
    max_seqlen_q, max_seqlen_k), or segment_ids, or the dense causal/window mask (rows None where NONE or CAUSAL
    says it all)."""
    batch, seq_q, seq_k = shape
    if varlen is not None:
        cu_seqlens_q, cu_seqlens_kv, max_q, max_k = varlen
        cu_q, cu_k = _attn_shapes.cu_seqlens_pair(op, cu_seqlens_q, cu_seqlens_kv, seq_q, seq_k, max_q, max_k)
        return _attn_mask.MASK_ROWS, _attn_mask.varlen_rows(cu_q, cu_k, seq_q, seq_k, causal, window)
    if segment_ids is not None:
        ids = _attn_args.segment_ids(op, segment_ids, batch, seq_q, seq_k)
        return _attn_mask.MASK_ROWS, _attn_mask_ops.segment_rows(ids, causal, window)
    mask, rows = _attn_mask.dense_mask(seq_q, seq_k, causal, window)
    return mask, None if rows is None else jnp.asarray(rows)


def _vary(q, k, v, alibi, bias):
    """q, k, v and the float operands cast to vary alike inside shard_map (a replicated bias's gradient is then
    summed over the shards, as a replicated K/V's is)."""
    given = [x for x in (alibi, bias) if x is not None]
    out = list(_sharding.vary_like(q, k, v, *given))
    it = iter(out[3:])
    return (*out[:3], None if alibi is None else next(it), None if bias is None else next(it))


def flash_attn_func(q: ArrayLike, k: ArrayLike, v: ArrayLike, causal: bool = False,
                    softmax_scale: float | None = None, *, dropout_p: float = 0.0,
                    window_size: tuple[int, int] = (-1, -1), bias: ArrayLike | None = None,
                    alibi_slopes: ArrayLike | None = None, softcap: float = 0.0,
                    segment_ids: ArrayLike | None = None, cu_seqlens_q: ArrayLike | None = None,
                    cu_seqlens_kv: ArrayLike | None = None, deterministic: bool = False,
                    dropout_key: jax.Array | None = None, q_descale: ArrayLike | None = None,
                    k_descale: ArrayLike | None = None, v_descale: ArrayLike | None = None,
                    implementation: str | None = None) -> jax.Array:
    """Attention softmax(q k^T * softmax_scale + terms) v, without materialising the seq_q x seq_k matrix.

    Parameters
    ----------
    q : array_like, shape [batch, seq_q, heads_q, head_dim]
        Queries. float16, bfloat16 or float32; head_dim 0 to 256. With cu_seqlens, packed:
        [total_q, heads_q, head_dim] (or [1, total_q, heads_q, head_dim]).
    k : array_like, shape [batch, seq_k, heads_kv, head_dim]
        Keys, the dtype of q. heads_q must be a multiple of heads_kv (grouped-query
        attention: query head h reads kv head h // (heads_q // heads_kv)).
    v : array_like, shape [batch, seq_k, heads_kv, head_dim_v]
        Values; head_dim_v (0 to 256) may differ from head_dim.
    causal : bool
        Key j is visible to query i only if j <= i + seq_k - seq_q: aligned to the
        bottom-right corner, as FlashAttention 2 does. Equivalent to window_size[1] = 0.
    softmax_scale : float, optional
        Multiplies q k^T; default 1/sqrt(head_dim).
    dropout_p : float
        Probability in [0, 1) of dropping each attention probability (the kept ones are
        scaled by 1/(1 - dropout_p)); the mask is a pure function of dropout_key and the
        element's (batch, head, row, key), so the backward and every backend draw the same.
    window_size : (int, int)
        (left, right), -1 unbounded: query i sees keys [d - left, d + right] where
        d = i + seq_k - seq_q (each sequence's own in a packed batch).
    bias : array_like, optional
        Added to the scores: [seq_q, seq_k] or broadcastable to [batch, heads_q, seq_q,
        seq_k]; differentiable (the gradient sums over the broadcast axes).
    alibi_slopes : array_like, optional
        [heads_q] or [batch, heads_q]: the score of query i and key j gets
        -slope * |i + seq_k - seq_q - j|. Not differentiated.
    softcap : float
        > 0: scores pass through softcap * tanh(s / softcap) (Gemma 2); 0 turns it off.
    segment_ids : array_like, optional
        int [batch, seq] (seq_q == seq_k): a run of equal ids is one document; a
        query sees only keys of its own document (then causal and window apply within it).
    cu_seqlens_q, cu_seqlens_kv : array_like, optional
        int [num_sequences + 1], the running totals of the packed sequences' lengths
        (varlen): sequence s is rows [cu[s], cu[s + 1]) of the packed q (and of k, v).
    deterministic : bool
        True: the backward's gradients are bitwise identical run after run.
    dropout_key : jax.random key, optional
        The dropout draw's seed (needed with dropout_p > 0: without it a fixed key is
        used, with a warning).
    q_descale, k_descale, v_descale : array_like, float32 [1] or [batch, heads_kv], optional
        FP8 attention: with float8_e4m3fn q, k and v (all three), each is required; an
        element stands for element * descale (it multiplies). The output is bfloat16;
        causal, window_size, softcap, GQA and cu_seqlens work, forward only
        (docs/serving.md, "FP8 attention").
    implementation : str, optional
        The kernel family that runs the call: "sm90" (Hopper wgmma + TMA), "mma"
        (mma.sync), "decode" (split-KV, few query rows per kv head), "simt" (every
        feature, any dtype) on the GPU; "cpu" on the CPU. None (the default, or
        JA_MHA_IMPLEMENTATION) chooses automatically. A family that cannot run the call
        refuses it, naming why; it never falls back to another (docs/attention.md).

    Returns
    -------
    jax.Array, shape [batch, seq_q, heads_q, head_dim_v] (packed: [total_q, heads_q,
    head_dim_v]), the dtype of q. Softmax and accumulation run in float32. A query
    that sees no key outputs 0. The lse and the probabilities: jax_aiter.mha.flash_attn_func
    (return_lse, return_attn_probs).

    Notes
    -----
    docs/attention.md has every argument's shapes and backends; docs/transformations.md
    how each composes with jit, grad, vmap, remat, scan, shard_map, sharding and export.
    Not supported: forward-mode autodiff and grad of grad (clear errors); use
    jax.nn.dot_product_attention where those are needed.
    """
    return attend(q, k, v, causal=causal, softmax_scale=softmax_scale, dropout_p=dropout_p,
                  window_size=window_size, bias=bias, alibi_slopes=alibi_slopes, softcap=softcap,
                  segment_ids=segment_ids, cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv,
                  deterministic=deterministic, dropout_key=dropout_key, q_descale=q_descale, k_descale=k_descale,
                  v_descale=v_descale, implementation=implementation)[0]
