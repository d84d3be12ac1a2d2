"""jax-aiter: fused GPU kernels for JAX through XLA FFI.

The ops are imported lazily, so tooling such as ``python -m jax_aiter info``
and ``jax-aiter-fetch-mha`` starts without importing JAX. Type checkers see
the ops' real signatures through the ``TYPE_CHECKING`` imports below.

A program that uses the ops registers their FFI handlers on first use. A
program that only runs an exported computation (``jax.export.deserialize``)
never calls an op, so it calls :func:`register` first.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from jax_aiter import op_table

if TYPE_CHECKING:  # the same names as _LAZY (a test keeps them equal); `as` marks a re-export (PEP 484)
    from jax_aiter.ops.activation import silu_and_mul as silu_and_mul
    from jax_aiter.ops.attention import flash_attn_func as flash_attn_func
    from jax_aiter.ops.export import disabled_checks as disabled_checks
    from jax_aiter.ops.export import register as register
    from jax_aiter.ops.rmsnorm import rms_norm as rms_norm
    from jax_aiter.ops.rmsnorm import rms_norm_with_add as rms_norm_with_add

# name -> its module: the ops' public functions come from the op table (`api`), then the export helpers.
_LAZY = {**op_table.public_api(op_table.load()),
         "register": "jax_aiter.ops.export", "disabled_checks": "jax_aiter.ops.export"}

# upstream jax-aiter's facade modules (jax_aiter/rmsnorm.py ...): importable as jax_aiter.<name>, and reachable as
# an attribute after a bare `import jax_aiter`, as upstream's __init__ imports them (loaded on first use here)
_SUBMODULES = ("rmsnorm",)

__all__ = sorted(_LAZY)  # noqa: PLE0605 (built from _LAZY, the one list of the public names)


def __getattr__(name: str):
    if name == "__version__":  # derived (jax_aiter/_version.py): its one home is pyproject.toml
        from jax_aiter._version import version

        globals()[name] = value = version()
        return value
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f"jax_aiter.{name}")
    raise AttributeError(f"module 'jax_aiter' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_LAZY) + list(_SUBMODULES))
