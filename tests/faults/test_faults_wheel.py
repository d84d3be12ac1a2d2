"""Faults of the wheels: a library changed after the build with RECORD regenerated to match, a Python file
changed in the stage after staging, a wheel that fails --check. Real wheels built by the real wheel builder from
a copy of this checkout's build tree (the CPU libraries), checked by real processes."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from jatools import config
from jatools.wheel import wheel_build, wheel_contents, wheel_scan
from jax_aiter.integrity import IntegrityError
from tests.wheel.wheel_plant import rewrite_wheel

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("JA_ROOT_DIR") or ROOT) / "build"
EPOCH = 1700000000


def _env(build_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("JA_WHEEL_PLAT_NAME", "JA_WHEEL_ARCH", "GPU_ARCHS")}
    env.update(JA_BACKEND="cpu", JA_BUILD_DIR=str(build_dir), JA_ROOT_DIR=str(ROOT), PYTHONPATH=str(ROOT),
               SOURCE_DATE_EPOCH=str(EPOCH))
    return env


@pytest.fixture
def build_dir(tmp_path) -> Path:
    """A private copy of the build tree's libraries and records (its own wheel_stage/)."""
    needed = [BUILD / "jax_aiter_build" / "build_record.json", BUILD / "aiter_build" / "build_record.json",
              BUILD / "aiter_build" / "libmha_fwd.so"]
    if missing := [str(p) for p in needed if not p.is_file()]:
        pytest.skip(f"needs the CPU build in {BUILD} ({', '.join(missing)} missing): run `make && python3 "
                    "jax_aiter/jit/build_jit.py && make ja_mods`")
    dst = tmp_path / "build"
    for sub in ("jax_aiter_build", "aiter_build"):
        (dst / sub).mkdir(parents=True)
        for p in (BUILD / sub).iterdir():
            if p.is_file() and (p.suffix == ".so" or p.name == "build_record.json"):
                shutil.copy2(p, dst / sub / p.name)
    return dst


def _build(build_dir: Path, variant: str, dist: Path, log=lambda m: None) -> wheel_build.BuildResult:
    settings = config.load(root=ROOT, env=_env(build_dir))
    return wheel_build.build(settings, wheel_build.BuildOptions(variant=variant, dist_dir=dist,
                                                                 source_date_epoch=EPOCH), log=log)


def _checks(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "jatools.wheel.wheel_checks", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300, check=False)


def test_faults_library_changed_after_the_build_with_record_regenerated_fails_contents(build_dir, tmp_path):
    """libmha_fwd.so altered (same size) and RECORD rewritten to match: RECORD agrees, the pins do not.
    `invoke contents` (wheel_checks --contents) and the clean room's first check refuse it."""
    good = _build(build_dir, "full", tmp_path / "dist").wheel
    assert wheel_contents.check_contents(good).ok and wheel_scan.verify_pins(good) > 0
    member = "jax_aiter/_lib/libmha_fwd.so"
    with zipfile.ZipFile(good) as zf:
        data = bytearray(zf.read(member))
    data[len(data) // 2] ^= 0xFF
    (tmp_path / "bad").mkdir()
    bad = rewrite_wheel(good, tmp_path / "bad" / good.name, put={member: bytes(data)})
    assert wheel_scan.verify_record(bad) > 0  # self-consistent: RECORD alone cannot tell
    r = _checks("--contents", str(bad), env=_env(build_dir))
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"{member} is sha256" in r.stderr and "its pin in jax_aiter/_build_identity.json" in r.stderr, r.stderr
    with pytest.raises(wheel_scan.RecordError, match="the library was changed after the wheel was built"):
        wheel_scan.verify_pins(bad)


def test_faults_python_file_changed_in_the_stage_after_staging_does_not_ship(build_dir, tmp_path):
    """Another process edits build/wheel_stage/lite/jax_aiter/info.py between staging and packing: the read-back
    refuses the wheel (only the libraries were re-checked before) and nothing is left in dist/."""
    stage = build_dir / "wheel_stage" / "lite" / "jax_aiter" / "info.py"

    def tamper(line: str) -> None:
        if line.startswith("wheel_build: staged "):
            with open(stage, "a") as f:
                f.write("\nprint('planted')\n")
    with pytest.raises(IntegrityError, match=r"jax_aiter/info.py: .* but staging wrote sha256 .* the stage was "
                                             r"changed after staging"):
        _build(build_dir, "lite", tmp_path / "dist", log=tamper)
    assert not list((tmp_path / "dist").glob("*.whl"))


def test_faults_wheel_that_fails_check_leaves_dist(build_dir, tmp_path):
    """A tag older than the libraries' symbols allow fails --check's floor: the wheel is removed from dist/ and
    the message says so; a good wheel built before it stays."""
    dist = tmp_path / "dist"
    env = _env(build_dir)
    ok = subprocess.run([sys.executable, "-m", "jatools.wheel.wheel_build", "--variant", "full", "--dist", str(dist),
                         "--check"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert ok.returncode == 0, ok.stderr
    good = sorted(dist.glob("*.whl"))
    r = subprocess.run([sys.executable, "-m", "jatools.wheel.wheel_build", "--variant", "lite", "--dist", str(dist),
                        "--check"], env={**env, "JA_WHEEL_PLAT_NAME": "manylinux_2_5_x86_64"}, cwd=ROOT,
                       capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "but the versioned symbols need" in r.stderr and "it failed the checks above" in r.stderr, r.stderr
    assert sorted(dist.glob("*.whl")) == good, "only the good wheel stays"
