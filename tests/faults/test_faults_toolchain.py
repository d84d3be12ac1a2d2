"""Faults of a host with ROCm's user-space tools and no AMD GPU (Debian's hipcc 5.2 and rocminfo on a build box):
`auto` picked ROCm though its hipcc refuses gfx950, rocminfo's exit 1 stopped the test tiers, and each stage
resolved `auto` again. Stand-in hipcc, nvcc and rocminfo scripts on PATH play the tools (and the hardware we lack);
the real hipcc, where installed, is asked too."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jatools import config
from jatools.native import build as native_build
from jatools.native import toolchain
from jatools.testing import gpu_slots

ROOT = Path(__file__).resolve().parents[2]
GXX = shutil.which("g++") or "g++"

# Debian's hipcc (ROCm 5.2): gfx90a and gfx940, not gfx950 (its clang's answer, word for word)
DEBIAN_HIPCC = """#!/bin/sh
case "$*" in *--version*) echo "HIP version: 5.2.21153-0"; exit 0;; esac
for a in "$@"; do
  case "$a" in
    --offload-arch=gfx90a|--offload-arch=gfx940) ;;
    --offload-arch=*) echo "clang: error: unsupported CUDA gpu architecture: ${a#--offload-arch=}" >&2; exit 1;;
  esac
done
exit 0
"""
# Debian's rocminfo on a host without the amdgpu driver
DEBIAN_ROCMINFO = """#!/bin/sh
echo "ROCk module is NOT loaded, possibly no GPU devices" >&2
exit 1
"""
NVCC = """#!/bin/sh
case "$1" in --version) echo "Cuda compilation tools, release 13.0, V13.0.48"; exit 0;; esac
exit 0
"""


def _host(tmp_path: Path, nvcc: bool) -> dict[str, str]:
    """PATH with Debian-like hipcc and rocminfo (and a stand-in nvcc), no /dev/kfd (JA_KFD_PATH names none)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("hipcc", DEBIAN_HIPCC), ("rocminfo", DEBIAN_ROCMINFO), *((("nvcc", NVCC),) if nvcc else ())):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "CXX": GXX, "JA_KFD_PATH": str(tmp_path / "no-kfd")}


def _settings(tmp_path: Path, **env: str) -> config.Settings:
    s = config.load(env=env)
    return config.Settings(**{**s.__dict__, "raw": {**s.raw, "rocm_legacy_root": str(tmp_path / "no-rocm")}})


@pytest.mark.parametrize("nvcc, chosen", [(True, "cuda"), (False, "cpu")])
def test_faults_auto_passes_by_a_toolchain_that_refuses_its_archs(tmp_path, nvcc, chosen):
    """auto picked ROCm because hipcc was there, and the build failed on gfx950. It now takes the first backend
    whose compiler builds for the archs it would target, and says why it passed the others."""
    env = _host(tmp_path, nvcc)
    tc = toolchain.detect(_settings(tmp_path), env=env)
    assert tc.backend == chosen, tc.how
    why = tc.how[-1]
    assert why.startswith(f"JA_BACKEND=auto resolved to {chosen}"), tc.how
    assert f"GPU arch gfx950 is rejected by {tmp_path}/bin/hipcc: clang: error: unsupported CUDA gpu architecture: " \
           "gfx950" in why, why
    if chosen == "cuda":
        archs = _settings(tmp_path).default_archs("cuda")  # pyproject gpu_archs_cuda, the CUDA lane's archs
        assert tc.archs == archs and f"the first backend that builds for {';'.join(archs)}" in why, why
    else:
        assert "cuda: no nvcc" in why
    assert any("no /" in h and "no AMD GPU driver, so no AMD GPU" in h for h in tc.how), tc.how  # rocminfo not asked
    # GPU_ARCHS it does build for: ROCm, as before
    assert toolchain.detect(_settings(tmp_path, GPU_ARCHS="gfx90a"), env=env).backend == "rocm"


def test_faults_real_debian_hipcc_is_passed_by_under_auto(tmp_path):
    """The real hipcc where it is installed (apt-get install hipcc): what it refuses, auto does not pick."""
    hipcc = shutil.which("hipcc")
    if hipcc is None:
        pytest.skip("no hipcc on PATH (apt-get install hipcc gives Debian's ROCm 5.2 one); the stand-in test covers it")
    env = {**os.environ, "JA_KFD_PATH": str(tmp_path / "no-kfd")}
    refused = toolchain.rocm_arch_refusal(hipcc, "gfx950", {})
    tc = toolchain.detect(_settings(tmp_path), env=env)
    assert (tc.backend == "rocm") == (refused is None), (refused, tc.how)


def test_faults_host_without_kfd_has_no_amd_gpu(tmp_path):
    """rocminfo exits 1 on a host without the amdgpu driver: the test tiers refused to run ('cannot tell which GPUs
    this host has'). Without /dev/kfd there is no AMD GPU, for certain: 0 of them, rocminfo not asked."""
    env = {**_host(tmp_path, nvcc=False), "JA_GPU_LOCK_DIR": str(tmp_path / "locks")}
    gpus = gpu_slots.detect(env)
    assert (gpus.platform, gpus.count) == ("cpu", 0)
    assert gpus.how.startswith(f"no GPU: no {tmp_path / 'no-kfd'}: no AMD GPU driver"), gpus.how
    (tmp_path / "no-kfd").touch()  # with the driver's device, rocminfo's exit 1 is a broken probe again
    with pytest.raises(gpu_slots.GpuSlotError, match="cannot tell which GPUs this host has"):
        gpu_slots.detect(env)
    r = subprocess.run([sys.executable, "-m", "jatools.testing.tiers", "--dry-run"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120, check=False,
                       env={**os.environ, **env, "PYTHONPATH": str(ROOT), "JA_KFD_PATH": str(tmp_path / "none")})
    assert r.returncode == 0, r.stderr


def test_faults_one_run_resolves_auto_once(tmp_path, monkeypatch):
    """Each stage resolved auto again (a toolchain that appeared mid-run made the JIT stage CUDA and ja_mods ROCm).
    The native sequence resolves it once and every step runs with the answer."""
    env = {**_host(tmp_path, nvcc=True), "JA_BACKEND": "auto", "JA_ROOT_DIR": str(ROOT)}
    monkeypatch.setenv("JA_ROOT_DIR", str(ROOT))
    monkeypatch.setattr(config, "load", lambda *a, _load=config.load, **k: _no_rocm(_load(*a, **k), tmp_path))
    steps = native_build.native_steps(jit="build", env=env)
    assert [s.name for s in steps] == ["umbrella", "jit", "ja_mods"]
    archs = ";".join(config.load(env=env).default_archs("cuda"))
    assert {(s.env["JA_BACKEND"], s.env["GPU_ARCHS"]) for s in steps} == {("cuda", archs)}
    explicit = native_build.native_steps(jit="build", env={**env, "JA_BACKEND": "cpu"})
    assert {s.env["JA_BACKEND"] for s in explicit} == {"cpu"} and "GPU_ARCHS" not in explicit[0].env


def _no_rocm(s: config.Settings, tmp_path: Path) -> config.Settings:
    return config.Settings(**{**s.__dict__, "raw": {**s.raw, "rocm_legacy_root": str(tmp_path / "no-rocm")}})


def test_faults_make_jit_builds_for_the_backend_config_mk_resolved(tmp_path):
    """`make jit` (nox -s jit): make resolves auto once, into build/config.mk, and the JIT step is told the answer
    instead of resolving it again."""
    from tests.build.scratch import env_for, make_scratch

    root = make_scratch(tmp_path / "repo")
    env = {**env_for(root), "JA_BACKEND": "auto", "PYTHON": sys.executable}
    r = subprocess.run(["make", "-n", "jit"], cwd=root, env=env, capture_output=True, text=True, timeout=300,
                       check=False)
    assert r.returncode == 0, r.stderr
    cfg = dict(line.split(" := ", 1) for line in (root / "build" / "config.mk").read_text().splitlines()
               if " := " in line)
    jit = [line for line in r.stdout.splitlines() if "jatools.native.jit_build" in line]
    assert jit == [(f"JA_BACKEND={cfg['JA_BACKEND_RESOLVED']} GPU_ARCHS='{cfg['GPU_ARCHS_RESOLVED']}' {sys.executable} "
                   "-m jatools.native.jit_build ")], (jit, r.stdout)
