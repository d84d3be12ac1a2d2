"""ci/gpu/h200_ci_jobs.sh as far as a CPU host takes it: the offline index, a fresh venv with the lane's full wheel,
and the tier run against that installed wheel (jatools.testing.tiers --installed), never the checkout's package.

A stand-in nvidia-smi answers the script's `nvidia-smi -L` (this host has no GPU); the lane is the CPU build's
and the tier runs on the CPU platform, on a few tests (LANE, TIER_PLATFORM, TIER_ARGS: the script's hooks for
this). On the H200 the same script runs the CUDA lane's wheel through the CUDA tier (docs/ci.md).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "ci" / "gpu" / "h200_ci_jobs.sh"


def _run(tmp_path: Path, wheels: Path) -> subprocess.CompletedProcess:
    stand_in = tmp_path / "bin"
    stand_in.mkdir()
    (stand_in / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: stand-in H200 (UUID: GPU-0)'\n")
    (stand_in / "nvidia-smi").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JA_", "PIP_", "UV_"))}
    env.update(PATH=f"{stand_in}:{env['PATH']}", PYTHON=sys.executable, LANE="cpu", TIER_PLATFORM="cpu",
               TIER_ARGS="tests/ops/test_activation.py -k test_vmap_matches_per_example")
    return subprocess.run(["bash", str(SCRIPT), str(wheels), str(tmp_path / "out")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1800, check=False)


@pytest.mark.slow
def test_the_tier_runs_against_the_installed_lane_wheel(wheels, tmp_path):
    carried = tmp_path / "wheels"
    carried.mkdir()
    shutil.copy2(wheels["full"].wheel, carried)
    out = _run(tmp_path, carried)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    tier = json.loads((tmp_path / "out" / "tier-pr.json").read_text())
    installed = tier["gpu"]["installed"]
    assert installed["version"] == wheels["full"].version and installed["lane"] == "cpu"
    assert "/lane-venv/" in installed["file"] and not Path(installed["file"]).is_relative_to(ROOT), \
        "the tests imported the checkout's jax_aiter"
    assert "--- lane-tier: exit 0" in out.stdout and "all steps passed" in out.stdout
    assert f"jax-aiter {wheels['full'].version} (full, lane cpu)" in out.stdout  # `python -m jax_aiter info`


@pytest.mark.slow
def test_without_the_lane_wheel_it_says_which_one_to_copy(tmp_path):
    empty = tmp_path / "wheels"
    empty.mkdir()
    out = _run(tmp_path, empty)
    assert out.returncode == 1
    assert "no lane wheel (jax_aiter-*+cpu.full-*.whl)" in out.stdout and "nox -s release" in out.stdout
