"""Op tests run once per device: the CPU always, the GPU where JAX sees one (marked `gpu`).

Outputs are poisoned (JA_POISON_OUTPUTS=1): every kernel writes into NaN-filled
buffers, so an element it forgets to write fails the comparison. Tests marked
`gpu` are skipped, with the reason printed by `-ra`, when JAX sees no GPU or the
native libraries are a CPU build.
"""
from __future__ import annotations

import functools

import jax
import pytest


@pytest.fixture(params=["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def device(request, monkeypatch):
    monkeypatch.setenv("JA_POISON_OUTPUTS", "1")
    if request.param == "gpu":
        devices = [d for d in jax.devices() if d.platform != "cpu"]
        if not devices:
            pytest.skip("no GPU visible to JAX (jax.devices() has only CPU devices)")
    else:
        devices = jax.devices("cpu")
    with jax.default_device(devices[0]):
        yield devices[0]


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
