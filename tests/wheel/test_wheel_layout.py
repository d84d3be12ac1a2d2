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
    assert (layout.lib_member("x.so") == "jax_aiter/_lib/x.so"
            == f"{_loader.PACKAGED_LIB_DIR.relative_to(_loader.PACKAGE_DIR.parent).as_posix()}/x.so")
    assert layout.identity_file == _loader.IDENTITY_FILE.relative_to(_loader.PACKAGE_DIR.parent).as_posix()


def test_versions_name_the_lane_then_the_variant():
    layout = Layout.load()
    cuda, rocm = layout.lane("cuda"), layout.lane("rocm")
    assert (cuda.name, rocm.name, layout.lane("cpu").name) == ("cuda13", "rocm7", "cpu")
    names = {layout.variant(v).version("0.1.0", lane) for v in ("lite", "full") for lane in (cuda, rocm)}
    assert names == {"0.1.0+cuda13", "0.1.0+cuda13.full", "0.1.0+rocm7", "0.1.0+rocm7.full"}, "lanes share a version"
    assert layout.variant("source").version("0.1.0", cuda) == "0.1.0", "a source build keeps the sdist's version"
    for version, variant, lane in (("0.1.0+cuda13.full", "full", "cuda13"), ("0.1.0+rocm7", "lite", "rocm7"),
                                   ("0.1.0", "source", None)):
        assert layout.variant_for_version(version).name == variant
        assert (layout.lane_for_version(version) or None) == (layout.lanes.get({"cuda13": "cuda", "rocm7": "rocm"}
                                                                               .get(lane, "")) if lane else None)
    with pytest.raises(LayoutError, match="unknown wheel variant 'medium'"):
        layout.variant("medium")
    with pytest.raises(LayoutError, match="local label 'cu12'"):
        layout.variant_for_version("0.1.0+cu12")
    with pytest.raises(LayoutError, match="no lane for backend 'tpu'"):
        layout.lane("tpu")


def test_external_allowlist_is_per_backend():
    layout = Layout.load()
    assert layout.external_allowed("libstdc++.so.6", "cpu")
    assert (layout.external_allowed("libamdhip64.so.7", "rocm")
            and not layout.external_allowed("libamdhip64.so.7", "cpu"))
    assert layout.external_allowed("libcudart.so.12", "cuda") and not layout.external_allowed("libcudart.so.12", "rocm")
    assert not layout.external_allowed("libz.so.1", "rocm")
