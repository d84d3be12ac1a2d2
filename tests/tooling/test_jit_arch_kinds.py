"""Arch-specific JIT instances (the gpu_sm90a kind of mha_fwd) and the pinned CUTLASS headers (CPU only)."""
from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

from jatools.native import jit_build, jit_modules, jit_ninja, jit_packages, toolchain
from tests.tooling.jit_libs_support import checkout_fixture, settings_for  # noqa: F401  (pytest fixtures)


def _cuda(*archs: str) -> toolchain.Toolchain:
    return toolchain.Toolchain("cuda", cxx="", cxx_version="", gpu_compiler="", archs=archs)


def _mha_fwd(root: Path) -> dict:
    return jit_modules.module_table(settings_for(root))["mha_fwd"]


def test_sm90a_instances_are_built_only_by_a_cuda_build_with_sm_90(checkout):
    module = _mha_fwd(checkout)
    assert "gpu_sm90a" in jit_modules.build_kinds(module, _cuda("sm_90"))
    assert "gpu_sm90a" in jit_modules.build_kinds(module, _cuda("sm_80", "sm_90"))
    assert "gpu_sm90a" not in jit_modules.build_kinds(module, _cuda("sm_80"))
    rocm = toolchain.Toolchain("rocm", cxx="", cxx_version="", gpu_compiler="", archs=("gfx950",))
    assert jit_modules.build_kinds(module, rocm) == ["cpu", "gpu"]


def test_an_unbuilt_arch_kind_still_gets_its_empty_instance_table(checkout, tmp_path):
    module = _mha_fwd(checkout)
    texts, sources = jit_modules.generated("mha_fwd", module, ["cpu", "gpu"], tmp_path, checkout)
    table = tmp_path / "mha_fwd" / "gen" / "mha_fwd_gpu_sm90a_instances.inc"
    assert "gpu_sm90a" not in sources and "JA_INSTANCE" not in texts[table]
    texts, sources = jit_modules.generated("mha_fwd", module, ["cpu", "gpu", "gpu_sm90a"], tmp_path, checkout)
    assert len(sources["gpu_sm90a"]) == len(sources["gpu"]) and texts[table].count("JA_INSTANCE(") == len(sources["gpu"])


def test_sm90a_compiles_replace_the_arch_flags_and_name_the_pin_not_the_path(checkout):
    s = settings_for(checkout)
    tc = _cuda("sm_80", "sm_90")
    flags = toolchain.compile_flags(tc, s)
    sm90a = jit_modules.arch_kind_flags(flags, tc, "gpu_sm90a")
    assert [f for f in sm90a if "generate-code" in f] == ["--generate-code=arch=compute_90a,code=sm_90a"]
    modules = {"mha_fwd": _mha_fwd(checkout)}
    kinds = {"mha_fwd": jit_modules.build_kinds(modules["mha_fwd"], tc)}
    pkgs = jit_packages.package_includes(checkout, modules, kinds, resolve=False)
    pin = jit_packages.package_pin(checkout, "nvidia-cutlass")
    assert pkgs == {"cutlass_include": f"$PKG(nvidia-cutlass=={pin})"}
    srcs = {"mha_fwd": jit_modules.generate("mha_fwd", modules["mha_fwd"], kinds["mha_fwd"], s.jit_dir, checkout)}
    steps = [st for st in jit_ninja.plan(modules, srcs, tc, s, pkgs) if st.rule == "gpu_sm90a"]
    assert steps and all(f"$PKG(nvidia-cutlass=={pin})" in st.extra for st in steps)
    text = jit_ninja.ninja_text(modules, steps, tc, flags, s, None)
    assert "rule gpu_sm90a" in text and "code=sm_80" not in text.split("rule gpu_sm90a")[0].split("gpuflags_gpu_sm90a")[1]


def test_the_cutlass_pin_enters_the_cuda_cache_id_only_where_sm90a_is_built(checkout):
    s = settings_for(checkout)
    before = {a: jit_build.recipe(s, _cuda(a))[0] for a in ("sm_90", "sm_80")}
    py = checkout / "pyproject.toml"
    text = py.read_text()
    pin = jit_packages.package_pin(checkout, "nvidia-cutlass")
    py.write_text(text.replace(f'"nvidia-cutlass=={pin}"', '"nvidia-cutlass==9.9.9"'))
    assert jit_packages.package_pin(checkout, "nvidia-cutlass") == "9.9.9"
    after = {a: jit_build.recipe(s, _cuda(a))[0] for a in ("sm_90", "sm_80")}
    assert after["sm_90"] != before["sm_90"]
    assert after["sm_80"] == before["sm_80"]


def test_an_unpinned_cutlass_is_a_clear_error(checkout):
    py = checkout / "pyproject.toml"
    pin = jit_packages.package_pin(checkout, "nvidia-cutlass")
    py.write_text(py.read_text().replace(f'"nvidia-cutlass=={pin}"', '"nvidia-cutlass>=4"'))
    with pytest.raises(jit_modules.BuildError, match=r"pins no nvidia-cutlass==VERSION"):
        jit_packages.package_pin(checkout, "nvidia-cutlass")


def test_a_missing_or_other_cutlass_fails_the_build_with_the_fix(checkout, monkeypatch):
    pin = jit_packages.package_pin(checkout, "nvidia-cutlass")

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(jit_packages.importlib.metadata, "distribution", missing)
    with pytest.raises(jit_modules.BuildError, match=rf"not installed.*pip install nvidia-cutlass=={pin}"):
        jit_packages.package_include(checkout, "cutlass_include")

    class Other:
        version = "1.0.0"

    monkeypatch.setattr(jit_packages.importlib.metadata, "distribution", lambda name: Other())
    with pytest.raises(jit_modules.BuildError, match=rf"1.0.0 is installed but pyproject.toml pins nvidia-cutlass=={pin}"):
        jit_packages.package_include(checkout, "cutlass_include")


def test_versions_compare_by_release_numbers():
    assert jit_packages._release("4.2.0.0") == jit_packages._release("4.2.0") == jit_packages._release("4.2")
    assert jit_packages._release("4.2.1") != jit_packages._release("4.2.0")
