"""A folder of this user's own, for state several processes share (GPU slot locks, the compiler cache).

A shared folder that another user could write to, or a symlink planted where it should be, would let that
user redirect what we write (a lock that truncates their target, a cache entry that becomes our object file).
So the folder is created with mode 0700 (every missing parent too) and then checked with lstat, which never
follows a symlink: a real folder, owned by us, that nobody else may write. Standard library only.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path


class PrivateDirError(RuntimeError):
    """The folder cannot be made, or is not safe to use; the message says why and how to fix it."""


def own_folder(folder: Path, what: str, fix: str) -> Path:
    """Create `folder` (mode 0700) or check an existing one; `what` names its use and `fix` the setting that
    moves it, both for the error message."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(folder)
    except OSError as e:
        raise PrivateDirError(f"cannot use {folder} as {what}: {e.strerror or e}; {fix}") from None
    problem = ("it is a symlink or not a folder" if not stat.S_ISDIR(st.st_mode)
               else f"it belongs to uid {st.st_uid}, not to you (uid {os.getuid()})" if st.st_uid != os.getuid()
               else f"others may write to it (mode {stat.S_IMODE(st.st_mode):o})" if st.st_mode & 0o022 else None)
    if problem:
        raise PrivateDirError(f"refusing {folder} as {what}: {problem}, so another user could plant a symlink or "
                              f"a file in it. {fix}, or fix it (chmod 700 {folder}, or remove it if it is not "
                              "yours to keep)")
    return folder
