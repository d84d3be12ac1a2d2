"""The layout data (jatools/wheel/wheel_layout.toml) agrees with the runtime loader and with itself."""
from __future__ import annotations

import pytest

from jatools.wheel.wheel_layout import Layout, LayoutError
from jax_aiter import _loader


def test_layout_matches_the_loader_table():
    layout = Layout.load()
    shims = {spec.shim for spec in _loader.OPS.values()}
    jit = {j for spec in _loader.OPS.values() for j in spec.jit}
    full = set(layout.variant("full").libraries)
    assert full == shims | jit | {_loader.UMBRELLA}, "every library the loader looks for is in the full wheel"
    assert set(layout.variant("lite").libraries) == full - set(_loader.MHA_JIT_LIBS)
    assert set(layout.variant("lite").fetched) == set(_loader.MHA_JIT_LIBS)
    assert layout.lib_member("x.so") == "jax_aiter/_lib/x.so" == f"{_loader.PACKAGED_LIB_DIR.relative_to(_loader.PACKAGE_DIR.parent).as_posix()}/x.so"
    assert layout.identity_file == _loader.IDENTITY_FILE.relative_to(_loader.PACKAGE_DIR.parent).as_posix()


def test_versions_and_variants():
    layout = Layout.load()
    assert layout.variant("lite").version("0.1.0") == "0.1.0"
    assert layout.variant("full").version("0.1.0") == "0.1.0+full"
    assert layout.variant_for_version("0.1.0+full").name == "full"
    assert layout.variant_for_version("0.1.0").name == "lite"
    with pytest.raises(LayoutError, match="unknown wheel variant 'medium'"):
        layout.variant("medium")
    with pytest.raises(LayoutError, match="local label 'cu12'"):
        layout.variant_for_version("0.1.0+cu12")


def test_external_allowlist_is_per_backend():
    layout = Layout.load()
    assert layout.external_allowed("libstdc++.so.6", "cpu")
    assert layout.external_allowed("libamdhip64.so.7", "rocm") and not layout.external_allowed("libamdhip64.so.7", "cpu")
    assert layout.external_allowed("libcudart.so.12", "cuda") and not layout.external_allowed("libcudart.so.12", "rocm")
    assert not layout.external_allowed("libz.so.1", "rocm")
