"""ci/gpu/h200_ci_jobs.sh as far as a CPU host takes it: the offline index, then jatools.lane_tier (what CI's
pr_gpu_cuda_h200 runs as `nox -s tests_lane`): a fresh venv with the full wheel a green release report vouches for,
and the tier run against that installed wheel (jatools.testing.tiers --installed), never the checkout's package.

A stand-in nvidia-smi answers the script's `nvidia-smi -L` (this host has no GPU); the lane is the CPU build's
and the tier runs on the CPU platform, on a few tests (LANE, TIER_PLATFORM, TIER_ARGS: the script's hooks for
this). The release report is written here in `nox -s release`'s format for the fixture's wheels (a release run,
clean room and all, is tests/release/test_release.py's); on the H200 the same script runs the CUDA lane's wheel
and the report `nox -s release` wrote for it through the CUDA tier (docs/ci.md).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jatools import release
from jax_aiter.integrity import sha256_file

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "ci" / "gpu" / "h200_ci_jobs.sh"


def _run(tmp_path: Path, wheels: Path) -> subprocess.CompletedProcess:
    stand_in = tmp_path / "bin"
    stand_in.mkdir(exist_ok=True)
    (stand_in / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: stand-in H200 (UUID: GPU-0)'\n")
    (stand_in / "nvidia-smi").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JA_", "PIP_", "UV_"))}
    env.update(PATH=f"{stand_in}:{env['PATH']}", PYTHON=sys.executable, LANE="cpu", TIER_PLATFORM="cpu",
               TIER_ARGS="--workers 1 -k test_vmap_matches_per_example")  # the whole suite collected
    return subprocess.run(["bash", str(SCRIPT), str(wheels), str(tmp_path / f"out-{wheels.name}")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1800, check=False)


def _carry(folder: Path, wheels, ok: bool = True, lane: str = "cpu") -> Path:
    """The lane's files and a release report for them, as `nox -s release` leaves them in dist/."""
    folder.mkdir()
    stages = []
    for variant in ("lite", "full"):
        wheel = Path(shutil.copy2(wheels[variant].wheel, folder))
        stages.append({"name": f"wheel_{variant}", "result": "ok" if ok else "failed", "artifacts": [
            {"path": f"dist/{wheel.name}", "sha256": sha256_file(wheel), "size": wheel.stat().st_size}]})
    (folder / Path(release.REPORT).name).write_text(json.dumps({
        "schema": release.SCHEMA, "kind": "jax-aiter-release", "commit": "0" * 40, "dirty": False, "ok": ok,
        "stages": stages, "wheels": [a for s in stages for a in s["artifacts"]], "lane": lane}))
    return folder


@pytest.mark.slow
def test_the_tier_runs_against_the_installed_lane_wheel(wheels, tmp_path):
    out = _run(tmp_path, _carry(tmp_path / "wheels", wheels))
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    tier = json.loads((tmp_path / "out-wheels" / "tier-pr.json").read_text())
    installed = tier["gpu"]["installed"]
    assert installed["version"] == wheels["full"].version and installed["lane"] == "cpu"
    assert "/lane-venv/" in installed["file"] and not Path(installed["file"]).is_relative_to(ROOT), \
        "the tests imported the checkout's jax_aiter"
    assert "--- lane-tier: exit 0" in out.stdout and "all steps passed" in out.stdout
    assert f"jax-aiter {wheels['full'].version} (full, lane cpu)" in out.stdout  # `python -m jax_aiter info`


@pytest.mark.slow
def test_only_a_wheel_a_green_report_vouches_for_is_tested(wheels, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    out = _run(tmp_path, empty)
    assert out.returncode == 1 and "release-report.json; run `nox -s release` first" in out.stderr + out.stdout
    red = _run(tmp_path, _carry(tmp_path / "red", wheels, ok=False))
    assert red.returncode == 1 and "is not green (stages wheel_lite, wheel_full)" in red.stderr + red.stdout
    other = _run(tmp_path, _carry(tmp_path / "other", wheels, lane="cuda13"))
    assert other.returncode == 1 and "is of lane cuda13, not cpu" in other.stderr + other.stdout
