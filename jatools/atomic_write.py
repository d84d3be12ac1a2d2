"""Atomic file writes: a temporary file beside the target, then rename.

A reader sees the old file or the new one, never half of either; an
interrupted write leaves the previous good state, and the temporaries of a
killed writer (named with its pid) are removed by the next one.
"""
from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from jax_aiter.download import folder_lock

_PID_SUFFIX = re.compile(r"\.(?:tmp|old)-?(\d+)$")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # running, as another user
        pass
    return True


def remove_dead_temps(folder: Path, log: Callable[[str], None] = print) -> list[Path]:
    """Remove `.<name>.tmp-<pid>` / `.<name>.old-<pid>` files and folders in `folder` whose pid is not running
    (left by a killed write); never follows a symlink. Returns what was removed."""
    removed = []
    for p in sorted(Path(folder).iterdir()) if Path(folder).is_dir() else []:
        m = _PID_SUFFIX.search(p.name)
        if not p.name.startswith(".") or not m or int(m.group(1)) == os.getpid() or _alive(int(m.group(1))):
            continue
        log(f"removing {p}, left by process {m.group(1)}, which is no longer running")
        folder_lock.remove(p)
        removed.append(p)
    return removed


@contextlib.contextmanager
def _through_temp(path: Path, mode: str) -> Iterator:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, mode) as f:
            yield f
        os.replace(tmp, path)
    except OSError as e:
        if e.filename is None:  # a write or close that failed (a full disk) names no file: this one
            raise OSError(e.errno, e.strerror, str(path)) from e
        raise
    finally:
        tmp.unlink(missing_ok=True)


def open_bytes(path: Path) -> contextlib.AbstractContextManager[BinaryIO]:
    """A binary file to write `path` through: renamed into place when the block ends, deleted on an error."""
    return _through_temp(path, "wb")


def write_text(path: Path, text: str, errors: str = "strict") -> Path:
    """Write `text` as UTF-8 (errors="surrogateescape": a checkout path's bytes that are not UTF-8 pass unchanged)."""
    with _through_temp(path, "wb") as f:
        f.write(text.encode("utf-8", errors))
    return Path(path)
