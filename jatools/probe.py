"""Ask a machine tool (nvidia-smi, rocminfo) a question, with a bound: the GPU slots and the toolchain's arch
detection both probe the host this way. Standard library only (the pytest plugin loads it in every worker).
"""
from __future__ import annotations

import os
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
