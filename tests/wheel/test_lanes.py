"""A lane's wheel on the wrong GPU backend: refused before anything loads, naming the lane to install.

JAX's GPU backends are stood in for (jax.devices answering for cuda or rocm): this host has no GPU, and what is
tested is the runtime's decision and its message, on the real loader's path (ensure_registered).
"""
from __future__ import annotations

import jax
import pytest

from jax_aiter import _loader, lane

LANES = {"cuda": "cuda13", "rocm": "rocm7", "cpu": "cpu"}


def identity(backend: str, variant: str = "lite") -> dict:
    label = LANES[backend] + (".full" if variant == "full" else "")
    return {"backend": backend, "lane": LANES[backend], "lanes": LANES, "variant": variant,
            "version": f"0.1.0+{label}"}


def fake_devices(present: set[str]):
    def devices(backend=None):
        if backend in present:
            return [object()]
        raise RuntimeError(f"Unknown backend {backend}")
    return devices


@pytest.mark.parametrize(("backend", "present", "refused"), [
    ("cuda", {"rocm"}, True), ("rocm", {"cuda"}, True),
    ("cuda", {"cuda"}, False), ("rocm", {"rocm"}, False),
    ("cuda", set(), False), ("rocm", set(), False), ("cpu", set(), False),  # every lane carries the CPU kernels
    ("cpu", {"cuda"}, True),
])
def test_the_lane_runs_on_its_backend_or_the_cpu_only(backend, present, refused):
    why = lane.mismatch(identity(backend), present)
    assert (why is not None) == refused, why
    if refused:
        want = min(present)
        assert f"is the {LANES[backend]} lane (built for {backend})" in why
        assert f"pip install --force-reinstall 'jax-aiter==0.1.0+{LANES[want]}'" in why


def test_a_full_wheel_is_told_the_full_lane():
    why = lane.mismatch(identity("rocm", "full"), {"cuda"})
    assert "'jax-aiter==0.1.0+cuda13.full'" in why


def test_the_loader_refuses_before_loading_anything(monkeypatch):
    monkeypatch.setattr(_loader, "build_identity", lambda: identity("rocm"))
    monkeypatch.setattr(jax, "devices", fake_devices({"cuda"}))
    loaded = []
    monkeypatch.setattr(_loader, "_load", lambda path: loaded.append(path))
    monkeypatch.setattr(_loader, "_registered", set())
    with pytest.raises(lane.WrongBackendError, match="rocm7 lane .* JAX runs on cuda GPUs"):
        _loader.ensure_registered("silu_and_mul")
    assert loaded == [], "a library was loaded before the lane was checked"


def test_a_source_checkout_has_no_lane_to_refuse():
    assert lane.check(None, jax) is None
