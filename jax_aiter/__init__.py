"""jax-aiter: fused GPU kernels for JAX through XLA FFI.

The ops are imported lazily, so tooling such as ``python -m jax_aiter info``
and ``jax-aiter-fetch-mha`` starts without importing JAX.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

_LAZY = {
    "rms_norm": "jax_aiter.ops.rmsnorm",
    "rms_norm_with_add": "jax_aiter.ops.rmsnorm",
    "silu_and_mul": "jax_aiter.ops.activation",
    "flash_attn_func": "jax_aiter.ops.attention",
}

__all__ = sorted(_LAZY)  # noqa: PLE0605 (built from _LAZY, the one list of the public names)


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'jax_aiter' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_LAZY))
