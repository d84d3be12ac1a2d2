"""Minimal GPU gate for tests/ops (until the central tests/conftest.py lands).

Tests marked `gpu` are skipped, with the reason printed by `-ra`, when JAX
sees no GPU or the native libraries are a CPU build.
"""
from __future__ import annotations

import functools

import pytest


@functools.lru_cache(maxsize=None)
def gpu_unavailable_reason() -> str | None:
    import jax

    try:
        jax.devices("gpu")
    except RuntimeError as e:
        return f"no GPU visible to JAX ({e})"
    from jax_aiter import _loader

    if _loader.gpu_platform() is None:
        return "the jax_aiter libraries are a CPU build; rebuild with JA_BACKEND=cuda or rocm"
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("gpu") is None:
            continue
        reason = gpu_unavailable_reason()
        if reason:
            item.add_marker(pytest.mark.skip(reason=f"gpu test: {reason}"))
