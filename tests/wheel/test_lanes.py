"""A lane's wheel on the wrong GPU backend: refused before anything loads, naming the lane to install; and
`python -m jax_aiter info` flagging, without JAX, a lane that does not fit the host's GPUs.

JAX's GPU backends are stood in for (jax.devices answering for cuda or rocm), and so are the drivers' tools that
`info` asks (nvidia-smi and rocminfo: scripts on PATH printing what they print on an H200 or an MI355 host): this
host has no GPU, and what is tested is the decision and its message, on the real loader's path (ensure_registered)
and through the real `python -m jax_aiter info` of a built wheel.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import jax
import pytest

from jax_aiter import _loader, host_gpus, lane

LANES = {"cuda": "cuda13", "rocm": "rocm7", "cpu": "cpu"}


def identity(backend: str, variant: str = "lite") -> dict:
    label = LANES[backend] + (".full" if variant == "full" else "")
    return {"backend": backend, "lane": LANES[backend], "lanes": LANES, "variant": variant,
            "version": f"0.1.0+{label}"}


def fake_devices(present: set[str]):
    def devices(backend=None):
        if backend in present:
            return [object()]
        raise RuntimeError(f"Unknown backend {backend}")
    return devices


@pytest.mark.parametrize(("backend", "present", "refused"), [
    ("cuda", {"rocm"}, True), ("rocm", {"cuda"}, True),
    ("cuda", {"cuda"}, False), ("rocm", {"rocm"}, False),
    ("cuda", set(), False), ("rocm", set(), False), ("cpu", set(), False),  # every lane carries the CPU kernels
    ("cpu", {"cuda"}, True),
])
def test_the_lane_runs_on_its_backend_or_the_cpu_only(backend, present, refused):
    why = lane.mismatch(identity(backend), present)
    assert (why is not None) == refused, why
    if refused:
        want = min(present)
        assert f"is the {LANES[backend]} lane (built for {backend})" in why
        assert (f"pip install --force-reinstall --extra-index-url <store>/{LANES[want]}/simple "
                f"'jax-aiter==0.1.0+{LANES[want]}'") in why


def test_a_full_wheel_is_told_the_full_lane():
    why = lane.mismatch(identity("rocm", "full"), {"cuda"})
    assert "'jax-aiter==0.1.0+cuda13.full'" in why


def test_the_loader_refuses_before_loading_anything(monkeypatch):
    monkeypatch.setattr(_loader, "build_identity", lambda: identity("rocm"))
    monkeypatch.setattr(jax, "devices", fake_devices({"cuda"}))
    loaded = []
    monkeypatch.setattr(_loader, "_load", lambda path: loaded.append(path))
    monkeypatch.setattr(_loader, "_registered", set())
    with pytest.raises(lane.WrongBackendError, match="rocm7 lane .* JAX runs on cuda GPUs"):
        _loader.ensure_registered("silu_and_mul")
    assert loaded == [], "a library was loaded before the lane was checked"


def test_a_source_checkout_has_no_lane_to_refuse():
    assert lane.check(None, jax) is None


@pytest.mark.parametrize(("built", "gpu", "runs"), [
    ("sm_80", "sm_80", True), ("sm_80", "sm_86", True), ("sm_80", "sm_89", True), ("sm_80", "sm_90", False),
    ("sm_90", "sm_90", True), ("sm_90a", "sm_90", True), ("sm_90a", "sm_91", False), ("sm_100", "sm_103", True),
    ("sm_100", "sm_120", False), ("sm_120", "sm_121", True), ("sm_86", "sm_80", False),
    ("gfx950", "gfx950", True), ("gfx942", "gfx950", False), ("gfx90a:xnack-", "gfx90a", True),
])
def test_which_gpus_an_archs_code_runs_on(built, gpu, runs):
    assert lane.covers(built, gpu) is runs


# nvidia-smi --query-gpu=compute_cap and rocminfo, as an H200 / MI355 host answers (what host_gpus reads)
NVIDIA_SMI = "#!/bin/sh\nprintf '9.0\\n'\n"
ROCMINFO = "#!/bin/sh\nprintf 'Agent 2\\n  Name:                    gfx950\\n'\n"


def host(tmp_path: Path, gpus: str) -> dict[str, str]:
    """An environment whose PATH holds only stand-ins of the drivers' tools for a host with `gpus` (cuda, rocm,
    none), and whose /dev/kfd is there only for rocm (JA_KFD_PATH), so a real GPU of the host running this test
    cannot leak in."""
    bin_dir = tmp_path / f"bin-{gpus}"
    bin_dir.mkdir()
    for tool, text in (("nvidia-smi", NVIDIA_SMI), ("rocminfo", ROCMINFO)):
        if tool.startswith("nvidia") == (gpus == "cuda") and gpus != "none":
            (bin_dir / tool).write_text(text)
            (bin_dir / tool).chmod(0o755)
    kfd = tmp_path / "kfd"
    kfd.touch()
    return {"PATH": str(bin_dir), "JA_KFD_PATH": str(kfd if gpus == "rocm" else tmp_path / "no-kfd")}


def test_the_host_gpus_are_read_from_the_drivers_tools(tmp_path):
    assert host_gpus.present(host(tmp_path, "cuda")) == ({"cuda": ("sm_90",)}, [])
    assert host_gpus.present(host(tmp_path, "rocm")) == ({"rocm": ("gfx950",)}, [])
    assert host_gpus.present(host(tmp_path, "none")) == ({}, [])


def installed_as(wheel: Path, folder: Path, **identity) -> Path:
    """`wheel` unpacked into `folder` (as an install lays it out) with its build identity changed by `identity`."""
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(folder)
    path = folder / "jax_aiter" / "_build_identity.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **identity}, indent=2, sort_keys=True))
    return folder


LANE_CASES = {  # (identity fields, host, flagged, what the line says)
    "rocm7 wheel on a CUDA host": (
        {"backend": "rocm", "lane": "rocm7", "version": "0.1.0+rocm7", "gpu_archs": ["gfx950"]}, "cuda", True,
        "is the rocm7 lane (built for rocm), but this host has cuda GPUs"),
    "cuda13 wheel on a ROCm host": (
        {"backend": "cuda", "lane": "cuda13", "version": "0.1.0+cuda13", "gpu_archs": ["sm_80", "sm_90"]}, "rocm",
        True, "is the cuda13 lane (built for cuda), but this host has rocm GPUs"),
    "cpu wheel on a CUDA host": ({}, "cuda", True, "is the cpu lane (built for cpu), but this host has cuda GPUs"),
    "cuda13 wheel without the host's arch": (
        {"backend": "cuda", "lane": "cuda13", "version": "0.1.0+cuda13", "gpu_archs": ["sm_80", "sm_100"]}, "cuda",
        True, "has cuda code for sm_80, sm_100, but this host's cuda GPUs are sm_90, which none of it runs on"),
    "cuda13 wheel on a CUDA host": (
        {"backend": "cuda", "lane": "cuda13", "version": "0.1.0+cuda13", "gpu_archs": ["sm_80", "sm_90"]}, "cuda",
        False, "host GPUs: cuda sm_90"),
    "rocm7 wheel on a ROCm host": (
        {"backend": "rocm", "lane": "rocm7", "version": "0.1.0+rocm7", "gpu_archs": ["gfx950"]}, "rocm", False,
        "host GPUs: rocm gfx950"),
    "any lane on a CPU-only host": (
        {"backend": "rocm", "lane": "rocm7", "version": "0.1.0+rocm7", "gpu_archs": ["gfx950"]}, "none", False,
        "host GPUs: none found"),
}


@pytest.mark.parametrize("case", LANE_CASES)
def test_faults_info_flags_a_lane_that_does_not_fit_the_hosts_gpus(wheels, tmp_path, case):
    """`python -m jax_aiter info` on a +rocm7 wheel on a CUDA host reported nothing wrong (issue 84): it now lists
    the host's GPUs (no JAX imported) and exits 1 with one line naming the lane, the GPUs and the install command
    when they do not fit; a lane that fits, or a CPU-only host, is no problem."""
    ident, gpus, flagged, says = LANE_CASES[case]
    target = installed_as(wheels["lite"].wheel, tmp_path / "site", **ident)
    (tmp_path / "fetched").mkdir()
    env = {**{k: v for k, v in os.environ.items() if k.startswith(("LANG", "LC_", "HOME"))}, **host(tmp_path, gpus),
           "PYTHONPATH": str(target), "JAX_AITER_LIB_DIR": str(tmp_path / "fetched")}
    out = subprocess.run([sys.executable, "-P", "-m", "jax_aiter", "info"], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120, check=False)
    print(out.stdout, out.stderr)
    assert out.returncode == (1 if flagged else 0), out.stdout + out.stderr
    assert " ".join(says.split()) in " ".join(out.stdout.split()), out.stdout
    problems = [ln for ln in out.stdout.splitlines() if "PROBLEM" in ln]
    assert len(problems) == (1 if flagged else 0), problems
    if flagged and "this host has" in says:
        want = {"cuda": "cuda13", "rocm": "rocm7"}[gpus]
        assert (f"pip install --force-reinstall --extra-index-url <store>/{want}/simple 'jax-aiter==0.1.0+{want}'"
                in problems[0]), problems[0]
    info = json.loads(subprocess.run([sys.executable, "-P", "-m", "jax_aiter", "info", "--json"], env=env,
                                     cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False).stdout)
    assert bool(info["host_gpus"]["lane_problem"]) is flagged
