"""An exclusive lock on a folder itself: writers of one folder take turns.

The fetch (into a library folder's parent), the JIT build (its build tree's build/ folder, which holds
aiter_build/) and the publisher (its staging and target folders) each hold it while they write, so two runs never
interleave their writes, and a run that holds it may remove what killed runs left behind. It is a flock on the
folder's own descriptor: no lock file is made, so none is left behind (a lock file outlived every run, and
removing one safely races with a run waiting on it). The folder is opened with O_NOFOLLOW: a symlink is never
followed. Standard library only: the runtime's fetch takes it.
"""
from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable
from pathlib import Path


class FolderLockError(OSError):
    """The folder cannot be locked (not a real folder, or another run held it past the wait)."""


class FolderLock:
    """flock(LOCK_EX) on `folder`'s descriptor; released by release() (or `with`), or when the process ends."""

    def __enter__(self) -> FolderLock:  # noqa: PYI034 (a final class in effect)
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self._fd = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)

    def acquire(self, timeout: float | None) -> bool:
        """True once held; False when `timeout` seconds passed first (None: wait as long as it takes)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if deadline is not None and time.monotonic() >= deadline:
                    return False
                time.sleep(0.05 if deadline is None else min(0.05, max(0.0, deadline - time.monotonic())))

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = -1


def hold(folder: Path, what: str, say: Callable[[str], None], timeout: float | None = None) -> FolderLock:
    """The lock on `folder`, held: at once, or after saying (`say`) that another run holds it and waiting for it.
    FolderLockError when `folder` is not a real folder, or when `timeout` passed first."""
    try:
        lock = FolderLock(folder)
    except OSError as e:
        raise FolderLockError(f"cannot lock {folder} for {what}: {e.strerror or e} (it must be a real folder, not a "
                              "symlink)") from None
    if not lock.acquire(timeout=0):
        say(f"{what}: another run writing into {folder} holds its lock; waiting for it")
        if not lock.acquire(timeout=timeout):
            lock.release()
            raise FolderLockError(f"another run writing into {folder} held its lock for more than {timeout:g} s; "
                                  "wait for it or stop it, then run again")
    return lock


def remove(path: Path) -> None:
    """Remove a leftover file or folder; a symlink is removed, never followed."""
    import shutil

    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def remove_leftovers(folder: Path, pattern: str, say: Callable[[str], None], what: str) -> list[Path]:
    """Remove what killed runs left in `folder` (names matching `pattern`: their temporary files and folders). Call
    it holding the folder's lock: no live run's temporaries are there then."""
    gone = sorted(folder.glob(pattern))
    for stale in gone:
        say(f"{what}: removing leftovers of an interrupted run: {stale}")
        remove(stale)
    return gone
