"""Faults of GPU pinning: planted symlinks and foreign lock folders, orphaned lock holders, bad GPU pools and
settings, broken GPU probes. Real runner processes (python3 -m ci.parallel_gpu_execute), real flock, real symlinks,
stand-in nvidia-smi scripts on PATH."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jatools.testing import gpu_slots
from jax_aiter import host_gpus as probe

ROOT = Path(__file__).resolve().parents[2]
RUNNER = ("-m", "ci.parallel_gpu_execute")  # run from the checkout root (cwd=ROOT)
CLEAN = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "XDG_RUNTIME_DIR")


def _smi_lines(n: int) -> str:
    return "\n".join(f"GPU {i}: NVIDIA H200 (UUID: GPU-{i:08d}-aaaa-bbbb-cccc-000000000000)" for i in range(n))


@pytest.fixture
def env(tmp_path):
    """A host with 2 stand-in CUDA GPUs, no rocminfo, a private lock folder."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\ncat <<'EOF'\n{_smi_lines(2)}\nEOF\n")
    smi.chmod(0o755)
    e = {k: v for k, v in os.environ.items() if k not in CLEAN and not k.startswith("JA_")}
    e.update(PATH=f"{bin_dir}:/usr/bin:/bin", JA_GPU_LOCK_DIR=str(tmp_path / "locks"))
    return e


def _run(env: dict, *cmd: str, flags: tuple[str, ...] = (), timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *RUNNER, *flags, "--", *cmd], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)


def test_faults_lock_never_follows_a_planted_symlink(env, tmp_path):
    locks = tmp_path / "locks"
    locks.mkdir(mode=0o700)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (locks / "gpu0_slot0.lock").symlink_to(victim)
    r = _run(env, "true")
    assert r.returncode == 2, r.stderr
    assert "gpu0_slot0.lock is a symlink" in r.stderr and "never follows" in r.stderr
    assert victim.read_text() == "precious\n"


def test_faults_lock_folder_writable_by_others_is_refused(env, tmp_path):
    locks = tmp_path / "locks"
    locks.mkdir()
    locks.chmod(0o777)
    r = _run(env, "true")
    assert r.returncode == 2 and "others may write to it (mode 777)" in r.stderr and "JA_GPU_LOCK_DIR" in r.stderr
    assert not list(locks.iterdir())


def test_faults_lock_folder_of_another_user_is_refused(env, tmp_path):
    if os.getuid() != 0:
        pytest.skip("chown to another user needs root; the writable-by-others case runs everywhere")
    locks = tmp_path / "locks"
    locks.mkdir(mode=0o700)
    os.chown(locks, 65534, 65534)
    r = _run(env, "true")
    assert r.returncode == 2 and "belongs to uid 65534, not to you" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_faults_lock_folder_that_is_a_symlink_is_refused(env, tmp_path):
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "locks").symlink_to(tmp_path / "real")
    r = _run(env, "true")
    assert r.returncode == 2 and "symlink or not a folder" in r.stderr


def test_faults_default_lock_folder_is_per_user(env, tmp_path):
    run_dir = tmp_path / "run-user"
    run_dir.mkdir(mode=0o700)
    del env["JA_GPU_LOCK_DIR"]
    r = _run({**env, "XDG_RUNTIME_DIR": str(run_dir)}, "true")
    assert r.returncode == 0, r.stderr
    made = run_dir / "jax-aiter-gpu-locks"
    assert (made / "gpu0_slot0.lock").is_file() and (made.stat().st_mode & 0o777) == 0o700
    fallback = gpu_slots.lock_dir({})
    assert fallback.name == f"jax-aiter-gpu-locks-{os.getuid()}"


def test_faults_orphaned_child_holding_the_slot_is_named(env, tmp_path):
    """The holder (sh) ends and leaves a child with the lock: the next runner names that live pid."""
    env = {**env, "JA_GPU_COUNT": "1"}
    pidfile = tmp_path / "child.pid"
    r = _run(env, "sh", "-c", f"sleep 60 >/dev/null 2>&1 & echo $! > {pidfile}")
    assert r.returncode == 0, r.stderr
    child = int(pidfile.read_text())
    try:
        t0 = time.monotonic()
        second = _run(env, "true", flags=("--timeout", "0.3"))
        assert second.returncode == 75, second.stderr
        assert f"now held by live pid {child} (sleep 60)" in second.stderr and f"kill {child}" in second.stderr
        assert time.monotonic() - t0 < 20
    finally:
        os.kill(child, signal.SIGKILL)  # started by this test (not our child: init reaps it)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _run(env, "true", flags=("--timeout", "0.2")).returncode == 75:
        time.sleep(0.1)
    assert _run(env, "true", flags=("--timeout", "1")).returncode == 0


@pytest.mark.parametrize("pool, why", [("7", "'7' is not a detected GPU"), ("-1", "'-1' is not a detected GPU"),
                                       ("0,0", "names a GPU twice"), ("1,abc", "'abc' is not a detected GPU")])
def test_faults_bad_cuda_pool_is_refused(env, tmp_path, pool, why):
    out = tmp_path / "ran"
    r = _run({**env, "CUDA_VISIBLE_DEVICES": pool}, "touch", str(out))
    assert r.returncode == 2, r.stderr
    assert f"CUDA_VISIBLE_DEVICES={pool!r} cannot be used" in r.stderr and why in r.stderr
    assert not out.exists()


def test_faults_good_pool_and_uuid_pool_are_taken(env):
    assert gpu_slots.detect({**env, "CUDA_VISIBLE_DEVICES": "1"}).ids == ("1",)
    uuid = "GPU-00000001-aaaa-bbbb-cccc-000000000000"
    assert gpu_slots.detect({**env, "CUDA_VISIBLE_DEVICES": uuid}).ids == (uuid,)


@pytest.mark.parametrize("name, value", [
    ("JA_GPU_COUNT", "-1"), ("JA_GPU_COUNT", "abc"), ("JA_GPU_SLOT_TIMEOUT", "nan"), ("JA_GPU_SLOT_TIMEOUT", "inf"),
    ("JA_GPU_SLOT_TIMEOUT", "-5"), ("JA_TESTS_PER_GPU", "0"), ("JA_TESTS_PER_GPU", "200"),
    ("JA_TESTS_PER_GPU", "5000000"), ("JA_TESTS_PER_GPU", "1.5")])
def test_faults_bad_slot_settings_name_variable_value_and_range(env, name, value):
    r = _run({**env, name: value}, "true", timeout=30)
    assert r.returncode == 2, r.stderr
    assert f"{name}={value!r} is not valid: give" in r.stderr and " from " in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_faults_bad_timeout_flag_is_refused(env, value):
    r = _run(env, "true", flags=("--timeout", value), timeout=30)
    assert r.returncode == 2 and f"--timeout={value!r} is not valid" in r.stderr


def test_faults_largest_slot_count_keeps_a_memory_fraction():
    top = int(gpu_slots.settings.NUMERIC[gpu_slots.PER_GPU_ENV].hi)
    slot = gpu_slots.Slot("cuda", "0", 0, 0, Path("/nonexistent"))
    assert float(gpu_slots.pinned_env(slot, top, {})[gpu_slots.MEM_FRACTION_ENV]) >= 0.01


@pytest.mark.parametrize("body, says", [
    ("echo 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.'; exit 9",
     "exited with status 9 (NVIDIA-SMI has failed"),
    (f"cat <<'EOF'\n{_smi_lines(1)}\n{_smi_lines(1)}\nEOF", "lists the same GPU more than once"),
])
def test_faults_broken_nvidia_smi_is_an_error_not_no_gpu(env, tmp_path, body, says):
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\n{body}\n")
    out = tmp_path / "ran"
    r = _run(env, "touch", str(out))
    assert r.returncode == 2 and says in r.stderr and "JA_GPU_COUNT=0" in r.stderr, r.stderr
    assert not out.exists()


def test_faults_hanging_nvidia_smi_stops_after_a_short_bound(env, tmp_path, monkeypatch):
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.write_text("#!/bin/sh\nsleep 120 &\nsleep 120\n")  # the probe and a child of it both hang
    assert probe.TOOL_TIMEOUT_S <= 10  # the bound a real run gets
    monkeypatch.setattr(probe, "TOOL_TIMEOUT_S", 1.0)
    t0 = time.monotonic()
    with pytest.raises(gpu_slots.GpuSlotError, match=r"gave no answer within 1 s.*JA_GPU_COUNT=0"):
        gpu_slots.detect(env)
    assert time.monotonic() - t0 < 10


@pytest.mark.parametrize("n", ["0", "-1"])
def test_faults_zero_or_negative_gpus_is_a_usage_error(env, n):
    """--gpus 0 answered "declare at most 2" (the host's count); the number itself is wrong, whatever the host."""
    r = _run(env, "true", flags=("--gpus", n))
    assert r.returncode == 2, r.stderr
    assert f"--gpus {n}: give the number of devices the command declares, 1 or more" in r.stderr
    assert "declare at most" not in r.stderr
