"""Linking rules of the built libraries, read from the ELF files, and load-order independence."""
from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile

from jax_aiter import _loader

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / os.environ.get("JA_BUILD_DIR", "build")
UMBRELLA_DIR, JIT_DIR = BUILD / "jax_aiter_build", BUILD / "aiter_build"
SHIMS = [spec.shim for spec in _loader.OPS.values()]
JIT_LIBS = sorted({j for spec in _loader.OPS.values() for j in spec.jit})


def dynamic(path: Path) -> dict[str, list[str]]:
    with open(path, "rb") as f:
        elf = ELFFile(f)
        tags: dict[str, list[str]] = {}
        for section in elf.iter_sections():
            if isinstance(section, DynamicSection):
                for tag in section.iter_tags():
                    for key, attr in (("DT_NEEDED", "needed"), ("DT_RUNPATH", "runpath"),
                                      ("DT_RPATH", "rpath"), ("DT_SONAME", "soname")):
                        if tag.entry.d_tag == key:
                            tags.setdefault(key, []).append(getattr(tag, attr))
        return tags


def all_libraries() -> list[Path]:
    libs = [UMBRELLA_DIR / "libjax_aiter.so"] + [JIT_DIR / j for j in JIT_LIBS] + [UMBRELLA_DIR / s for s in SHIMS]
    missing = [str(p) for p in libs if not p.exists()]
    if missing:
        pytest.fail(f"built libraries missing: {', '.join(missing)}; run `nox -s tests` (it builds them) "
                    "or make && python3 jax_aiter/jit/build_jit.py && make ja_mods")
    return libs


@pytest.mark.parametrize("name", ["libjax_aiter.so", *JIT_LIBS, *SHIMS])
def test_soname_runpath_and_no_rpath(name):
    path = next(p for p in all_libraries() if p.name == name)
    tags = dynamic(path)
    assert tags.get("DT_SONAME") == [name]
    assert "DT_RPATH" not in tags, f"{name} uses DT_RPATH; link with --enable-new-dtags"
    for runpath in tags.get("DT_RUNPATH", []):
        for entry in runpath.split(":"):
            assert entry.startswith("$ORIGIN"), f"{name}: RUNPATH entry {entry!r} is not relative to $ORIGIN"
            assert "_rocm_sdk_devel" not in entry


@pytest.mark.parametrize("name", JIT_LIBS)
def test_jit_libraries_need_the_umbrella(name):
    assert "libjax_aiter.so" in dynamic(JIT_DIR / name)["DT_NEEDED"]


@pytest.mark.parametrize("op", sorted(_loader.OPS))
def test_shims_name_their_libraries(op):
    spec = _loader.OPS[op]
    needed = dynamic(UMBRELLA_DIR / spec.shim)["DT_NEEDED"]
    for lib in (*spec.jit, "libjax_aiter.so"):
        assert lib in needed, f"{spec.shim} does not name {lib} in DT_NEEDED ({needed})"


LOAD = """
import ctypes, sys
for path in sys.argv[1:]:
    lib = ctypes.CDLL(path)  # RTLD_LOCAL: no global symbol tricks
    if path.endswith("_ja.so"):
        major, minor = ctypes.c_int(), ctypes.c_int()
        lib.ja_ffi_api_version(ctypes.byref(major), ctypes.byref(minor))
print("ok")
"""


@pytest.mark.parametrize("order", list(itertools.permutations(SHIMS))[::5], ids=lambda o: "-".join(s[:-6] for s in o))
def test_shims_load_in_any_order_in_a_fresh_process(order):
    all_libraries()
    paths = [str(UMBRELLA_DIR / s) for s in order]
    out = subprocess.run([sys.executable, "-c", LOAD, *paths], check=False, capture_output=True, text=True,
                         env={k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"})
    assert out.stdout.strip() == "ok", out.stderr


def test_each_jit_library_loads_alone():
    for lib in JIT_LIBS:
        out = subprocess.run([sys.executable, "-c", LOAD, str(JIT_DIR / lib)], check=False, capture_output=True,
                             text=True)
        assert out.stdout.strip() == "ok", out.stderr
