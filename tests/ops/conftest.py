"""Op tests run once per device: the CPU always, the GPU where JAX sees one (marked `gpu`).

Outputs are poisoned (JA_POISON_OUTPUTS=1): every kernel writes into NaN-filled
buffers, so an element it forgets to write fails the comparison.

JAX is imported inside the fixture, not at module level: the xdist controller
loads this conftest too, and it never runs a test, so importing JAX there
(about a second) would only delay the start of every worker.
"""
from __future__ import annotations

import pytest


@pytest.fixture(params=["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def device(request, monkeypatch):
    import jax

    monkeypatch.setenv("JA_POISON_OUTPUTS", "1")
    if request.param == "gpu":
        devices = [d for d in jax.devices() if d.platform != "cpu"]
        if not devices:
            pytest.skip("no GPU visible to JAX (jax.devices() has only CPU devices)")
    else:
        devices = jax.devices("cpu")
    with jax.default_device(devices[0]):
        yield devices[0]
