"""GPU slots: count the GPUs, take one (gpu, slot) lock, and pin a process to that GPU.

After XLA's parallel_gpu_execute: each GPU offers ``JA_TESTS_PER_GPU`` slots; a
slot is a non-blocking ``flock`` on ``<lock dir>/gpu<id>_slot<j>.lock``, tried
slot 0 on every GPU before slot 1, so concurrent tests spread over GPUs before
they share one. The pinned environment follows XLA's rules: CUDA gets
CUDA_VISIBLE_DEVICES=<id>; ROCm gets ROCR_VISIBLE_DEVICES=<physical id>,
HIP_VISIBLE_DEVICES=<index inside it> (0) and no CUDA_VISIBLE_DEVICES.

Why fcntl.flock and not the filelock package: the lock must be a plain file
descriptor that the pinned command inherits (ci/parallel_gpu_execute.py execs
the command with the descriptor open), so the slot is held exactly as long as
the test process lives and a killed holder frees it; the kernel drops a flock
when its last descriptor closes. The runner must also work with the bare
Python of a GPU host. filelock wraps the same flock but keeps its descriptor
private.
"""
from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

GPU_COUNT_ENV = "JA_GPU_COUNT"          # override: number of GPUs (skips rocminfo / nvidia-smi)
GPU_PLATFORM_ENV = "JA_GPU_PLATFORM"    # with the override: cuda (default) or rocm
PER_GPU_ENV = "JA_TESTS_PER_GPU"        # slots per GPU (default 1)
LOCK_DIR_ENV = "JA_GPU_LOCK_DIR"        # where the slot locks live (one per host)
TIMEOUT_ENV = "JA_GPU_SLOT_TIMEOUT"     # seconds to wait for a free slot (default 900)
HELD_ENV = "JA_GPU_SLOT_HELD"           # set in a pinned process: "<gpu id>:<slot>"
PREALLOCATE_ENV = "XLA_PYTHON_CLIENT_PREALLOCATE"  # set to false in a pinned process unless given
MEM_FRACTION_ENV = "XLA_PYTHON_CLIENT_MEM_FRACTION"  # set when several slots share a GPU
BLAS_THREADS_ENV = ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS")  # 1 in a pinned process unless given
POOL_ENV = {"cuda": "CUDA_VISIBLE_DEVICES", "rocm": "ROCR_VISIBLE_DEVICES"}
DEFAULT_TIMEOUT_S = 900.0
EXIT_NO_SLOT = 75  # EX_TEMPFAIL: the exit code of a command that found no free slot in time
TOOL_TIMEOUT_S = 60.0


class SlotTimeout(TimeoutError):
    """No slot became free within the bounded wait; the message says who holds them."""


@dataclass(frozen=True)
class Gpus:
    """The GPUs this process may use: platform (cpu when none), physical ids, and how we know."""

    platform: str  # cpu | cuda | rocm
    ids: tuple[str, ...]
    how: str

    @property
    def count(self) -> int:
        return len(self.ids)


@dataclass
class Slot:
    """A held slot; the lock lives while ``fd`` (or an inherited copy of it) is open."""

    platform: str
    gpu: str    # physical id (or UUID) as the pool names it
    index: int  # position in the pool
    slot: int
    path: Path
    fd: int = field(repr=False, default=-1)

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _tool_lines(cmd: list[str], env: dict[str, str]) -> list[str] | None:
    exe = shutil.which(cmd[0], path=env.get("PATH"))
    if not exe:
        return None
    try:
        out = subprocess.run([exe, *cmd[1:]], capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, env=env, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return out.stdout.splitlines() if out.returncode == 0 else []


def _parse_pool(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())


def detect(env: dict[str, str] | None = None) -> Gpus:
    """Count GPUs: JA_GPU_COUNT override, else `rocminfo` gfx agents, else `nvidia-smi -L`.

    A pool already assigned by an orchestrator (ROCR_VISIBLE_DEVICES on ROCm,
    CUDA_VISIBLE_DEVICES on CUDA) is honoured: its ids are the GPUs we may use.
    """
    env = dict(os.environ if env is None else env)
    if env.get(GPU_COUNT_ENV, "").strip():
        platform = env.get(GPU_PLATFORM_ENV, "cuda").strip() or "cuda"
        if platform not in POOL_ENV:
            raise ValueError(f"{GPU_PLATFORM_ENV}={platform!r}; use cuda or rocm")
        n = int(env[GPU_COUNT_ENV])
        found, how = tuple(str(i) for i in range(n)), f"{GPU_COUNT_ENV}={n}"
        if n == 0:
            platform = "cpu"
    else:
        platform, found, how = "cpu", (), "no GPU: rocminfo and nvidia-smi found none"
        rocm = _tool_lines(["rocminfo"], env)
        gfx = [ln for ln in rocm or [] if re.match(r"\s*Name:\s+gfx", ln)]
        if gfx:
            platform, found, how = "rocm", tuple(str(i) for i in range(len(gfx))), f"rocminfo: {len(gfx)} gfx agents"
        else:
            smi = _tool_lines(["nvidia-smi", "-L"], env)
            gpus = [ln for ln in smi or [] if ln.startswith("GPU ")]
            if gpus:
                platform, found, how = "cuda", tuple(str(i) for i in range(len(gpus))), f"nvidia-smi -L: {len(gpus)} GPUs"
    if platform == "cpu":
        return Gpus("cpu", (), how)
    pool_var = POOL_ENV[platform]
    if pool_var in env:
        pool = _parse_pool(env[pool_var])
        return Gpus(platform if pool else "cpu", pool, f"{how}; pool {pool_var}={env[pool_var]!r}")
    return Gpus(platform, found, how)


def tests_per_gpu(env: dict[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    n = int(env.get(PER_GPU_ENV, "1") or "1")
    if n < 1:
        raise ValueError(f"{PER_GPU_ENV}={n}; it must be at least 1")
    return n


def lock_dir(env: dict[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    return Path(env.get(LOCK_DIR_ENV) or Path(tempfile.gettempdir()) / "jax-aiter-gpu-locks")


def slot_order(gpus: Gpus, per_gpu: int) -> list[tuple[int, int]]:
    """(pool index, slot) in the order they are tried: slot 0 on every GPU, then slot 1, ..."""
    return [(i, j) for j in range(per_gpu) for i in range(gpus.count)]


def _lock_path(folder: Path, gpu: str, slot: int) -> Path:
    return folder / f"gpu{re.sub(r'[^A-Za-z0-9_.-]', '_', gpu)}_slot{slot}.lock"


def _try_lock(path: Path, note: str) -> int | None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{note}\n".encode(), 0)  # who holds it, for the timeout message
    return fd


def _holders(paths: list[Path]) -> str:
    parts = []
    for p in paths:
        try:
            who = p.read_text().strip() or "?"
        except OSError:
            who = "?"
        parts.append(f"{p.name}: {who}")
    return "; ".join(parts)


def _note(note: str | None) -> str:
    return note or f"pid {os.getpid()}"


def acquire(gpus: Gpus, per_gpu: int = 1, folder: Path | None = None, timeout: float = DEFAULT_TIMEOUT_S,
            note: str | None = None, poll: float = 0.2) -> Slot:
    """Take the first free slot in slot_order, polling until ``timeout`` seconds have passed."""
    if gpus.count == 0:
        raise ValueError("acquire() needs at least one GPU; with none, run the command unpinned")
    folder = folder or lock_dir()
    folder.mkdir(parents=True, exist_ok=True)
    order = slot_order(gpus, per_gpu)
    deadline = time.monotonic() + timeout
    while True:
        for i, j in order:
            path = _lock_path(folder, gpus.ids[i], j)
            fd = _try_lock(path, _note(note))
            if fd is not None:
                return Slot(gpus.platform, gpus.ids[i], i, j, path, fd)
        if time.monotonic() >= deadline:
            paths = [_lock_path(folder, gpus.ids[i], j) for i, j in order]
            raise SlotTimeout(
                f"no free GPU slot after {timeout:g} s: {gpus.count} GPU(s) x {per_gpu} slot(s) "
                f"({gpus.how}), all held ({_holders(paths)}). Wait for those processes, raise "
                f"{TIMEOUT_ENV} or {PER_GPU_ENV}, or point {LOCK_DIR_ENV} elsewhere if the locks are stale "
                f"copies from another host")
        time.sleep(poll)


def acquire_all(gpus: Gpus, per_gpu: int = 1, folder: Path | None = None, timeout: float = DEFAULT_TIMEOUT_S,
                note: str | None = None, poll: float = 0.2) -> list[Slot]:
    """Take every slot of every GPU (exclusive use, e.g. the multigpu tier), in one fixed order."""
    folder = folder or lock_dir()
    folder.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout
    held: list[Slot] = []
    try:
        for i, j in sorted(slot_order(gpus, per_gpu)):
            path = _lock_path(folder, gpus.ids[i], j)
            while (fd := _try_lock(path, _note(note))) is None:
                if time.monotonic() >= deadline:
                    raise SlotTimeout(
                        f"could not take every GPU slot for exclusive use within {timeout:g} s; "
                        f"{path.name} is held ({_holders([path])}). Wait for it or raise {TIMEOUT_ENV}")
                time.sleep(poll)
            held.append(Slot(gpus.platform, gpus.ids[i], i, j, path, fd))
    except BaseException:
        for s in held:
            s.release()
        raise
    return held


def acquire_block(gpus: Gpus, n: int, per_gpu: int = 1, folder: Path | None = None,
                  timeout: float = DEFAULT_TIMEOUT_S, note: str | None = None, poll: float = 0.2) -> list[Slot]:
    """Take a block of ``n`` GPUs for one command that declares n devices (XLA's parallel_gpu_execute).

    A lock on each GPU of the block: every slot of it, so no single-GPU command shares a GPU
    with the block, while the GPUs outside it stay free for them. Blocks are windows of n
    consecutive GPUs of the pool, tried in order; a window is taken all or nothing (a partly
    free one is released at once, so two waiting blocks never hold pieces of each other),
    polling until ``timeout`` seconds have passed.
    """
    if not 1 <= n <= gpus.count:
        raise ValueError(f"a block of {n} GPU(s) cannot come from {gpus.count} ({gpus.how}); declare at most "
                         f"{gpus.count} or run on a host with more GPUs")
    folder = folder or lock_dir()
    folder.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout
    windows = [range(start, start + n) for start in range(gpus.count - n + 1)]
    while True:
        for window in windows:
            held: list[Slot] = []
            for i, j in ((i, j) for i in window for j in range(per_gpu)):
                fd = _try_lock(_lock_path(folder, gpus.ids[i], j), _note(note))
                if fd is None:
                    break
                held.append(Slot(gpus.platform, gpus.ids[i], i, j, _lock_path(folder, gpus.ids[i], j), fd))
            if len(held) == n * per_gpu:
                return held
            for s in held:
                s.release()
        if time.monotonic() >= deadline:
            paths = [_lock_path(folder, g, j) for g in gpus.ids for j in range(per_gpu)]
            raise SlotTimeout(f"no block of {n} free GPU(s) after {timeout:g} s among {gpus.count} ({gpus.how}): "
                              f"{_holders(paths)}. Wait for those processes or raise {TIMEOUT_ENV}")
        time.sleep(poll)


def block_env(block: list[Slot], env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment that shows the process exactly the block's GPUs, in the block's order."""
    out = pinned_env(block[0], 1, env)  # the block owns its GPUs whole: no memory fraction
    ids = list(dict.fromkeys(s.gpu for s in block))
    if block[0].platform == "rocm":
        out["ROCR_VISIBLE_DEVICES"] = ",".join(ids)
        out["HIP_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(len(ids)))
    else:
        out["CUDA_VISIBLE_DEVICES"] = ",".join(ids)
    out[HELD_ENV] = f"{','.join(ids)}:block"
    return out


def pinned_env(slot: Slot, per_gpu: int = 1, env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment that shows the process exactly the slot's GPU."""
    out = dict(os.environ if env is None else env)
    if slot.platform == "rocm":
        out["ROCR_VISIBLE_DEVICES"] = slot.gpu  # physical id
        out["HIP_VISIBLE_DEVICES"] = "0"        # index inside ROCR's list of one
        out.pop("CUDA_VISIBLE_DEVICES", None)   # HIP would apply it on top
    else:
        out["CUDA_VISIBLE_DEVICES"] = slot.gpu
    # JAX preallocates 75% of a GPU when its backend starts, a slow step each pinned process would
    # repeat for tests that use megabytes: allocate as needed instead. NumPy's OpenBLAS starts a
    # thread per core in every process and its idle threads spin, so parallel workers slow each
    # other's XLA compilations: one BLAS thread each (test references are small). Each only unless
    # the caller set it; the memory fraction still caps each process when several share a GPU.
    out.setdefault(PREALLOCATE_ENV, "false")
    for key in BLAS_THREADS_ENV:
        out.setdefault(key, "1")
    if per_gpu > 1 and MEM_FRACTION_ENV not in out:
        out[MEM_FRACTION_ENV] = f"{0.9 / per_gpu:.2f}"
    out[HELD_ENV] = f"{slot.gpu}:{slot.slot}"
    return out


def timeout_from_env(env: dict[str, str] | None = None) -> float:
    env = os.environ if env is None else env
    return float(env.get(TIMEOUT_ENV) or DEFAULT_TIMEOUT_S)
