"""Real mounts for the disk faults: a bind mount or a small tmpfs, skipped (saying why) where mounting is not
permitted, and a disk filled to the last block."""
from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def mounted(args: list[str], where: Path, what: str) -> Iterator[Path]:
    """`mount ARGS WHERE` for the block, unmounted after it; the test is skipped when it cannot be mounted."""
    where.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", *args, str(where)], capture_output=True, text=True, check=False)
    if r.returncode != 0:
        pytest.skip(f"cannot mount {what} here ({r.stderr.strip() or 'not permitted'}); the fault needs one")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False)


def fill(path: Path) -> None:
    """Write zeros to `path` until its disk is full."""
    with contextlib.suppress(OSError), open(path, "wb") as f:
        while True:
            f.write(bytes(4096))
            f.flush()
