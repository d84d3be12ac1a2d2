"""Which GPU code a library carries (jatools/wheel/device_code.py), and `invoke contents` holding it to the wheel's
lane: a wheel labelled rocm7 whose libraries are CPU builds passed (issue 84), and now is refused.

CUDA: a small library built by nvcc for several archs (one with compressed cubins), read back and compared with what
`cuobjdump --list-elf` lists (skipped, saying why, where nvcc or cuobjdump is missing). ROCm: no hipcc here, so
offload bundles are written as clang's offload bundler lays them out (uncompressed, and "CCOB" compressed with zstd
and with zlib: the documented format), added as a `.hip_fatbin` section to a library g++ builds.
"""
from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import zipfile
import zlib
from pathlib import Path

import pytest
import zstandard
from wheel_plant import rewrite_wheel

from jatools.native.sass_check import SassError, find_tools
from jatools.wheel import device_code, wheel_contents
from jatools.wheel.wheel_scan import read_dynamic

KERNEL = ("__global__ void k(float* x) { x[threadIdx.x] *= 2.0f; }\n"
          "extern \"C\" void run(float* x) { k<<<1, 32>>>(x); }\n")
CUDA_CASES = {
    "four archs": (["-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90a,code=sm_90a",
                    "-gencode", "arch=compute_90,code=sm_90", "-gencode", "arch=compute_120,code=sm_120"],
                   ("sm_120", "sm_80", "sm_90", "sm_90a")),
    "compressed, with PTX": (["-gencode", "arch=compute_100a,code=sm_100a", "-gencode", "arch=compute_100,code=sm_100",
                              "-gencode", "arch=compute_120,code=[sm_120,compute_120]", "-Xfatbin", "-compress-all"],
                             ("compute_120", "sm_100", "sm_100a", "sm_120")),
}


@pytest.mark.parametrize("case", CUDA_CASES)
def test_cuda_archs_are_the_cubins_cuobjdump_lists(tmp_path, case):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("no nvcc on PATH: the CUDA fat-binary reader is checked against an nvcc build (the CI GPU "
                    "images and the compile-only job have one)")
    try:
        cuobjdump, env = find_tools()
    except SassError as e:
        pytest.skip(str(e))
    flags, want = CUDA_CASES[case]
    (tmp_path / "k.cu").write_text(KERNEL)
    lib = tmp_path / "libk.so"
    subprocess.run([nvcc, "-shared", "-Xcompiler", "-fPIC", "-cudart=static", *flags, "k.cu", "-o", str(lib)],
                   cwd=tmp_path, check=True, capture_output=True, timeout=600)
    listed = subprocess.run([cuobjdump, "--list-elf", "--list-ptx", str(lib)], env=env, capture_output=True,
                            text=True, check=True, timeout=120).stdout
    theirs = {f"sm_{m}" for m in re.findall(r"\.sm_(\w+)\.cubin", listed)}
    theirs |= {f"compute_{m}" for m in re.findall(r"\.sm_(\w+)\.ptx", listed)}
    assert read_dynamic(lib).device == {"cuda": want}
    assert set(want) == theirs, listed


def bundle(targets: list[str]) -> bytes:
    """A clang offload bundle: magic, entry count, then (offset, size, id length, id) per entry, then the code."""
    ids = [t.encode() for t in ["host-x86_64-unknown-linux-gnu-", *targets]]
    table = len(device_code.BUNDLE_MAGIC) + 8 + sum(24 + len(i) for i in ids)
    codes = [b"" if i.startswith(b"host") else b"\x7fELF" + bytes(60) for i in ids]
    out, offset = bytearray(device_code.BUNDLE_MAGIC + struct.pack("<Q", len(ids))), table
    for i, code in zip(ids, codes, strict=True):
        out += struct.pack("<QQQ", offset, len(code), len(i)) + i
        offset += len(code)
    return bytes(out + b"".join(codes))


def compressed(raw: bytes, version: int, method: int) -> bytes:
    """A "CCOB" compressed bundle (clang's OffloadBundler.cpp layout for versions 2 and 3)."""
    body = zstandard.ZstdCompressor().compress(raw) if method == device_code.ZSTD else zlib.compress(raw)
    fields = {2: "<IIQ", 3: "<QQQ"}[version]
    header_size = 8 + struct.calcsize(fields)
    return (device_code.COMPRESSED_MAGIC + struct.pack("<HH", version, method)
            + struct.pack(fields, header_size + len(body), len(raw), 0) + body)


def library_with(tmp_path: Path, name: str, section: bytes | None) -> Path:
    """A small shared library (SONAME `name`), with `section` as its .hip_fatbin."""
    src = tmp_path / "x.cpp"
    src.write_text('extern "C" int x() { return 1; }\n')
    plain = tmp_path / f"plain-{name}"
    subprocess.run(["g++", "-shared", "-fPIC", f"-Wl,-soname,{name}", str(src), "-o", str(plain)], check=True,
                   timeout=120)
    if section is None:
        return plain
    (tmp_path / "fatbin.bin").write_bytes(section)
    out = tmp_path / name
    subprocess.run(["objcopy", "--add-section", f".hip_fatbin={tmp_path / 'fatbin.bin'}", str(plain), str(out)],
                   check=True, timeout=120)
    return out


@pytest.mark.parametrize("form", ["bundles", "zstd v2", "zlib v3"])
def test_rocm_archs_are_the_offload_bundles_targets(tmp_path, form):
    one, two = bundle(["hipv4-amdgcn-amd-amdhsa--gfx950"]), bundle(["hipv4-amdgcn-amd-amdhsa--gfx942:xnack-"])
    if form == "bundles":  # two objects' bundles, padded between, as a link of several objects lays them out
        section = one + bytes(4096 - len(one) % 4096) + two
    else:
        version, method = (2, device_code.ZSTD) if form == "zstd v2" else (3, device_code.ZLIB)
        section = compressed(one, version, method) + bytes(64) + compressed(two, version, method)
    lib = library_with(tmp_path, "libx.so", section)
    assert read_dynamic(lib).device == {"rocm": ("gfx942:xnack-", "gfx950")}
    assert device_code.base_arch("gfx942:xnack-") == "gfx942" and device_code.base_arch("sm_90a") == "sm_90"


def test_a_damaged_device_section_is_an_error_not_a_guess(tmp_path):
    lib = library_with(tmp_path, "libx.so", device_code.COMPRESSED_MAGIC + struct.pack("<HH", 9, 0) + bytes(32))
    info = read_dynamic(lib)
    assert info.device == {} and "compressed offload bundle version 9" in info.device_error


def relabelled(wheel: Path, folder: Path, lane: str, backend: str, archs: list[str],
               put: dict[str, bytes] | None = None) -> Path:
    """`wheel` (a CPU lane wheel) under another lane's name: its version, dist-info, identity and file name say
    `lane`, its libraries stay what they are unless `put` replaces some (with their pins)."""
    old_version = wheel.name.split("-")[1]
    new_version = old_version.replace("+cpu", f"+{lane}")
    with zipfile.ZipFile(wheel) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    out = {}
    for n, data in members.items():
        n2 = n.replace(f"jax_aiter-{old_version}.dist-info", f"jax_aiter-{new_version}.dist-info")
        if n.endswith(".dist-info/METADATA"):
            data = data.replace(f"Version: {old_version}".encode(), f"Version: {new_version}".encode())
        if n == "jax_aiter/_build_identity.json":
            ident = json.loads(data)
            ident.update(version=new_version, backend=backend, lane=lane, gpu_archs=archs)
            data = json.dumps(ident, indent=2, sort_keys=True).encode()
        out[n2] = data
    folder.mkdir(parents=True, exist_ok=True)
    staged = folder / "staged.whl"
    with zipfile.ZipFile(staged, "w") as zf:
        for n, data in out.items():
            zf.writestr(n, data)
    return rewrite_wheel(staged, folder / wheel.name.replace(old_version, new_version), put=put or {},
                         repin=True)


def test_faults_contents_refuses_a_rocm7_wheel_of_cpu_libraries(wheels, tmp_path):
    """The probe's wheel: labelled rocm7 (version, identity), libraries built for the CPU."""
    fake = relabelled(wheels["full"].wheel, tmp_path, "rocm7", "rocm", ["gfx950"])
    report = wheel_contents.check_contents(fake)
    assert not report.ok
    for lib in ("librmsnorm_fwd.so", "libmha_fwd.so", "libmha_bwd.so"):
        assert (f"jax_aiter/_lib/{lib} has no rocm GPU code, but the wheel is the rocm7 lane (built for gfx950): a "
                "build for another backend labelled rocm7; rebuild the libraries for the lane (JA_BACKEND=rocm "
                "GPU_ARCHS='gfx950'") in report.message, report.message
    assert wheel_contents.check_contents(wheels["full"].wheel).ok, "the CPU lane's own wheel passes"


def test_faults_contents_refuses_another_backends_code_and_archs_the_lane_does_not_claim(wheels, tmp_path):
    member = "jax_aiter/_lib/librmsnorm_fwd.so"
    rocm_lib = library_with(tmp_path, "librmsnorm_fwd.so", bundle(["hipv4-amdgcn-amd-amdhsa--gfx942"])).read_bytes()
    (tmp_path / "cpu").mkdir()
    cpu = rewrite_wheel(wheels["lite"].wheel, tmp_path / "cpu" / wheels["lite"].wheel.name, put={member: rocm_lib},
                        repin=True)
    msg = wheel_contents.check_contents(cpu).message
    assert f"{member} carries rocm GPU code (gfx942), but the wheel is the cpu lane (backend cpu)" in msg, msg
    rocm = relabelled(wheels["lite"].wheel, tmp_path / "rocm", "rocm7", "rocm", ["gfx950"], put={member: rocm_lib})
    msg = wheel_contents.check_contents(rocm).message
    assert (f"{member} has rocm code for gfx942, but the wheel's identity says gfx950 (none for gfx950) (code for "
            "gfx942, which it does not claim)") in msg, msg
    right = relabelled(wheels["lite"].wheel, tmp_path / "right", "rocm7", "rocm", ["gfx942"], put={member: rocm_lib})
    assert member not in wheel_contents.check_contents(right).message, "code for the lane's archs is its lane's"
