"""Attention dropout's random draw in jax.numpy: the same Philox4x32-10 bits as the kernels.

The kernels decide whether element (batch b, query head h, row i, key j) of the probabilities is kept
with ja::mha_dropout_keep (csrc/include/ja/kernels/mha_features.h): the Philox4x32-10 block of counter
(j // 4, i, h + head offset, b + batch offset) under the 64-bit key (seed[0], seed[1]) gives four
32-bit words, word j % 4 is u, and the element is kept iff u >= floor(p * 2^32). The draw is a pure
function of those indices, so the backward recomputes the forward's mask and the CPU and the GPUs agree.

This module writes the same function in jax.numpy, for what has to see the mask outside a kernel:
`return_attn_probs` (the probabilities with dropped elements negated, as FlashAttention returns them)
and the tests, which compare it with the C++ definition bit for bit (tests/ops/test_attention_definitions.py).
It also turns a jax.random key into the kernels' seed operand.

JAX without x64 has no uint64, so the 32x32 -> 64-bit products of the Philox round are written in 16-bit
halves (mulhilo below); every operation is on uint32, where XLA wraps as C++ does.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

_U32 = jnp.uint32
_M0, _M1 = 0xD2511F53, 0xCD9E8D57     # Philox4x32 multipliers
_W0, _W1 = 0x9E3779B9, 0xBB67AE85     # Weyl key increments
ROUNDS = 10


def mulhilo(a: jax.Array, b: int) -> tuple[jax.Array, jax.Array]:
    """(high, low) 32-bit words of the 64-bit product of uint32 a and the constant b."""
    lo = a * _U32(b)
    a0, a1 = a & _U32(0xFFFF), a >> _U32(16)
    b0, b1 = _U32(b & 0xFFFF), _U32(b >> 16)
    mid1 = a1 * b0 + ((a0 * b0) >> _U32(16))         # < 2^32: (2^16 - 1)^2 + 2^16
    mid2 = a0 * b1 + (mid1 & _U32(0xFFFF))            # < 2^32 likewise
    hi = a1 * b1 + (mid1 >> _U32(16)) + (mid2 >> _U32(16))
    return hi, lo


def philox4x32(c0, c1, c2, c3, k0, k1) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Philox4x32-10 of the counter (c0, c1, c2, c3) under the key (k0, k1), all uint32 (broadcast together)."""
    c0, c1, c2, c3, k0, k1 = (jnp.asarray(x, _U32) for x in (c0, c1, c2, c3, k0, k1))
    for r in range(ROUNDS):
        if r > 0:
            k0, k1 = k0 + _U32(_W0), k1 + _U32(_W1)
        hi0, lo0 = mulhilo(c0, _M0)
        hi1, lo1 = mulhilo(c2, _M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


def threshold(p: float) -> int:
    """floor(p * 2^32) for p in [0, 1), computed as the kernels compute it (p rounded to float32 first, then
    multiplied in double precision: mha_dropout_threshold)."""
    import numpy as np

    return int(float(np.float32(p)) * 4294967296.0)


def keep_mask(seed: jax.Array, p: float, batch: int, heads: int, seq_q: int, seq_k: int) -> jax.Array:
    """bool [batch, heads, seq_q, seq_k]: which probabilities survive dropout with probability p.

    `seed` is the kernels' uint32 [4] operand (key lo, key hi, batch offset, head offset)."""
    seed = jnp.asarray(seed, _U32)
    blocks = -(-seq_k // 4)
    b = jnp.arange(batch, dtype=_U32)[:, None, None, None] + seed[2]
    h = jnp.arange(heads, dtype=_U32)[None, :, None, None] + seed[3]
    i = jnp.arange(seq_q, dtype=_U32)[None, None, :, None]
    jb = jnp.arange(blocks, dtype=_U32)[None, None, None, :]
    words = jnp.stack(philox4x32(jb, i, h, b, seed[0], seed[1]), axis=-1)  # [b, h, sq, blocks, 4]
    u = words.reshape(batch, heads, seq_q, blocks * 4)[..., :seq_k]
    return u >= _U32(threshold(p))


def seed_from_key(key: jax.Array) -> jax.Array:
    """The kernels' uint32 [4] seed operand from a jax.random key (typed, or a legacy uint32 [2] key): two
    words drawn from the key (jax.random.bits, whatever the key's implementation), then the batch and head
    offsets, 0 for a whole array (a shard adds its own: jax_aiter/ops/attention.py's partition rule)."""
    words = jax.random.bits(key, (2,), _U32)
    return jnp.concatenate([words, jnp.zeros((2,), _U32)])
