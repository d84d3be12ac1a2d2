"""The GPUs this host has, asked of the drivers' tools (nvidia-smi, rocminfo) with a bound, without JAX: the GPU
slots, the toolchain's arch detection and `python -m jax_aiter info` all probe the host this way. Standard library
only (the pytest plugin loads it in every worker, and the installed package's `info` runs it).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess

TOOL_TIMEOUT_S = 10.0  # a GPU probe that takes longer is broken, not slow
KFD = "/dev/kfd"  # the amdgpu driver's compute device: every AMD GPU a ROCm program can use is behind it
KFD_ENV = "JA_KFD_PATH"  # where to look for it instead (a test's stand-in for a host with AMD GPUs)


def no_amd_gpu(env: dict[str, str]) -> str | None:
    """Why this host certainly has no AMD GPU (no /dev/kfd), else None (then ask rocminfo). A host with ROCm's
    user-space tools and no GPU (Debian's rocminfo on a build box) has rocminfo exit 1; that is not a broken probe."""
    node = env.get(KFD_ENV) or KFD
    return None if os.path.exists(node) else f"no {node}: no AMD GPU driver, so no AMD GPU"


def tool_lines(cmd: list[str], env: dict[str, str]) -> list[str] | str | None:
    """The tool's output lines; None when it is not installed; a str saying how it failed (exit status, hang)."""
    exe = shutil.which(cmd[0], path=env.get("PATH"))
    if not exe:
        return None
    shown = " ".join([exe, *cmd[1:]])
    try:  # its own process group, so a hung probe and anything it started are stopped together
        proc = subprocess.Popen([exe, *cmd[1:]], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    except OSError as e:
        return f"`{shown}` cannot run: {e}"
    try:
        stdout, stderr = proc.communicate(timeout=TOOL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.communicate()
        return f"`{shown}` gave no answer within {TOOL_TIMEOUT_S:g} s"
    if proc.returncode != 0:
        said = (stderr.strip() or stdout.strip()).splitlines()[:1]
        return f"`{shown}` exited with status {proc.returncode}" + (f" ({said[0][:200]})" if said else "")
    return stdout.splitlines()


# How each backend's tool names the archs of the GPUs present: nvidia-smi's compute capability (9.0 -> sm_90),
# rocminfo's agent names (gfx942).
ARCH_PROBES = {"cuda": (["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"], r"\s*(\d+)\.(\d+)\s*"),
               "rocm": (["rocminfo"], r"\s*Name:\s+(gfx[0-9a-f]+)\s*")}


def gpu_archs(backend: str, env: dict[str, str]) -> tuple[str, ...] | str | None:
    """The archs of this host's GPUs of `backend` (sm_90, gfx950; () when its tool lists none or, for ROCm, there
    is no /dev/kfd); None when its tool is not installed; a str saying how the tool failed."""
    cmd, pattern = ARCH_PROBES[backend]
    if backend == "rocm" and no_amd_gpu(env):
        return ()
    lines = tool_lines(cmd, env)
    if not isinstance(lines, list):
        return lines
    found = [m.groups() for m in map(re.compile(pattern).fullmatch, lines) if m]
    return tuple(dict.fromkeys(f"sm_{m[0]}{m[1]}" if backend == "cuda" else m[0] for m in found))


def present(env: dict[str, str] | None = None) -> tuple[dict[str, tuple[str, ...]], list[str]]:
    """({backend: archs} of the GPUs this host has, [how a probe failed]); a backend with no GPU is absent."""
    env = dict(os.environ if env is None else env)
    found: dict[str, tuple[str, ...]] = {}
    failed = []
    for backend in ARCH_PROBES:
        archs = gpu_archs(backend, env)
        if isinstance(archs, str):
            failed.append(archs)
        elif archs:
            found[backend] = archs
    return found, failed
