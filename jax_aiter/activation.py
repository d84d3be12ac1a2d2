"""Upstream jax-aiter's activation API (`jax_aiter.activation`): code written against it runs unchanged.

A facade over jax_aiter.ops.activation: upstream's silu_and_mul(gate, up) takes the two halves as two arrays;
the kernel, checks, gradient, transformations and small-input policy are the op's (docs/transformations.md).
"""
from __future__ import annotations

import jax
from jax.typing import ArrayLike

from jax_aiter.ops import activation as _op

__all__ = ["silu_and_mul"]


def silu_and_mul(gate: ArrayLike, up: ArrayLike) -> jax.Array:
    """silu(gate) * up, differentiable in both, as jax_aiter.silu_and_mul(gate, up)."""
    return _op.silu_and_mul(gate, up)
