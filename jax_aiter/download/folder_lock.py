"""An exclusive lock on a folder itself: writers of one folder take turns.

The fetch (into a library folder's parent), the build tree's runs (make, the JIT build, nox: its build/ folder)
and the publisher (its staging and target folders) each hold it while they write, so
two runs never interleave their writes, and a run that holds it may remove what killed runs left behind. It is a
flock on the folder's own descriptor: no lock file is made (a lock file outlived every run, and removing one safely
races with a run waiting on it). The folder is opened with O_NOFOLLOW: a symlink is never followed.

The holder writes a note in the folder (NOTE: its pid, what it is, since when), removed when it lets go, so a run
that waits says which run it waits for; and a process under the holder (nox -> make -> the JIT build: each takes the
lock of the one build tree) finds its own ancestor's pid there and goes on under that lock instead of waiting for
it forever. Standard library only: the runtime's fetch takes it.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Callable
from pathlib import Path


class FolderLockError(OSError):
    """The folder cannot be locked (not a real folder, or another run held it past the wait)."""


NOTE = ".lock-holder"  # the holder's note in the locked folder: {"pid", "what", "since"}


def ancestors() -> set[int]:
    """This process and every process above it (Linux /proc; just this one where /proc cannot be read)."""
    pids, pid = set(), os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                pid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return pids


def holder(folder: Path) -> dict | None:
    """The note of the run that holds (or last held) `folder`'s lock; None when there is none, or it is unreadable.
    A symlink planted in its place is not followed."""
    try:
        fd = os.open(Path(folder) / NOTE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            note = json.loads(f.read(4096))
    except (OSError, ValueError):
        return None
    return note if isinstance(note, dict) and isinstance(note.get("pid"), int) else None


def describe(note: dict | None) -> str:
    """Which run holds a lock, in words, from its note."""
    if note is None:
        return "a run that left no note of itself"
    since = (time.strftime("%H:%M:%S", time.localtime(note["since"])) if isinstance(note.get("since"), int | float)
             else "?")
    return f"pid {note['pid']}, `{note.get('what', '?')}`, since {since}"


class FolderLock:
    """flock(LOCK_EX) on `folder`'s descriptor; released by release() (or `with`), or when the process ends."""

    def __enter__(self) -> FolderLock:  # noqa: PYI034 (a final class in effect)
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __init__(self, folder: Path, fd: int | None = None):
        """The lock of `folder`, through its own new descriptor, or `fd`, one this process inherited (scripts/run.sh
        opens the folder and hands the descriptor over, so the lock stays with the shell after this process ends)."""
        self.folder = Path(folder)
        self._fd = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC) if fd is None \
            else fd
        self._noted: int | None = None  # the pid this lock's note names, once written
        self.above = False  # held by a process above this one: this one goes on under that lock

    def held_above(self) -> bool:
        """Whether the run holding this folder's lock is this process or one above it (its note names it)."""
        note = holder(self.folder)
        return note is not None and note["pid"] in ancestors()

    def note(self, what: str, pid: int | None = None) -> None:
        """Say in the folder who holds the lock (`pid`: this process unless given), replacing any earlier note by
        rename; a symlink planted at the note's name is replaced, never followed."""
        pid = os.getpid() if pid is None else pid
        tmp = self.folder / f"{NOTE}.tmp-{os.getpid()}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            with os.fdopen(fd, "w") as f:
                json.dump({"pid": pid, "what": what, "since": int(time.time())}, f)
            os.replace(tmp, self.folder / NOTE)
            self._noted = pid
        except OSError:  # a note is a courtesy to a waiting run: a folder that refuses it does not stop this one
            with contextlib.suppress(OSError):
                os.unlink(tmp)

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
        if self._noted is not None and (holder(self.folder) or {}).get("pid") == self._noted:
            with contextlib.suppress(OSError):
                os.unlink(self.folder / NOTE)  # before the flock drops: a next holder's note is never removed
        self._noted = None
        if self._fd >= 0:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = -1

    def release_descriptor(self) -> None:
        """Close this process's descriptor only: the lock and its note stay with the process that handed it over."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def take(lock: FolderLock, what: str, say: Callable[[str], None], timeout: float | None = None,
         pid: int | None = None) -> bool:
    """Hold `lock`: at once; or go on under it when the run holding it is this process or one above it
    (lock.above); or say which run holds it and wait (False when `timeout` passed first). The holder's note names
    `what` and `pid` (this process unless given)."""
    if not lock.acquire(timeout=0):
        if lock.held_above():
            lock.above = True
            lock.release_descriptor()
            return True
        say(f"{what}: another run writing into {lock.folder} holds its lock; waiting for it: "
            f"{describe(holder(lock.folder))}")
        if not lock.acquire(timeout=timeout):
            return False
    lock.note(what, pid)
    return True


def hold(folder: Path, what: str, say: Callable[[str], None], timeout: float | None = None) -> FolderLock:
    """The lock on `folder`, held (or held by a process above this one): at once, or after saying (`say`) which run
    holds it and waiting for it. FolderLockError when `folder` is not a real folder, or when `timeout` passed first."""
    try:
        lock = FolderLock(folder)
    except OSError as e:
        raise FolderLockError(f"cannot lock {folder} for {what}: {e.strerror or e} (it must be a real folder, not a "
                              "symlink)") from None
    if not take(lock, what, say, timeout):
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
