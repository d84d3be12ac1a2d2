"""Environment report with stand-in rocminfo / nvidia-smi / rocm-sdk / hipcc (hardware and toolchains we lack)."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from jatools.ci import env_report

ROOT = Path(__file__).resolve().parents[2]

ROCMINFO = """ROCk module is loaded
=====================
HSA Agents
==========
*******
Agent 1
*******
  Name:                    AMD EPYC 9575F 64-Core Processor
  Marketing Name:          AMD EPYC 9575F 64-Core Processor
  Device Type:             CPU
*******
Agent 2
*******
  Name:                    gfx950
  Uuid:                    GPU-1234
  Marketing Name:          AMD Instinct MI355X
  Device Type:             GPU
*******
Agent 3
*******
  Name:                    gfx950
  Marketing Name:          AMD Instinct MI355X
  Device Type:             GPU
"""


def fake_tool(folder: Path, name: str, stdout: str, code: int = 0) -> None:
    path = folder / name
    path.write_text(f"#!/bin/sh\ncat <<'JA_EOF'\n{stdout}\nJA_EOF\nexit {code}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def tools(tmp_path: Path) -> Path:
    """A PATH folder with stand-ins, plus the system's basics (sh, cat, g++, lscpu)."""
    b = tmp_path / "bin"
    b.mkdir()
    fake_tool(b, "rocminfo", ROCMINFO)
    fake_tool(b, "rocm-sdk", "7.14.0")  # `rocm-sdk path --root` prints the same; only the version is read here
    fake_tool(b, "hipcc", "HIP version: 7.14.25391-abc\nAMD clang version 20.0.0")
    fake_tool(b, "nvidia-smi", "0, NVIDIA H200, 580.65.06, 143771 MiB\n1, NVIDIA H200, 580.65.06, 143771 MiB")
    fake_tool(b, "nvcc", "Cuda compilation tools, release 13.0, V13.0.48")
    return b


def env_with(tools: Path) -> dict[str, str]:
    return {"PATH": f"{tools}:/usr/bin:/bin", "JA_BACKEND": "rocm", "GPU_ARCHS": "gfx950"}


def test_parse_rocminfo_keeps_gpu_agents_only() -> None:
    assert env_report.parse_rocminfo(ROCMINFO) == [{"arch": "gfx950", "name": "AMD Instinct MI355X"}] * 2


def test_parse_nvidia_smi() -> None:
    rows = env_report.parse_nvidia_smi("0, NVIDIA H200, 580.65.06, 143771 MiB\n")
    assert rows == [{"index": 0, "name": "NVIDIA H200", "driver": "580.65.06", "memory": "143771 MiB"}]


def test_collect_with_stand_in_tools(tools: Path) -> None:
    r = env_report.collect(env=env_with(tools))
    assert r["gpus"]["count"] == 4
    assert [g["arch"] for g in r["gpus"]["rocm"]] == ["gfx950", "gfx950"]
    assert r["gpus"]["cuda"][1]["name"] == "NVIDIA H200"
    t = r["toolchains"]
    assert t["rocm_sdk_version"] == "7.14.0"
    assert t["hipcc"] == {"path": str(tools / "hipcc"), "version": "7.14.25391-abc"}
    assert t["nvcc"]["version"] == "13.0"
    assert t["cxx"].startswith("g++ ")
    assert r["env"] == {"JA_BACKEND": "rocm", "GPU_ARCHS": "gfx950"}
    text = env_report.render(r)
    assert "gpus      4: gfx950 AMD Instinct MI355X; gfx950 AMD Instinct MI355X; [0] NVIDIA H200" in text
    assert "rocm-sdk version 7.14.0" in text


def test_no_gpu_and_failing_rocminfo_are_reported_not_raised(tmp_path: Path) -> None:
    b = tmp_path / "bin"
    b.mkdir()
    r = env_report.collect(env={"PATH": f"{b}:/usr/bin:/bin"}, which=lambda n, path=None: None)
    assert r["gpus"]["count"] == 0 and "no GPU" in r["gpus"]["notes"][0]
    assert r["cpu"]["lscpu"] is None
    fake_tool(b, "rocminfo", "Failed to get user name to check for video group membership", code=1)
    r = env_report.collect(env={"PATH": f"{b}:/usr/bin:/bin"})
    assert r["gpus"]["rocm"] is None and "/dev/kfd" in r["gpus"]["notes"][0]


def test_python_packages_of_another_interpreter() -> None:
    info = env_report.python_info(sys.executable)
    assert info["executable"] and info["python"].count(".") == 2
    assert all(name.startswith(env_report.PACKAGE_PREFIXES) for name in info["packages"])


def test_invoke_task_prints_text_and_writes_json(tools: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    env = {**os.environ, **env_with(tools)}
    r = subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(ROOT), "env-report", "--json-out", str(out)],
                       check=False, cwd=tmp_path, capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("== environment report ==")
    assert json.loads(out.read_text())["gpus"]["count"] == 4
