"""Who else could change a folder or file the runtime loads code from, or a fetch writes libraries into.

A library folder another user can write to lets that user swap a library for code that then runs as whoever
loads it (root included). So, as the GPU-slot locks refuse a lock folder others may write to, the loader refuses
a library whose folder or file others may write to, and the fetch refuses to install into such a folder and never
makes one (whatever the umask). Trusted: owned by this user or by root, with no write bit for group or others.
Standard library only: the runtime reads it.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

SAFE_DIR_MODE = 0o755   # a folder the fetch makes: chmod-ed so, not left to the umask
SAFE_FILE_MODE = 0o644  # a file it writes (the libraries: 0o755)


def others_can_write(path: Path, parent: bool = False) -> str | None:
    """Why a user other than this one (or root) could change what `path` holds, or None when nobody can.

    `parent`: `path` is a folder that only holds the folder in question (the fetch's destination's parent); its
    sticky bit (/tmp) keeps others from renaming or removing what this user made in it, so it is trusted then.
    A path that does not exist is None (nothing to trust yet)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    me = os.getuid()
    if st.st_uid not in (me, 0):
        return f"it belongs to uid {st.st_uid}, not to you (uid {me}) or root, so its owner can change it"
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o022 and not (parent and stat.S_ISDIR(st.st_mode) and mode & stat.S_ISVTX):
        who = "group and others" if mode & 0o022 == 0o022 else "others" if mode & 0o002 else "its group"
        return f"{who} may write to it (mode {mode:o})"
    return None


def fix(path: Path) -> str:
    """The command that takes others' write access away."""
    return f"chmod go-w {path}"


def make_folders(folder: Path) -> None:
    """mkdir -p `folder`, each folder it makes mode SAFE_DIR_MODE whatever the umask (umask 000 made them 777)."""
    missing = []
    here = Path(folder)
    while not here.exists() and here != here.parent:
        missing.append(here)
        here = here.parent
    for made in reversed(missing):
        try:
            made.mkdir()
        except FileExistsError:
            continue
        made.chmod(SAFE_DIR_MODE)
