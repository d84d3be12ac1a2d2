"""Upstream jax-aiter's RMSNorm API (`jax_aiter.rmsnorm`): code written against it runs unchanged.

A facade over jax_aiter.ops.rmsnorm: it renames the arguments (gamma for weight, epsilon for eps) and
holds no logic of its own; the kernels, checks, transformations and small-input policy are the op's
(docs/transformations.md). Errors name the op's arguments (weight, eps).
"""
from __future__ import annotations

import jax
from jax.typing import ArrayLike

from jax_aiter.ops import rmsnorm as _op

__all__ = ["rms_norm", "rms_norm_with_add"]


def rms_norm(x: ArrayLike, gamma: ArrayLike, epsilon: float = 1e-6) -> jax.Array:
    """x / sqrt(mean(x**2, axis=-1) + epsilon) * gamma, as jax_aiter.rms_norm(x, gamma, epsilon)."""
    return _op.rms_norm(x, gamma, epsilon)


def rms_norm_with_add(x: ArrayLike, residual: ArrayLike, gamma: ArrayLike,
                      epsilon: float = 1e-6) -> tuple[jax.Array, jax.Array]:
    """(rms_norm(x + residual, gamma, epsilon), x + residual), as jax_aiter.rms_norm_with_add."""
    return _op.rms_norm_with_add(x, residual, gamma, epsilon)
