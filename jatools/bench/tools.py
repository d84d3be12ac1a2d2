"""The anchor tools (the reference's commands): where they are, their versions, and how to install a missing one."""
from __future__ import annotations

import shutil
import subprocess

INSTALL = {
    "zstd": "apt-get install -y zstd",
    "curl": "apt-get install -y curl",
    "sha256sum": "apt-get install -y coreutils",
    "make": "apt-get install -y make",
    "nox": "pip install nox",
}


class AnchorMissing(RuntimeError):
    """An anchor tool is not installed; the benchmark is reported as not run, with the install command."""


def require(*names: str) -> dict[str, str]:
    """{name: path} of each tool; AnchorMissing names every missing one and how to install it."""
    found = {n: shutil.which(n) for n in names}
    missing = [n for n, p in found.items() if p is None]
    if missing:
        raise AnchorMissing("; ".join(f"{n} is not installed (install it with `{INSTALL.get(n, f'apt-get install -y {n}')}`)"
                                      for n in missing))
    return found  # type: ignore[return-value]


def version(cmd: list[str]) -> str | None:
    """The first line a tool prints for its version, or None when it is not installed."""
    if shutil.which(cmd[0]) is None:
        return None
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (out.stdout or out.stderr).strip()
    return text.splitlines()[0] if text else None


VERSION_COMMANDS = {
    "zstd": ["zstd", "--version"], "curl": ["curl", "--version"], "sha256sum": ["sha256sum", "--version"],
    "openssl": ["openssl", "version"], "make": ["make", "--version"], "nox": ["nox", "--version"],
    "ninja": ["ninja", "--version"], "g++": ["g++", "--version"], "uv": ["uv", "--version"],
}


def versions() -> dict[str, str | None]:
    return {name: version(cmd) for name, cmd in VERSION_COMMANDS.items()}


def run(cmd: list[str] | str, **kwargs) -> subprocess.CompletedProcess:
    """Run an anchor command; a failure raises with its output (an anchor that fails is not a time)."""
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, **kwargs)
    if out.returncode != 0:
        shown = cmd if isinstance(cmd, str) else " ".join(map(str, cmd))
        raise RuntimeError(f"`{shown}` failed (exit {out.returncode}): {(out.stderr or out.stdout)[-2000:]}")
    return out
