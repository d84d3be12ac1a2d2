"""The sdist: jax_aiter-<version>.tar.gz with PKG-INFO and exactly what a rebuild needs ([tool.jax-aiter]
sdist_include less sdist_exclude), reproducible. `python -m jatools.wheel.wheel_build --sdist` and the build
backend's build_sdist (`python -m build --sdist`) write it; installing it builds the libraries on the
installing machine (build_backend.py, docs/wheels.md).
"""
from __future__ import annotations

import fnmatch
import gzip
import io
import os
import tarfile
from pathlib import Path

from jatools import atomic_write, config
from jatools.wheel.dist_metadata import (
    FILE_MODE,
    LIB_MODE,
    WheelBuildError,
    default_epoch,
    file_name,
    metadata_text,
    project_table,
)


def sdist_files(root: Path) -> list[str]:
    """The files a rebuild needs ([tool.jax-aiter] sdist_include less sdist_exclude), sorted, as posix paths."""
    raw, out = config.defaults(root), set()
    for entry in raw["sdist_include"]:
        top = root / entry
        if not top.exists():
            raise WheelBuildError(f"pyproject.toml [tool.jax-aiter] sdist_include names {entry!r}, which is not in "
                                  f"{root}; restore it or drop it from the list")
        paths = [top] if top.is_file() else sorted(q for q in top.rglob("*") if q.is_file() or q.is_symlink())
        for q in paths:
            if q.is_symlink():
                raise WheelBuildError(f"{q} is a symbolic link; an sdist carries files only: replace it with the file "
                                      "or add it to [tool.jax-aiter] sdist_exclude")
            rel = q.relative_to(root).as_posix()
            if not any(fnmatch.fnmatchcase(rel, pat) or fnmatch.fnmatchcase(q.name, pat)
                       for pat in raw.get("sdist_exclude", [])):
                out.add(rel)
    return sorted(out)


def sdist(root: Path, dist_dir: Path) -> Path:
    """jax_aiter-<version>.tar.gz with PKG-INFO and what a rebuild needs; reproducible (sorted members, owner 0,
    timestamps from SOURCE_DATE_EPOCH or the HEAD commit, gzip without a time stamp)."""
    project = project_table(root)
    base, epoch = f"{file_name(project)}-{project['version']}", default_epoch(root)
    out = dist_dir / f"{base}.tar.gz"
    metadata, _ = metadata_text(project, project["version"], root)

    def info(name: str, size: int, mode: int) -> tarfile.TarInfo:
        ti = tarfile.TarInfo(f"{base}/{name}")
        ti.size, ti.mode, ti.mtime, ti.uid, ti.gid, ti.uname, ti.gname = size, mode, epoch, 0, 0, "", ""
        return ti

    with atomic_write.open_bytes(out) as f, \
            gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(info("PKG-INFO", len(metadata), FILE_MODE), io.BytesIO(metadata))
        for rel in sdist_files(root):
            with open(root / rel, "rb") as src:
                tar.addfile(info(rel, (root / rel).stat().st_size,
                                 LIB_MODE if os.access(root / rel, os.X_OK) else FILE_MODE), src)
    return out
