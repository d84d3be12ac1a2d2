"""GPU slots: count the GPUs, take one (gpu, slot) lock, and pin a process to that GPU.

After XLA's parallel_gpu_execute: each GPU offers ``JA_TESTS_PER_GPU`` slots; a
slot is a non-blocking ``flock`` on ``<lock dir>/gpu<id>_slot<j>.lock``, tried
slot 0 on every GPU before slot 1, so concurrent tests spread over GPUs before
they share one. The pinned environment follows XLA's rules: CUDA gets
CUDA_VISIBLE_DEVICES=<id>; ROCm gets ROCR_VISIBLE_DEVICES=<physical id>,
HIP_VISIBLE_DEVICES=<index inside it> (0) and no CUDA_VISIBLE_DEVICES.

fcntl.flock, not filelock (which keeps its descriptor private): the pinned command inherits the
lock's descriptor, so the slot lives exactly as long as the command (docs/testing.md). Stdlib and
jax_aiter.settings only: it runs under a GPU host's bare Python.
"""
from __future__ import annotations

import collections
import errno
import fcntl
import os
import re
import stat
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from jatools.private_dir import PrivateDirError, own_folder
from jax_aiter import settings
from jax_aiter.host_gpus import no_amd_gpu, tool_lines

GPU_COUNT_ENV = "JA_GPU_COUNT"          # override: number of GPUs (skips rocminfo / nvidia-smi)
BACKEND_ENV = "JA_BACKEND"              # with the override: rocm makes them ROCm GPUs (else CUDA)
PER_GPU_ENV = "JA_TESTS_PER_GPU"        # slots per GPU (default 1)
LOCK_DIR_ENV = "JA_GPU_LOCK_DIR"        # where the slot locks live (one per host)
TIMEOUT_ENV = "JA_GPU_SLOT_TIMEOUT"     # seconds to wait for a free slot (default 900)
# How a process uses the slots: 0 never pins, 1 pins a run without xdist too (the pytest plugin), and
# "<gpu id>:<slot>" (or "<ids>:block") says it is pinned already: pinned_env and block_env set it.
SLOT_ENV = "JA_GPU_SLOT"
RECORD_ENV = "JA_GPU_SLOT_RECORD_DIR"   # a pinned pytest process writes <worker>.json there (its slot, devices, times)
PREALLOCATE_ENV = "XLA_PYTHON_CLIENT_PREALLOCATE"  # set to false in a pinned process unless given
MEM_FRACTION_ENV = "XLA_PYTHON_CLIENT_MEM_FRACTION"  # set when several slots share a GPU
BLAS_THREADS_ENV = ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS")  # 1 in a pinned process unless given
POOL_ENV = {"cuda": "CUDA_VISIBLE_DEVICES", "rocm": "ROCR_VISIBLE_DEVICES"}
DEFAULT_TIMEOUT_S = settings.NUMERIC[TIMEOUT_ENV].default
EXIT_NO_SLOT = 75  # EX_TEMPFAIL: the exit code of a command that found no free slot in time
POLL_S = 0.2  # between rounds of tries while waiting for a slot
NO_GPU_FIX = f"set {GPU_COUNT_ENV}=0 to run without GPUs, or {GPU_COUNT_ENV}=<n> to skip the probe"


class SlotTimeout(TimeoutError):
    """No slot became free within the bounded wait; the message says who holds them."""


class GpuSlotError(ValueError):
    """The GPUs or the lock folder cannot be trusted as set up; the message says what and how to fix it."""


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


def _check_pool(var: str, value: str, found: tuple[str, ...], uuids: tuple[str, ...], how: str) -> tuple[str, ...]:
    """An orchestrator's pool: every entry a detected GPU (index or UUID), none twice."""
    pool = tuple(v.strip() for v in value.split(",")) if value.strip() else ()
    bad = [v for v in pool if not (v in found or v in uuids or (not uuids and re.fullmatch(r"(GPU|MIG)-[\w-]+", v)))]
    if bad or len(set(pool)) != len(pool):
        why = (f"{', '.join(repr(b) for b in bad)} {'is' if len(bad) == 1 else 'are'} not a detected GPU "
               f"(detected: {', '.join(found)}{'; UUIDs ' + ', '.join(uuids) if uuids else ''})" if bad
               else "it names a GPU twice")
        raise GpuSlotError(f"{var}={value!r} cannot be used as the GPU pool: {why}; {how}. Give distinct GPU ids "
                           f"from this host, unset {var}, or {NO_GPU_FIX}")
    return pool


# (platform, probe, a GPU's line, how) in the order asked; a later probe runs only when the earlier found none.
PROBES = (("rocm", ["rocminfo"], r"\s*Name:\s+gfx", "rocminfo: {} gfx agents"),
          ("cuda", ["nvidia-smi", "-L"], r"GPU ", "nvidia-smi -L: {} GPUs"))


def detect(env: dict[str, str] | None = None) -> Gpus:
    """Count GPUs: JA_GPU_COUNT override (ROCm GPUs when JA_BACKEND=rocm, else CUDA), else `rocminfo` gfx
    agents, else `nvidia-smi -L`; an orchestrator's pool (ROCR_/CUDA_VISIBLE_DEVICES) gives the ids we may use."""
    env = dict(os.environ if env is None else env)
    uuids: tuple[str, ...] = ()
    if env.get(GPU_COUNT_ENV, "").strip():
        n = settings.from_env(GPU_COUNT_ENV, env)
        platform = "cpu" if n == 0 else "rocm" if env.get(BACKEND_ENV, "").strip().lower() == "rocm" else "cuda"
        found, how = tuple(str(i) for i in range(n)), f"{GPU_COUNT_ENV}={n}"
    else:
        platform, found, how, failed = "cpu", (), "no GPU: rocminfo and nvidia-smi found none", []
        for kind, cmd, pattern, said in PROBES:
            if kind == "rocm" and (none := no_amd_gpu(env)):
                how = f"no GPU: {none}, and nvidia-smi found none"
                continue  # rocminfo exits 1 there: that is the answer, not a broken probe
            out = tool_lines(cmd, env)
            if isinstance(out, str):
                failed.append(out)
            lines = [ln for ln in out if re.match(pattern, ln)] if isinstance(out, list) else []
            if kind == "cuda":
                dup = sorted(ln for ln, k in collections.Counter(ln.strip() for ln in lines).items() if k > 1)
                if dup:
                    raise GpuSlotError(f"`nvidia-smi -L` lists the same GPU more than once ({dup[0]!r}); the GPU "
                                       f"count cannot be trusted; fix the driver or tool, or {NO_GPU_FIX}")
                uuids = tuple(m.group(1) for ln in lines if (m := re.search(r"UUID:\s*([\w-]+)", ln)))
            if lines:
                platform, found, how = kind, tuple(str(i) for i in range(len(lines))), said.format(len(lines))
                break
        if platform == "cpu" and failed:
            raise GpuSlotError(f"cannot tell which GPUs this host has: {'; '.join(failed)}. A broken probe is not "
                               f"read as 'no GPU' (the command would run unpinned on every GPU); fix the driver, "
                               f"or {NO_GPU_FIX}")
    if platform == "cpu":
        return Gpus("cpu", (), how)
    pool_var = POOL_ENV[platform]
    if pool_var in env:
        pool = _check_pool(pool_var, env[pool_var], found, uuids, how)
        return Gpus(platform if pool else "cpu", pool, f"{how}; pool {pool_var}={env[pool_var]!r}")
    return Gpus(platform, found, how)


def held(env: dict[str, str] | None = None) -> str | None:
    """The slot this process is pinned to ("<gpu id>:<slot>", "<ids>:block"), or None when it is not pinned."""
    value = (os.environ if env is None else env).get(SLOT_ENV, "")
    return value if ":" in value else None


def tests_per_gpu(env: dict[str, str] | None = None) -> int:
    return settings.from_env(PER_GPU_ENV, env)


def lock_dir(env: dict[str, str] | None = None) -> Path:
    """JA_GPU_LOCK_DIR, else this user's own: under $XDG_RUNTIME_DIR, else <tmp>/jax-aiter-gpu-locks-<uid>."""
    env = os.environ if env is None else env
    if env.get(LOCK_DIR_ENV):
        return Path(env[LOCK_DIR_ENV])
    runtime = env.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime) and os.stat(runtime).st_uid == os.getuid():
        return Path(runtime) / "jax-aiter-gpu-locks"
    return Path(tempfile.gettempdir()) / f"jax-aiter-gpu-locks-{os.getuid()}"


def _own_folder(folder: Path) -> Path:
    """The lock folder, made or checked by jatools.private_dir (mode 0700, ours, not a symlink)."""
    try:
        return own_folder(folder, "the GPU lock folder", f"set {LOCK_DIR_ENV} to a folder of your own")
    except PrivateDirError as e:
        raise GpuSlotError(str(e)) from None


def slot_order(gpus: Gpus, per_gpu: int) -> list[tuple[int, int]]:
    """(pool index, slot) in the order they are tried: slot 0 on every GPU, then slot 1, ..."""
    return [(i, j) for j in range(per_gpu) for i in range(gpus.count)]


def _lock_path(folder: Path, gpu: str, slot: int) -> Path:
    return folder / f"gpu{re.sub(r'[^A-Za-z0-9_.-]', '_', gpu)}_slot{slot}.lock"


def _try_lock(path: Path, note: str) -> int | None:
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise GpuSlotError(f"{path} is a symlink; a GPU lock never follows one (it would overwrite the target). "
                               f"Remove it (rm {path}) or set {LOCK_DIR_ENV} to a folder of your own") from None
        raise GpuSlotError(f"cannot open the GPU lock {path}: {e.strerror or e}; set {LOCK_DIR_ENV} to a folder "
                           "of your own") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise GpuSlotError(f"{path} is not a regular file; remove it or set {LOCK_DIR_ENV} to a folder of your own")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{note}\n".encode(), 0)  # who holds it, for the timeout message
    return fd


def _text(path: Path, default: str = "") -> str:
    try:
        return path.read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return default


def _file_id(path: Path, follow: bool) -> tuple[int, int] | None:
    try:
        st = os.stat(path, follow_symlinks=follow)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def live_holders(path: Path) -> list[str]:
    """'pid N (command)' of every running process with the lock file open (from /proc/*/fd; the processes
    this user may inspect). Finds an orphaned child that inherited the lock from a killed holder."""
    lock, out = _file_id(path, False), []
    if lock is None:
        return out
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            fds = list((proc / "fd").iterdir())
        except OSError:
            continue
        if any(_file_id(fd, True) == lock for fd in fds):
            out.append(f"pid {proc.name} ({_text(proc / 'cmdline', '?')[:120]})")
    return out


def _holders(paths: list[Path]) -> str:
    parts = []
    for p in paths:
        who, live = _text(p) or "?", live_holders(p)
        note = re.match(r"pid (\d+)", who)
        if live and not (note and any(h.startswith(f"pid {note.group(1)} ") for h in live)):
            who = (f"taken by {who}, now held by live {', '.join(live)}: a child that kept the lock after its "
                   f"holder ended; stop it (kill {live[0].split()[1]}) to free the slot")
        elif live:
            who = f"{who}, live {', '.join(live)}"
        parts.append(f"{p.name}: {who}")
    return "; ".join(parts)


def _poll(gpus: Gpus, folder: Path, timeout: float, note: str | None, groups: list[list[tuple[int, int]]],
          timed_out: Callable[[list[Path]], str]) -> list[Slot]:
    """The first group of (pool index, slot) whose locks are all free, taken whole (a group partly taken is
    released at once), trying the groups in order until ``timeout`` seconds have passed; then SlotTimeout with
    ``timed_out(every lock path of the groups)``. ``folder`` is the lock folder, already checked (_own_folder)."""
    deadline = time.monotonic() + timeout
    while True:
        for group in groups:
            held: list[Slot] = []
            for i, j in group:
                path = _lock_path(folder, gpus.ids[i], j)
                if (fd := _try_lock(path, note or f"pid {os.getpid()}")) is None:
                    break
                held.append(Slot(gpus.platform, gpus.ids[i], i, j, path, fd))
            if len(held) == len(group):
                return held
            for s in held:
                s.release()
        if time.monotonic() >= deadline:
            raise SlotTimeout(timed_out(list(dict.fromkeys(_lock_path(folder, gpus.ids[i], j)
                                                           for group in groups for i, j in group))))
        time.sleep(POLL_S)


def acquire(gpus: Gpus, per_gpu: int = 1, folder: Path | None = None, timeout: float = DEFAULT_TIMEOUT_S,
            note: str | None = None) -> Slot:
    """Take the first free slot in slot_order, polling until ``timeout`` seconds have passed."""
    if gpus.count == 0:
        raise ValueError("acquire() needs at least one GPU; with none, run the command unpinned")
    folder = _own_folder(folder or lock_dir())
    (slot,) = _poll(gpus, folder, timeout, note, [[p] for p in slot_order(gpus, per_gpu)], lambda paths: (
        f"no free GPU slot after {timeout:g} s: {gpus.count} GPU(s) x {per_gpu} slot(s) ({gpus.how}), all held "
        f"({_holders(paths)}). Wait for those processes, raise "
        f"{TIMEOUT_ENV} or {PER_GPU_ENV}, or point {LOCK_DIR_ENV} elsewhere if the locks are stale copies from "
        "another host"))
    return slot


def acquire_all(gpus: Gpus, per_gpu: int = 1, folder: Path | None = None, timeout: float = DEFAULT_TIMEOUT_S,
                note: str | None = None) -> list[Slot]:
    """Take every slot of every GPU (exclusive use, e.g. the multigpu tier), one at a time in one fixed order,
    each held while the next is waited for."""
    folder = _own_folder(folder or lock_dir())
    deadline = time.monotonic() + timeout
    held: list[Slot] = []
    try:
        for i, j in sorted(slot_order(gpus, per_gpu)):
            held += _poll(gpus, folder, max(0.0, deadline - time.monotonic()), note, [[(i, j)]], lambda paths: (
                f"could not take every GPU slot for exclusive use within {timeout:g} s; {paths[0].name} is held "
                f"({_holders(paths)}). Wait for it or raise {TIMEOUT_ENV}"))
    except BaseException:
        for s in held:
            s.release()
        raise
    return held


def acquire_block(gpus: Gpus, n: int, per_gpu: int = 1, folder: Path | None = None,
                  timeout: float = DEFAULT_TIMEOUT_S, note: str | None = None) -> list[Slot]:
    """Take a block of ``n`` GPUs for one command that declares n devices (XLA's parallel_gpu_execute): every
    slot of each of its GPUs, so no single-GPU command shares one. Blocks are windows of n consecutive GPUs of
    the pool, tried in order, each taken all or nothing (two waiting blocks never hold pieces of each other)."""
    if not 1 <= n <= gpus.count:
        raise ValueError(f"a block of {n} GPU(s) cannot come from {gpus.count} ({gpus.how}); declare at most "
                         f"{gpus.count} or run on a host with more GPUs")
    windows = [[(i, j) for i in range(start, start + n) for j in range(per_gpu)] for start in range(gpus.count - n + 1)]
    folder = _own_folder(folder or lock_dir())
    return _poll(gpus, folder, timeout, note, windows, lambda paths: (
        f"no block of {n} free GPU(s) after {timeout:g} s among {gpus.count} ({gpus.how}): {_holders(paths)}. "
        f"Wait for those processes or raise {TIMEOUT_ENV}"))


def block_env(block: list[Slot], env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment that shows the process exactly the block's GPUs, in the block's order."""
    ids = list(dict.fromkeys(s.gpu for s in block))
    return _pinned(block[0].platform, ids, 1, env, f"{','.join(ids)}:block")  # owned whole: no memory fraction


def pinned_env(slot: Slot, per_gpu: int = 1, env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment that shows the process exactly the slot's GPU."""
    return _pinned(slot.platform, [slot.gpu], per_gpu, env, f"{slot.gpu}:{slot.slot}")


def _pinned(platform: str, ids: list[str], per_gpu: int, env: dict[str, str] | None, held: str) -> dict[str, str]:
    out = dict(os.environ if env is None else env)
    if platform == "rocm":
        out["ROCR_VISIBLE_DEVICES"] = ",".join(ids)  # physical ids
        out["HIP_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(len(ids)))  # indices inside ROCR's list
        out.pop("CUDA_VISIBLE_DEVICES", None)  # HIP would apply it on top
    else:
        out["CUDA_VISIBLE_DEVICES"] = ",".join(ids)
    # Each only unless the caller set it. No preallocation: JAX would reserve 75% of the GPU at backend start,
    # a slow step per process for tests that use megabytes. One BLAS thread: NumPy's OpenBLAS spins a thread
    # per core in every process and slows the other workers' XLA compilations. The memory fraction caps each
    # process when several share a GPU.
    out.setdefault(PREALLOCATE_ENV, "false")
    for key in BLAS_THREADS_ENV:
        out.setdefault(key, "1")
    if per_gpu > 1 and MEM_FRACTION_ENV not in out:
        out[MEM_FRACTION_ENV] = f"{0.9 / per_gpu:.2f}"
    out[SLOT_ENV] = held
    return out


def timeout_from_env(env: dict[str, str] | None = None) -> float:
    return settings.from_env(TIMEOUT_ENV, env)
