"""The build tree's lock: one run at a time writes a checkout's build tree and its tools' environments.

    python -m jatools.native.tree_lock --what 'make umbrella' -- COMMAND...     (the Makefile runs make under it)
    python -m jatools.native.tree_lock --print-folder                            (scripts/run.sh: which folder)
    python -m jatools.native.tree_lock --what TEXT --fd N                       (scripts/run.sh: its descriptor N)

Two `make umbrella` at once in one tree raced on the umbrella's temporary file (4 of 4 failed), two `nox -s jit` did
too, and two first runs of scripts/run.sh made one tools' environment at once (one died inside ensurepip). So make,
nox (for its whole run, its virtualenvs included: noxfile.py), the JIT build, a fetch into the tree and run.sh's
setup of .venv-tools take one lock: jax_aiter/download/folder_lock.py's, on the build folder (JA_BUILD_DIR, resolved: a
build/ that is a symlink to a bigger disk is that disk's folder). A second run says which run it waits for (pid,
command, since when), then waits. A run started under the holder (nox -> make -> the JIT build) goes on under the
holder's lock. Standard library only: make runs it with whatever Python it is given.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from jatools import config
from jatools.native import toolchain
from jax_aiter.download import folder_lock


def folder(env: dict[str, str] | None = None, given: str | None = None) -> Path:
    """The build folder the lock is on (`given`, make's $(BUILD), else JA_BUILD_DIR), made when missing, resolved."""
    env = dict(os.environ if env is None else env)
    path = config.repo_root() / (given or str(config.setting("JA_BUILD_DIR", env)))
    path.mkdir(parents=True, exist_ok=True)
    return path.resolve()


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def hold(what: str, env: dict[str, str] | None = None) -> folder_lock.FolderLock:
    """The build tree's lock, held for this process (or by a process above it) until released or the process ends;
    FolderLockError (one line) when the build folder cannot be locked."""
    return folder_lock.hold(folder(env), what, _say)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m jatools.native.tree_lock", description=__doc__.splitlines()[0])
    p.add_argument("--folder", help="the build folder (default: JA_BUILD_DIR, else pyproject build_dir)")
    p.add_argument("--what", default="a run", help="what runs under the lock, for the note a waiting run reads")
    p.add_argument("--fd", type=int, help="take the lock through this inherited descriptor of the build folder, and "
                   "leave it (and its note, naming the parent process) with the process that opened it")
    p.add_argument("--print-folder", action="store_true", help="print the build folder the lock is on (made)")
    p.add_argument("command", nargs="*", help="the command to run under the lock (after --)")
    a = p.parse_args(argv)
    try:
        if a.print_folder:
            print(folder(given=a.folder))
            return 0
        if a.fd is not None:
            lock = folder_lock.FolderLock(folder(given=a.folder), fd=a.fd)
            folder_lock.take(lock, a.what, _say, pid=os.getppid())
            lock.release_descriptor()
            return 0
        with folder_lock.hold(folder(given=a.folder), a.what, _say):
            # close_fds=False: make's jobserver descriptors reach the make it runs (GNU make 4.3 passes them so)
            return subprocess.run(a.command, check=False, close_fds=False).returncode
    except (folder_lock.FolderLockError, config.SettingError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a read-only checkout, a full disk: the path and the fix, as the build's first write says
        print(f"error: {toolchain.build_tree_unwritable(Path(e.filename or a.folder or 'build'), e)}",
              file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
