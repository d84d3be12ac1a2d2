"""The mha_fwd / mha_bwd FFI targets called directly with docs/attention.md's operands (its FFI spec)
(below the public API), for
the kernel-level tests (tests/ops/test_attention_kernels.py): optional operands absent are shape-(0,) arrays of
their dtype; outputs are poisoned when JA_POISON_OUTPUTS=1 (jax_aiter/ops/_ffi.py).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jax_aiter import _loader
from jax_aiter.ops import _attn_sizes, _ffi
from jax_aiter.ops._attn_mask import MASK_NONE


def _opt(x, dtype):
    return jnp.zeros((0,), dtype) if x is None else jnp.asarray(x, dtype)


def fwd(q, k, v, *, mask=MASK_NONE, rows=None, alibi=None, bias=None, seed=None, scale, softcap=0.0,
        dropout_p=0.0, ws=0, implementation=0):
    """ja_mha_fwd: (o, lse). implementation: the kernel family's code (JaMhaImpl; 0 automatic)."""
    _loader.ensure_registered("mha_fwd")
    b, sq, hq, _ = q.shape
    outs = (jax.ShapeDtypeStruct((b, sq, hq, v.shape[3]), q.dtype), jax.ShapeDtypeStruct((b, hq, sq), jnp.float32),
            jax.ShapeDtypeStruct((b, ws), jnp.float32))
    o, lse, _ = _ffi.ffi_call("ja_mha_fwd", outs, q, k, v, _opt(rows, jnp.int32), _opt(alibi, jnp.float32),
                              _opt(bias, jnp.float32), _opt(seed, jnp.uint32), mask=np.int32(mask),
                              scale=np.float32(scale), softcap=np.float32(softcap), dropout_p=np.float32(dropout_p),
                              implementation=np.int32(implementation))
    return o, lse


def sync_words(b: int, hq: int, sq: int) -> int:
    return b * hq * -(-sq // _attn_sizes.SYNC_TILE_ROWS)


def bwd(q, k, v, o, do, lse, *, mask=MASK_NONE, rows=None, cols=None, alibi=None, bias=None, seed=None, scale,
        softcap=0.0, dropout_p=0.0, dbias=False, deterministic=False, implementation=0):
    """ja_mha_bwd: (dq, dk, dv, dbias or None). implementation: as fwd's."""
    _loader.ensure_registered("mha_bwd")
    b, sq, hq, _ = q.shape
    sk = k.shape[1]
    f32 = jnp.float32
    outs = (jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(k.shape, k.dtype),
            jax.ShapeDtypeStruct(v.shape, v.dtype),
            jax.ShapeDtypeStruct((b, hq, sq, sk) if dbias else (0,), f32),
            jax.ShapeDtypeStruct(q.shape, f32), jax.ShapeDtypeStruct((b, hq, sq), f32),
            jax.ShapeDtypeStruct((sync_words(b, hq, sq) if deterministic else 0,), jnp.int32))
    dq, dk, dv, db, _, _, _ = _ffi.ffi_call(
        "ja_mha_bwd", outs, q, k, v, o, do, lse, _opt(rows, jnp.int32), _opt(cols, jnp.int32),
        _opt(alibi, f32), _opt(bias, f32), _opt(seed, jnp.uint32), mask=np.int32(mask), scale=np.float32(scale),
        softcap=np.float32(softcap), dropout_p=np.float32(dropout_p), deterministic=np.bool_(deterministic),
        implementation=np.int32(implementation))
    return dq, dk, dv, (db if dbias else None)
