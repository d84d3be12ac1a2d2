"""python3 -m ci.parallel_gpu_execute with real flock across real processes.

Stand-in `rocminfo` / `nvidia-smi` scripts on PATH play the GPUs this machine
lacks; everything else (the locks, the processes, exec, kill) is real.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jatools.testing import gpu_slots

ROOT = Path(__file__).resolve().parents[2]
RUNNER = ("-m", "ci.parallel_gpu_execute")  # run from the checkout root (cwd=ROOT)
SHOW = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", gpu_slots.SLOT_ENV,
        "XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_PREALLOCATE", *gpu_slots.BLAS_THREADS_ENV)



def _rocminfo(n: int) -> str:
    agents = ["  Name:                    AMD EPYC 9575F 64-Core Processor", "  Device Type:             CPU"]
    for _ in range(n):
        agents += ["  Name:                    gfx950", "  Marketing Name:          AMD Instinct MI355X",
                   "      Name:                    amdgcn-amd-amdhsa--gfx950:sramecc+:xnack-",
                   "  Device Type:             GPU"]
    body = "\n".join(agents)
    return f"cat <<'EOF'\nROCk module version 6.14 is loaded\n{body}\nEOF"


def _smi(n: int) -> str:
    lines = "\n".join(f"GPU {i}: NVIDIA H200 (UUID: GPU-{i:08d}-aaaa-bbbb-cccc-000000000000)" for i in range(n))
    return f"[ \"$1\" = -L ] || exit 2\ncat <<'EOF'\n{lines}\nEOF"


@pytest.fixture
def host(tmp_path, monkeypatch):
    """A fake host: stand-in GPU tools on PATH, a private lock folder, a clean pinning environment."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()

    def make(rocm: int = 0, cuda: int = 0, per_gpu: int = 1) -> dict[str, str]:
        # With no GPU of a kind its tool answers and lists none (a probe that fails is an error: tests/faults).
        for name, body in (("rocminfo", _rocminfo(rocm)), ("nvidia-smi", _smi(cuda))):
            (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
            (bin_dir / name).chmod(0o755)
        kfd = tmp_path / "kfd"  # the AMD driver's device, standing in for a host where rocminfo is asked
        kfd.touch()
        env = {k: v for k, v in os.environ.items() if k not in SHOW and not k.startswith("JA_GPU")}
        env.update(PATH=f"{bin_dir}:{os.environ['PATH']}", JA_GPU_LOCK_DIR=str(tmp_path / "locks"),
                   JA_TESTS_PER_GPU=str(per_gpu), JA_KFD_PATH=str(kfd))
        return env

    return make


def _recorder(out: Path, hold_s: float = 0.0, code: int = 0) -> list[str]:
    """A command that writes what it sees to `out`, optionally holds the GPU a while, and exits `code`."""
    prog = ("import json, os, sys, time\n"
            f"json.dump({{k: os.environ.get(k) for k in {SHOW!r}}}, open({str(out)!r}, 'w'))\n"
            f"time.sleep({hold_s})\nsys.exit({code})")
    return [sys.executable, "-c", prog]


def _run(env: dict, cmd: list[str], *flags: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *RUNNER, *flags, "--", *cmd], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)


def _start(env: dict, cmd: list[str], *flags: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *RUNNER, *flags, "--", *cmd], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(path: Path, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_size:
            try:
                return json.loads(path.read_text())
            except ValueError:
                pass
        time.sleep(0.02)
    raise AssertionError(f"{path} never appeared")


def test_counts_from_rocminfo_gfx_agents_only(host):
    g = gpu_slots.detect(host(rocm=3))
    assert (g.platform, g.count) == ("rocm", 3) and "rocminfo" in g.how


def test_counts_from_nvidia_smi_when_rocminfo_finds_none(host):
    g = gpu_slots.detect(host(cuda=2))
    assert (g.platform, g.ids) == ("cuda", ("0", "1")) and "nvidia-smi" in g.how


def test_override_count_skips_the_tools(host):
    env = host()
    env.update(JA_GPU_COUNT="4", JA_BACKEND="rocm")
    assert gpu_slots.detect(env) == gpu_slots.Gpus("rocm", ("0", "1", "2", "3"), "JA_GPU_COUNT=4")


def test_override_of_zero_means_no_gpu(host):
    assert gpu_slots.detect({**host(cuda=2), "JA_GPU_COUNT": "0"}).platform == "cpu"


def test_zero_gpus_runs_unpinned_and_passes_the_exit_code_through(host, tmp_path):
    env = host()
    env["CUDA_VISIBLE_DEVICES"] = "7"  # whatever the caller set stays as it is
    r = _run(env, _recorder(tmp_path / "seen.json", code=7))
    assert r.returncode == 7, r.stderr
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen["CUDA_VISIBLE_DEVICES"] == "7" and seen[gpu_slots.SLOT_ENV] is None
    assert "running unpinned" in r.stderr
    assert not (tmp_path / "locks").exists() or not list((tmp_path / "locks").iterdir())


def test_pinned_command_exit_code_is_the_runners(host, tmp_path):
    r = _run(host(cuda=1), _recorder(tmp_path / "seen.json", code=3))
    assert r.returncode == 3
    assert json.loads((tmp_path / "seen.json").read_text())["CUDA_VISIBLE_DEVICES"] == "0"


def test_pinned_command_allocates_as_needed_and_runs_one_blas_thread_unless_told(host, tmp_path):
    assert _run(host(cuda=1), _recorder(tmp_path / "seen.json")).returncode == 0
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false" and seen["XLA_PYTHON_CLIENT_MEM_FRACTION"] is None
    assert [seen[k] for k in gpu_slots.BLAS_THREADS_ENV] == ["1", "1", "1"]
    mine = {"XLA_PYTHON_CLIENT_PREALLOCATE": "true", "OPENBLAS_NUM_THREADS": "8"}
    assert _run({**host(cuda=1), **mine}, _recorder(tmp_path / "mine.json")).returncode == 0
    seen = json.loads((tmp_path / "mine.json").read_text())
    assert (seen["XLA_PYTHON_CLIENT_PREALLOCATE"], seen["OPENBLAS_NUM_THREADS"], seen["MKL_NUM_THREADS"]) == (
        "true", "8", "1")


def test_slot_order_spreads_over_gpus_before_sharing_one(host, tmp_path):
    env = host(cuda=2, per_gpu=2)
    holders, seen = [], []
    try:
        for k in range(4):  # each holds its slot, so the next one must take the next free slot
            out = tmp_path / f"seen{k}.json"
            holders.append(_start(env, _recorder(out, hold_s=60)))
            seen.append(_wait_for(out))
        assert [s[gpu_slots.SLOT_ENV] for s in seen] == ["0:0", "1:0", "0:1", "1:1"]
        assert [s["CUDA_VISIBLE_DEVICES"] for s in seen] == ["0", "1", "0", "1"]
        assert {s["XLA_PYTHON_CLIENT_MEM_FRACTION"] for s in seen} == {"0.45"}  # two processes share a GPU
        full = _run({**env, "JA_GPU_SLOT_TIMEOUT": "0.5"}, ["true"])
        assert full.returncode == 75
        assert "no free GPU slot after 0.5 s" in full.stderr and f"pid {holders[0].pid}" in full.stderr
    finally:
        for p in holders:
            p.kill()
            p.wait()


def test_no_two_holders_of_one_slot(host, tmp_path):
    """Eight commands race for 2 GPUs x 1 slot; a command that finds its GPU busy fails."""
    env = host(cuda=2)
    prog = ("import os, sys, time\n"
            "gpu = os.environ['CUDA_VISIBLE_DEVICES']\n"
            f"busy = os.path.join({str(tmp_path)!r}, 'busy' + gpu)\n"
            "fd = os.open(busy, os.O_CREAT | os.O_EXCL | os.O_WRONLY)  # raises if another holder is on this GPU\n"
            "time.sleep(0.3)\n"
            "os.close(fd); os.unlink(busy)\n"
            f"open(os.path.join({str(tmp_path)!r}, 'ran' + str(os.getpid())), 'w').write(gpu)\n")
    procs = [_start(env, [sys.executable, "-c", prog]) for _ in range(8)]
    results = [(p.wait(timeout=60), p.stderr.read()) for p in procs]
    assert all(rc == 0 for rc, _ in results), results
    ran = [p.read_text() for p in tmp_path.glob("ran*")]
    assert len(ran) == 8 and set(ran) == {"0", "1"}


def test_killed_holder_frees_its_slot(host, tmp_path):
    env = host(cuda=1)
    holder = _start(env, _recorder(tmp_path / "holder.json", hold_s=120))
    try:
        _wait_for(tmp_path / "holder.json")
        blocked = _run({**env, "JA_GPU_SLOT_TIMEOUT": "0.3"}, ["true"])
        assert blocked.returncode == 75
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    start = time.monotonic()
    after = _run({**env, "JA_GPU_SLOT_TIMEOUT": "10"}, _recorder(tmp_path / "after.json"))
    assert after.returncode == 0, after.stderr
    assert time.monotonic() - start < 10
    assert json.loads((tmp_path / "after.json").read_text())[gpu_slots.SLOT_ENV] == "0:0"


def test_waiting_command_gets_the_slot_when_it_frees(host, tmp_path):
    env = {**host(cuda=1), "JA_GPU_SLOT_TIMEOUT": "30"}
    first = _start(env, _recorder(tmp_path / "first.json", hold_s=0.5))
    _wait_for(tmp_path / "first.json")
    second = _run(env, _recorder(tmp_path / "second.json"))
    assert first.wait(timeout=30) == 0 and second.returncode == 0, second.stderr


def test_cuda_pool_from_the_orchestrator_is_honoured(host, tmp_path):
    env = {**host(cuda=8), "CUDA_VISIBLE_DEVICES": "5,2"}
    a = _start(env, _recorder(tmp_path / "a.json", hold_s=60))
    try:
        assert _wait_for(tmp_path / "a.json")["CUDA_VISIBLE_DEVICES"] == "5"
        r = _run(env, _recorder(tmp_path / "b.json"))
        assert r.returncode == 0
        assert json.loads((tmp_path / "b.json").read_text())["CUDA_VISIBLE_DEVICES"] == "2"
        assert (tmp_path / "locks" / "gpu5_slot0.lock").exists()
    finally:
        a.kill()
        a.wait()


def test_rocm_pins_rocr_to_the_physical_id_and_hip_to_its_index(host, tmp_path):
    env = {**host(rocm=8), "ROCR_VISIBLE_DEVICES": "6", "CUDA_VISIBLE_DEVICES": "0", "HIP_VISIBLE_DEVICES": "3"}
    r = _run(env, _recorder(tmp_path / "seen.json"))
    assert r.returncode == 0, r.stderr
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert (seen["ROCR_VISIBLE_DEVICES"], seen["HIP_VISIBLE_DEVICES"], seen["CUDA_VISIBLE_DEVICES"]) == ("6", "0", None)


def test_empty_pool_means_no_gpu(host, tmp_path):
    r = _run({**host(cuda=4), "CUDA_VISIBLE_DEVICES": ""}, _recorder(tmp_path / "seen.json"))
    assert r.returncode == 0 and "running unpinned" in r.stderr


def test_exclusive_holds_every_slot_and_leaves_devices_unpinned(host, tmp_path):
    env = host(cuda=2, per_gpu=2)
    excl = _start(env, _recorder(tmp_path / "excl.json", hold_s=60), "--exclusive")
    try:
        seen = _wait_for(tmp_path / "excl.json")
        assert seen["CUDA_VISIBLE_DEVICES"] is None and seen[gpu_slots.SLOT_ENV] is None
        blocked = _run({**env, "JA_GPU_SLOT_TIMEOUT": "0.3"}, ["true"])
        assert blocked.returncode == 75
    finally:
        excl.kill()
        excl.wait()
    assert _run({**env, "JA_GPU_SLOT_TIMEOUT": "5"}, ["true"]).returncode == 0


def test_missing_command_is_a_usage_error(host):
    r = subprocess.run([sys.executable, *RUNNER], cwd=ROOT, env=host(), capture_output=True, text=True, check=False)
    assert r.returncode == 2 and "give the command" in r.stderr


def test_a_block_of_two_gpus_shares_a_four_gpu_host_with_single_gpu_commands(host, tmp_path):
    """XLA's block reservation: a 2-GPU command takes a free window of 2 GPUs (a lock on each), single-GPU
    commands keep running on the others, and a second block waits until a window frees up."""
    env = host(cuda=4, per_gpu=2)
    one = _start(env, _recorder(tmp_path / "one.json", hold_s=60))  # GPU 0, slot 0
    procs = [one]
    try:
        assert _wait_for(tmp_path / "one.json")[gpu_slots.SLOT_ENV] == "0:0"
        block = _start(env, _recorder(tmp_path / "block.json", hold_s=60), "--gpus", "2")
        procs.append(block)
        seen = _wait_for(tmp_path / "block.json")
        assert seen["CUDA_VISIBLE_DEVICES"] == "1,2" and seen[gpu_slots.SLOT_ENV] == "1,2:block"  # 0-1 is not free
        assert seen["XLA_PYTHON_CLIENT_MEM_FRACTION"] is None  # the block owns its GPUs whole
        for k in range(3):  # single-GPU commands still run: GPU 3 twice, then GPU 0's second slot
            procs.append(_start(env, _recorder(tmp_path / f"s{k}.json", hold_s=60)))
            assert _wait_for(tmp_path / f"s{k}.json")[gpu_slots.SLOT_ENV] == ["3:0", "0:1", "3:1"][k]
        waited = _run({**env, "JA_GPU_SLOT_TIMEOUT": "0.5"}, ["true"], "--gpus", "2")
        assert waited.returncode == gpu_slots.EXIT_NO_SLOT and "no block of 2 free GPU(s)" in waited.stderr
        block.kill()
        block.wait()
        again = _run({**env, "JA_GPU_SLOT_TIMEOUT": "10"}, _recorder(tmp_path / "again.json"), "--gpus", "2")
        assert again.returncode == 0, again.stderr
        assert json.loads((tmp_path / "again.json").read_text())["CUDA_VISIBLE_DEVICES"] == "1,2"
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_a_rocm_block_pins_rocr_to_the_physical_ids_and_hip_to_their_indices(host, tmp_path):
    r = _run(host(rocm=4), _recorder(tmp_path / "seen.json"), "--gpus", "3")
    assert r.returncode == 0, r.stderr
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert (seen["ROCR_VISIBLE_DEVICES"], seen["HIP_VISIBLE_DEVICES"]) == ("0,1,2", "0,1,2")
    too_many = _run(host(rocm=2), ["true"], "--gpus", "3")
    assert too_many.returncode == 2 and "a block of 3 GPU(s) cannot come from 2" in too_many.stderr
