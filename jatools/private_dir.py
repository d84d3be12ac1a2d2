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
    moves it, both for the one-line error message, which also says how to repair the folder where that can help."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(folder)
    except FileExistsError:  # a file (or a symlink to one) where the folder should be
        raise PrivateDirError(f"refusing {folder} as {what}: it is a file, not a folder; {fix}, or remove the file"
                              ) from None
    except OSError as e:
        raise PrivateDirError(f"cannot use {folder} as {what}: {e.strerror or e}; {fix}") from None
    if stat.S_ISLNK(st.st_mode):
        raise PrivateDirError(f"refusing {folder} as {what}: it is a symlink or not a folder (a symlink to "
                              f"{os.readlink(folder)}), so what is written there would land wherever it points; "
                              f"{fix}, or put a real folder in its place")
    if not stat.S_ISDIR(st.st_mode):
        raise PrivateDirError(f"refusing {folder} as {what}: it is a symlink or not a folder; {fix}")
    if st.st_uid != os.getuid():
        raise PrivateDirError(f"refusing {folder} as {what}: it belongs to uid {st.st_uid}, not to you (uid "
                              f"{os.getuid()}), so its owner could plant a symlink or a file in it; {fix}")
    if st.st_mode & 0o022:
        raise PrivateDirError(f"refusing {folder} as {what}: others may write to it (mode "
                              f"{stat.S_IMODE(st.st_mode):o}), so another user could plant a symlink or a file in it; "
                              f"{fix}, or chmod 700 {folder}")
    return folder
