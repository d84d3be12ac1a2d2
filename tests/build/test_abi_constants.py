"""The Python op's mirrors of the kernels' constants equal their one home in the C headers (issue 81: no unchecked
copy). The op sizes FFI results from them at trace time, before any library is loaded, and names the kernel
families by the C ABI's codes (JaMhaImpl): the families, the largest head dim
(csrc/include/ja/kernels/mha.h), the deterministic backward's sync tile (mha.h), and the split-KV decode path's
sizes (csrc/kernels/mha/decode/sizes.h). A small C++ program compiled here with the host compiler prints the
headers' values; a header changed without its mirror fails here."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from jax_aiter import settings
from jax_aiter.ops import _attn_args, _attn_sizes

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = r"""
#include <cstdio>
#include "ja/kernels/mha.h"
#include "ja/kernels/mha_check.h"
#include "mha/decode/sizes.h"
int main() {
  for (int i = 0; i < JA_MHA_IMPL_COUNT; ++i) std::printf("implementation_%d %s\n", i, ja::mha_impl_name(i));
  std::printf("max_head_dim %d\n", JA_MHA_MAX_HEAD_DIM);
  std::printf("sync_tile_rows %d\n", JA_MHA_SYNC_TILE_ROWS);
  std::printf("decode_max_rows %d\n", JA_MHA_DECODE_MAX_ROWS);
  std::printf("decode_tile_keys %d\n", 16 * JA_MHA_DECODE_WARPS);
  std::printf("decode_min_tiles %d\n", JA_MHA_DECODE_MIN_TILES);
}
"""
MIRRORS = {
    "max_head_dim": (_attn_args, "MAX_HEAD_DIM"),
    "sync_tile_rows": (_attn_sizes, "SYNC_TILE_ROWS"),
    "decode_max_rows": (_attn_sizes, "DECODE_MAX_ROWS"),
    "decode_tile_keys": (_attn_sizes, "DECODE_TILE_KEYS"),
    "decode_min_tiles": (_attn_sizes, "DECODE_MIN_TILES"),
}


def test_every_mirror_equals_its_header(tmp_path):
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no host C++ compiler (g++ or c++) on PATH to read csrc's constants")
    src, exe = tmp_path / "constants.cpp", tmp_path / "constants"
    src.write_text(PROGRAM)
    subprocess.run([cxx, "-std=c++17", f"-I{ROOT / 'csrc/include'}", f"-I{ROOT / 'csrc/kernels'}", str(src),
                    str(ROOT / "csrc/common/errors.cpp"), "-o", str(exe)], check=True, capture_output=True, text=True)
    header = dict(line.split() for line in subprocess.run([str(exe)], check=True, capture_output=True,
                                                          text=True).stdout.splitlines())
    families = [header.pop(f"implementation_{i}") for i in range(len(settings.MHA_IMPLEMENTATIONS))]
    assert families == list(settings.MHA_IMPLEMENTATIONS), (
        f"the C ABI's JaMhaImpl families {families} differ from jax_aiter.settings.MHA_IMPLEMENTATIONS "
        f"{settings.MHA_IMPLEMENTATIONS}: the index of each is its code; change both")
    assert set(header) == set(MIRRORS)
    for name, (module, attr) in MIRRORS.items():
        assert getattr(module, attr) == int(header[name]), (
            f"{module.__name__}.{attr} = {getattr(module, attr)} but the C header says {name} = {header[name]}: "
            f"change both")
