"""Faults of the wheels: a library changed after the build with RECORD regenerated to match, a Python file
changed in the stage after staging, a wheel that fails --check. Real wheels built by the real wheel builder from
a private copy of the wheel tests' CPU build (tests/wheel/conftest.py: its fixtures, shared), checked by real
processes."""
from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from jatools import config
from jatools.wheel import wheel_build, wheel_contents, wheel_scan
from jax_aiter.integrity import IntegrityError
from tests.faults.mounts import fill, mounted
from tests.wheel.conftest import EPOCH, ROOT, cpu_env
from tests.wheel.wheel_plant import rewrite_wheel


def _env(settings: config.Settings) -> dict[str, str]:
    """The wheel tests' CPU environment for a private build tree, as a process sees it."""
    return {**cpu_env(settings.build_dir), "PYTHONPATH": str(ROOT), "SOURCE_DATE_EPOCH": str(EPOCH)}


def _build(settings: config.Settings, variant: str, dist: Path, log=lambda m: None) -> wheel_build.BuildResult:
    return wheel_build.build(settings, wheel_build.BuildOptions(variant=variant, dist_dir=dist,
                                                                 source_date_epoch=EPOCH), log=log)


def _checks(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "jatools.wheel.wheel_checks", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300, check=False)


def test_faults_library_changed_after_the_build_with_record_regenerated_fails_contents(build_copy, tmp_path):
    """libmha_fwd.so altered (same size) and RECORD rewritten to match: RECORD agrees, the pins do not.
    `invoke contents` (wheel_checks --contents) and the clean room's first check refuse it."""
    good = _build(build_copy, "full", tmp_path / "dist").wheel
    assert wheel_contents.check_contents(good).ok and wheel_scan.verify_pins(good) > 0
    member = "jax_aiter/_lib/libmha_fwd.so"
    with zipfile.ZipFile(good) as zf:
        data = bytearray(zf.read(member))
    data[len(data) // 2] ^= 0xFF
    (tmp_path / "bad").mkdir()
    bad = rewrite_wheel(good, tmp_path / "bad" / good.name, put={member: bytes(data)})
    assert wheel_scan.verify_record(bad) > 0  # self-consistent: RECORD alone cannot tell
    r = _checks("--contents", str(bad), env=_env(build_copy))
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"{member} is sha256" in r.stderr and "its pin in jax_aiter/_build_identity.json" in r.stderr, r.stderr
    with pytest.raises(wheel_scan.RecordError, match="the library was changed after the wheel was built"):
        wheel_scan.verify_pins(bad)


def test_faults_python_file_changed_in_the_stage_after_staging_does_not_ship(build_copy, tmp_path):
    """Another process edits build/wheel_stage/lite/jax_aiter/info.py between staging and packing: the read-back
    refuses the wheel (only the libraries were re-checked before) and nothing is left in dist/."""
    stage = build_copy.path("wheel_stage") / "lite" / "jax_aiter" / "info.py"

    def tamper(line: str) -> None:
        if line.startswith("wheel_build: staged "):
            with open(stage, "a") as f:
                f.write("\nprint('planted')\n")
    with pytest.raises(IntegrityError, match=r"jax_aiter/info.py: .* but staging wrote sha256 .* the stage was "
                                             r"changed after staging"):
        _build(build_copy, "lite", tmp_path / "dist", log=tamper)
    assert not list((tmp_path / "dist").glob("*.whl"))


def test_faults_wheel_that_fails_check_leaves_dist(build_copy, tmp_path):
    """A tag older than the libraries' symbols allow fails --check's floor: the wheel is removed from dist/ and
    the message says so; a good wheel built before it stays."""
    dist = tmp_path / "dist"
    env = _env(build_copy)
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


def test_faults_wheel_build_on_a_full_disk_names_the_path(build_copy, tmp_path):
    """dist/ on a full disk (a real 64 KiB tmpfs): the wheel build said `[Errno 28] No space left on device` and no
    path. Now one line names the wheel it could not write and the fix, and no temporary file is left there."""
    with mounted(["-t", "tmpfs", "-o", "size=64k", "tmpfs"], tmp_path / "disk", "a small tmpfs") as disk:
        fill(disk / "filler")
        r = subprocess.run([sys.executable, "-m", "jatools.wheel.wheel_build", "--variant", "lite", "--dist",
                            str(disk)], env=_env(build_copy), cwd=ROOT, capture_output=True, text=True, timeout=600,
                           check=False)
        left = sorted(p.name for p in disk.iterdir())
    assert r.returncode == 2, r.stdout + r.stderr
    said = [line for line in r.stderr.splitlines() if "error" in line]
    assert len(said) == 1 and re.search(rf"wheel_build: error: cannot write {re.escape(str(disk))}/jax_aiter-\S+\.whl: "
                                        r"No space left on device; free some space on its disk, or build the wheel "
                                        r"into another folder \(--dist DIR\)", said[0]), r.stderr
    assert "Traceback" not in r.stderr and not [n for n in left if ".tmp" in n], left


def test_faults_check_refuses_jit_libraries_of_another_commit(build_copy, tmp_path):
    """build/aiter_build built at another commit (its record names other kernel sources) and the checkout here:
    `wheel_build --variant full --check` exited 0 and packed them. It now refuses the wheel, naming both cache ids
    and the field that differs, and removes it from dist/."""
    import json

    from jax_aiter import reuse_gate

    record_path = build_copy.jit_dir / "build_record.json"
    record = json.loads(record_path.read_text())
    ident_before = record["identity"]
    ident = dict(ident_before, kernel_source_revision="0" * 40)
    ident["cache_id"] = reuse_gate.cache_id(ident)
    record["identity"] = ident
    for m in record["modules"].values():
        m["identity"] = ident
    record_path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    dist = tmp_path / "dist"
    r = subprocess.run([sys.executable, "-m", "jatools.wheel.wheel_build", "--variant", "full", "--dist", str(dist),
                        "--check"], env=_env(build_copy), cwd=ROOT, capture_output=True, text=True, timeout=600,
                       check=False)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"the JIT libraries (cache id {ident['cache_id']}) are not this checkout's (cache id " in r.stderr, r.stderr
    assert f"kernel_source_revision: wanted {ident_before['kernel_source_revision']}, found {'0' * 40}" in r.stderr
    assert "it failed the checks above" in r.stderr and not list(dist.glob("*.whl"))


@pytest.mark.parametrize("slip", ["../../{target}/evil.py", "/{target}/evil.py", "jax_aiter/..\\\\..\\\\evil.py"])
def test_faults_validate_refuses_a_zip_slip_wheel_before_installing(build_copy, tmp_path, slip):
    """A wheel with a member whose name leads outside the install folder, RECORD rewritten to match: `invoke
    validate` installed it before the installer refused it. Its first check (wheel-record) now refuses it, naming
    the member, and nothing is installed or written."""
    from jatools.validate import cleanroom

    good = _build(build_copy, "full", tmp_path / "dist").wheel
    target = tmp_path / "outside"
    name = slip.format(target=str(target).lstrip("/"))
    (tmp_path / "bad").mkdir()
    bad = rewrite_wheel(good, tmp_path / "bad" / good.name, put={name: b"print('escaped')\n"})
    opts = cleanroom.Options(root=ROOT, wheels=[bad], engine="none", fill=False, log=lambda m: None)
    result = cleanroom.validate_wheel(bad, opts, None, tmp_path / "no-wheelhouse", Path(sys.executable), [])
    assert [(c.name, c.ok) for c in result.checks] == [("wheel-record", False)], result.checks
    assert f"has member(s) that would be written outside the install folder: {name!r}" in result.checks[0].message
    assert "a zip-slip wheel" in result.checks[0].message and not target.exists()
