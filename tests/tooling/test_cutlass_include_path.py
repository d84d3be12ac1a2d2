"""The CUTLASS headers are named at one stable path per checkout, whichever venv installed them (CPU only).

Each nox session installs nvidia-cutlass into its own venv; naming that venv's path on the compile lines made
ninja recompile every sm_90a instance in each session (issue 40)."""
from __future__ import annotations

import os
from pathlib import Path

from jatools.native import jit_packages
from tests.tooling.jit_libs_support import checkout_fixture  # noqa: F401  (pytest fixture)


class _Installed:
    """An installed nvidia-cutlass distribution at `site` (what importlib.metadata.distribution returns)."""

    def __init__(self, site: Path, version: str):
        self.version, self.site = version, site
        inc = site / "cutlass_library/source/include/cute"
        inc.mkdir(parents=True)
        (inc / "tensor.hpp").write_text("// cute\n")

    def locate_file(self, sub: str) -> Path:
        return self.site / sub


def test_two_venvs_get_the_same_include_path_and_the_first_copy_is_kept(checkout, tmp_path, monkeypatch):
    pin = jit_packages.package_pin(checkout, "nvidia-cutlass")
    first, second = _Installed(tmp_path / "venv-a", pin), _Installed(tmp_path / "venv-b", pin)
    monkeypatch.setattr(jit_packages.importlib.metadata, "distribution", lambda name: first)
    a = jit_packages.package_include(checkout, "cutlass_include")
    header = Path(a) / "cute/tensor.hpp"
    os.utime(header, (1_000_000, 1_000_000))
    monkeypatch.setattr(jit_packages.importlib.metadata, "distribution", lambda name: second)
    b = jit_packages.package_include(checkout, "cutlass_include")
    assert a == b
    assert Path(a).is_relative_to(checkout / "build") and f"nvidia-cutlass-{pin}" in a
    assert not Path(a).is_relative_to(tmp_path / "venv-a") and not Path(a).is_relative_to(tmp_path / "venv-b")
    assert header.stat().st_mtime == 1_000_000  # not copied again: ninja sees no newer header
    assert not [p for p in Path(a).parent.iterdir() if p.name.endswith(".tmp")]


def test_an_interrupted_copy_is_not_taken_for_a_finished_one(checkout, tmp_path):
    src = _Installed(tmp_path / "venv", "1").locate_file("cutlass_library/source/include")
    dest = checkout / "build/pkg-include/x-1"
    (dest.parent / f".{dest.name}.{os.getpid()}.tmp").mkdir(parents=True)  # a copy that died half-way
    assert jit_packages.stable_copy(src, dest) == dest
    assert (dest / "cute/tensor.hpp").read_text() == "// cute\n"
