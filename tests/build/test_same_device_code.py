"""jatools/native/same_device_code.py on code nvcc compiles here: a header moved to another folder (its include
path and line markers change) leaves the device code the same; a changed constant, a changed instruction or a
kernel gone are named, with the arch; files with no device code and builds of other targets are input errors."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from jatools.native import same_device_code as sdc
from jatools.native import sass_check

ARCHS = ("-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90a,code=sm_90a")

HEADER = r"""
#pragma once
__constant__ float kTable[4] = {1.0f, 2.0f, 3.0f, 4.0f};
template <int N> __device__ float scaled(float x) { return x * N + kTable[N & 3]; }
"""
KERNELS = r"""
#include "{include}"
template <int N> __global__ void scale_kernel(float* x) {{ x[threadIdx.x] = scaled<N>(x[threadIdx.x]); }}
template __global__ void scale_kernel<2>(float*);
template __global__ void scale_kernel<3>(float*);
{extra}
"""


def _tools() -> None:
    if shutil.which("nvcc") is None:
        pytest.skip("no nvcc on PATH: nothing here compiles device code to compare")
    try:
        sass_check.find_tools()
    except sass_check.SassError as e:
        pytest.skip(f"{e} (installed in the tier sessions' venvs: nox -s tests)")


def _build(root: Path, folder: str, header: str = HEADER, extra: str = "") -> Path:
    """kernels.cu including its header from root/folder, compiled for sm_80 and sm_90a into root/out/kernels.o."""
    (root / folder).mkdir(parents=True, exist_ok=True)
    (root / folder / "scaled.cuh").write_text(header)
    src = root / "kernels.cu"
    src.write_text(KERNELS.format(include=f"{folder}/scaled.cuh", extra=extra))
    (root / "out").mkdir(exist_ok=True)
    obj = root / "out" / "kernels.o"
    subprocess.run(["nvcc", "-std=c++17", "-O3", *ARCHS, f"-I{root}", "-c", str(src), "-o", str(obj)], check=True,
                   capture_output=True, text=True)
    return obj


def test_a_moved_header_is_the_same_device_code_and_changes_are_named(tmp_path, capsys):
    _tools()
    base = _build(tmp_path / "base", "mha")
    moved = _build(tmp_path / "moved", "mha/sm90/common")
    assert sdc.main([str(base.parent), str(moved.parent)]) == sdc.EXIT_SAME
    out = capsys.readouterr().out
    assert "same device code: yes" in out and "kernels.o: same device code" in out

    constant = _build(tmp_path / "constant", "mha", HEADER.replace("4.0f}", "5.0f}"))
    code = _build(tmp_path / "code", "mha", HEADER.replace("x * N", "x * (N + 1)"))
    fewer = _build(tmp_path / "fewer", "mha", extra="__global__ void extra_kernel(float* x) { x[0] = 1; }")
    (d_constant,) = sdc.compare(base, constant)
    assert d_constant.changed == ["sm_80 .nv.constant3", "sm_90a .nv.constant3"] and not d_constant.added
    (d_code,) = sdc.compare(base, code)
    assert {k.split(" ")[0] for k in d_code.changed} == {"sm_80", "sm_90a"}
    assert all(".text._Z12scale_kernel" in k for k in d_code.changed), d_code.changed
    (d_fewer,) = sdc.compare(fewer, base)
    assert any(k.startswith("sm_90a .text._Z12extra_kernel") for k in d_fewer.removed), d_fewer.removed
    assert sdc.main([str(base), str(code)]) == sdc.EXIT_DIFFERENT
    out = capsys.readouterr().out
    assert "DIFFERENT device code" in out and "scale_kernel" in out and "H200" in out


def test_inputs_that_cannot_be_compared_are_named(tmp_path, capsys):
    _tools()
    base = _build(tmp_path / "base", "mha")
    host = tmp_path / "host"
    host.mkdir()
    (host / "kernels.cpp").write_text("int f() { return 1; }\n")
    subprocess.run(["g++", "-c", str(host / "kernels.cpp"), "-o", str(host / "kernels.o")], check=True)
    assert sdc.main([str(base), str(host / "kernels.o")]) == sdc.EXIT_INPUT
    assert "holds no device code" in capsys.readouterr().err
    (tmp_path / "other").mkdir()
    shutil.copy(base, tmp_path / "other" / "renamed.o")
    assert sdc.main([str(base.parent), str(tmp_path / "other")]) == sdc.EXIT_INPUT
    assert "hold different files (kernels.o, renamed.o)" in capsys.readouterr().err
    assert sdc.main([str(tmp_path / "missing"), str(base.parent)]) == sdc.EXIT_INPUT
    assert "does not exist" in capsys.readouterr().err
