"""sha256 of large files: streamed with big buffers, several files in parallel.

hashlib releases the GIL while it hashes a large buffer, so threads hash files
(and large chunks) concurrently. Used at every hand-off: build, stage, wheel,
install and fetch.
"""
from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterable

CHUNK = 8 << 20  # 8 MiB reads keep syscall overhead negligible


def sha256_file(path: str | os.PathLike, chunk: int = CHUNK) -> str:
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(chunk)
        view = memoryview(buf)
        while True:
            n = f.readinto(buf)
            if not n:
                break
            h.update(view[:n])
    return h.hexdigest()


def sha256_files(paths: Iterable[str | os.PathLike], workers: int | None = None) -> dict[str, str]:
    """{str(path): hex digest} for every path, hashed concurrently."""
    paths = [str(p) for p in paths]
    if not paths:
        return {}
    workers = workers or min(len(paths), os.cpu_count() or 1)
    if workers <= 1:
        return {p: sha256_file(p) for p in paths}
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return dict(zip(paths, pool.map(sha256_file, paths)))


def file_entry(path: Path, digest: str | None = None) -> dict:
    """The per-file record used by build records and manifests."""
    return {"name": path.name, "size": path.stat().st_size, "sha256": digest or sha256_file(path)}


class IntegrityError(RuntimeError):
    """Bytes differ from what a record says; the message names the file and both hashes."""


def verify_entries(folder: Path, entries: Iterable[dict], workers: int | None = None) -> None:
    """Check files in `folder` against {name, size, sha256} entries; raise on the first difference."""
    entries = list(entries)
    missing = [e["name"] for e in entries if not (folder / e["name"]).is_file()]
    if missing:
        raise IntegrityError(f"missing in {folder}: {', '.join(missing)}")
    digests = sha256_files([folder / e["name"] for e in entries], workers)
    for e in entries:
        got = digests[str(folder / e["name"])]
        if got != e["sha256"]:
            raise IntegrityError(
                f"{folder / e['name']}: sha256 {got} does not match the recorded {e['sha256']}"
            )
