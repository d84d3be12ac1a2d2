"""pytest plugin: the one place that skips tests the visible hardware cannot run.

Markers (registered in pyproject.toml): ``gpu`` needs a GPU JAX can see;
``cuda_only`` / ``rocm_only`` need that GPU platform; ``multigpu(devices=N)``
needs N devices (default 2). Each skip prints its reason (``-ra``). JAX is
imported only when a marked test is set up, so tooling tests run without it
and GPU slot pinning (jatools.testing.pytest_gpu_slot) happens before any import.
"""
from __future__ import annotations

import functools

import pytest

MULTIGPU_DEFAULT_DEVICES = 2
FORCE_CPU_DEVICES_HINT = ("on the CPU run `JA_TEST_TIER=multigpu bash ci/test.sh` (it sets "
                          "XLA_FLAGS=--xla_force_host_platform_device_count=4 before JAX starts)")


def required_devices(item: pytest.Item) -> int | None:
    """N from @pytest.mark.multigpu(devices=N), or None for a test without the marker."""
    mark = item.get_closest_marker("multigpu")
    if mark is None:
        return None
    n = mark.kwargs.get("devices", mark.args[0] if mark.args else MULTIGPU_DEFAULT_DEVICES)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise pytest.UsageError(f"{item.nodeid}: multigpu(devices=...) needs a positive int, got {n!r}")
    return n


@functools.cache
def _devices(platform: str | None) -> tuple[list, str]:
    """(devices, why-empty) for a JAX platform name (None: the default backend)."""
    try:
        import jax
    except ImportError as e:
        return [], f"JAX is not importable ({e})"
    try:
        return (jax.devices(platform) if platform else jax.devices()), ""
    except RuntimeError as e:
        return [], f"JAX has no {platform} backend (default backend: {jax.default_backend()}; {str(e).splitlines()[0]})"


def skip_reason(item: pytest.Item) -> str | None:
    """Why this test cannot run here, or None."""
    for marker, platform, label in (("gpu", "gpu", "a GPU"), ("cuda_only", "cuda", "a CUDA GPU"),
                                    ("rocm_only", "rocm", "a ROCm GPU")):
        if item.get_closest_marker(marker):
            devs, why = _devices(platform)
            if not devs:
                return f"{marker}: needs {label}; {why}"
    need = required_devices(item)
    if need is not None:
        devs, why = _devices(None)
        if len(devs) < need:
            seen = f"JAX sees {len(devs)} ({devs[0].platform})" if devs else why
            hint = f"; {FORCE_CPU_DEVICES_HINT}" if not devs or devs[0].platform == "cpu" else ""
            return f"multigpu: needs {need} devices, {seen}{hint}"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        required_devices(item)  # a malformed marker fails the run at collection, not at setup


def pytest_runtest_setup(item: pytest.Item) -> None:
    reason = skip_reason(item)
    if reason:
        # Reported at the test's location (as a skip marker is), not at this hook's line.
        raise pytest.skip.Exception(reason, _use_item_location=True)
