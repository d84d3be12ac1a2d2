#!/usr/bin/env python3
"""Run a command on one GPU slot (after XLA's parallel_gpu_execute), on a block of N GPUs, or on all exclusively.

    python3 -m ci.parallel_gpu_execute [--gpus N | --exclusive] [--timeout S] -- CMD [ARGS...]

Takes the first free (gpu, slot) lock (slot 0 on every GPU before slot 1), sets
CUDA_VISIBLE_DEVICES (CUDA) or ROCR_VISIBLE_DEVICES + HIP_VISIBLE_DEVICES (ROCm)
to that GPU and execs the command with the lock descriptor open, so the slot
is held exactly as long as the command runs and its exit code is this
script's. ``--gpus N`` (a command or test that declares N devices) takes a block
of N GPUs, a lock on each (every slot of it), and pins the command to the block,
so a 2-GPU test and 1-GPU tests share a 4-GPU host without waiting for all of it.
``--exclusive`` takes every slot and leaves the devices unpinned (the multigpu
tier). With no GPU the command runs unpinned.

Environment: JA_TESTS_PER_GPU (slots per GPU, 1), JA_GPU_SLOT_TIMEOUT (seconds,
900), JA_GPU_LOCK_DIR (lock folder), JA_GPU_COUNT (override the count; ROCm GPUs with
JA_BACKEND=rocm). Exit 75 when no slot frees up in time, 2 on bad usage.
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys

from jatools.testing import gpu_slots
from jax_aiter import settings


def _say(msg: str) -> None:
    print(f"parallel_gpu_execute: {msg}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m ci.parallel_gpu_execute", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--exclusive", action="store_true", help="hold every slot of every GPU; leave devices unpinned")
    p.add_argument("--gpus", type=int, default=1, metavar="N",
                   help="the devices the command declares: a block of N GPUs, each held whole (default 1: one slot)")
    p.add_argument("--timeout", type=settings.flag_type(gpu_slots.TIMEOUT_ENV, "--timeout"), default=None,
                   help="seconds to wait for a slot (JA_GPU_SLOT_TIMEOUT)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="the command (after --)")
    a = p.parse_args(argv)
    if a.gpus < 1:  # before any GPU is counted: the number is wrong whatever the host has
        p.error(f"--gpus {a.gpus}: give the number of devices the command declares, 1 or more")
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        p.error("give the command to run after --")
    held, env = [], dict(os.environ)
    try:
        gpus = gpu_slots.detect()
        per_gpu = gpu_slots.tests_per_gpu()
        timeout = a.timeout if a.timeout is not None else gpu_slots.timeout_from_env()
        note = f"pid {os.getpid()}: {shlex.join(cmd)[:200]}"
        if gpus.count == 0:
            _say(f"{gpus.how}; running unpinned: {shlex.join(cmd)}")
        elif a.exclusive:
            held = gpu_slots.acquire_all(gpus, per_gpu, timeout=timeout, note=note)
            _say(f"exclusive: all {gpus.count} GPU(s) x {per_gpu} slot(s) ({gpus.how}), unpinned")
        else:
            if a.gpus != 1:
                held = gpu_slots.acquire_block(gpus, a.gpus, per_gpu, timeout=timeout, note=note)
                env, where = gpu_slots.block_env(held), f"block of {a.gpus} GPU(s)"
            else:
                held = [gpu_slots.acquire(gpus, per_gpu, timeout=timeout, note=note)]
                env, where = gpu_slots.pinned_env(held[0], per_gpu), f"GPU {held[0].gpu} slot {held[0].slot}"
            shown = " ".join(f"{k}={env[k]}" for k in ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
                                                       "HIP_VISIBLE_DEVICES") if k in env)
            _say(f"{where} ({gpus.how}) {shown}")
    except gpu_slots.SlotTimeout as e:
        _say(str(e))
        return gpu_slots.EXIT_NO_SLOT
    except ValueError as e:  # bad settings; a block larger than the host; a lock folder or lock that cannot be trusted
        _say(str(e))
        return 2
    for slot in held:
        os.set_inheritable(slot.fd, True)  # the command holds the lock from here on
    try:
        os.execvpe(cmd[0], cmd, env)
    except OSError as e:
        _say(f"cannot run {cmd[0]!r}: {e}")
    return 127


if __name__ == "__main__":
    sys.exit(main())
