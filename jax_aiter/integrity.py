"""sha256 of large files: streamed with big buffers, several files in parallel.

hashlib (OpenSSL, SHA extensions where the CPU has them) releases the GIL while
it hashes a buffer, so threads hash different files truly in parallel. sha256
is sequential within one file, so the parallelism is across files: they are
scheduled largest first, which keeps every core busy until the end (the JIT
libraries are 1.3 GB, 1.0 GB and 167 MB). Used at every hand-off: build,
stage, wheel, install and fetch.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import mmap
import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

CHUNK = 1 << 20  # reads of 1 MiB stay in the CPU cache between the copy and the hash
MMAP_MIN = 16 << 20  # larger files are hashed straight from the page cache (no copy)
MMAP_STEP = 8 << 20


def sha256_file(path: str | os.PathLike, chunk: int = CHUNK) -> str:
    """sha256 of one file; large files through mmap, which saves the kernel-to-user copy (about a
    third of the CPU time of reading), small ones through a reused buffer."""
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        if size >= MMAP_MIN:
            with mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
                m.madvise(mmap.MADV_SEQUENTIAL)
                with memoryview(m) as view:
                    for start in range(0, size, MMAP_STEP):
                        h.update(view[start:start + MMAP_STEP])
            return h.hexdigest()
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
    paths = list(dict.fromkeys(str(p) for p in paths))
    if not paths:
        return {}
    workers = workers or min(len(paths), os.cpu_count() or 1)
    if workers <= 1:
        return {p: sha256_file(p) for p in paths}
    largest_first = sorted(paths, key=lambda p: os.stat(p).st_size, reverse=True)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        digests = dict(zip(largest_first, pool.map(sha256_file, largest_first)))
    return {p: digests[p] for p in paths}


def file_entry(path: Path, digest: str | None = None) -> dict:
    """The per-file record used by build records and manifests."""
    return {"name": path.name, "size": path.stat().st_size, "sha256": digest or sha256_file(path)}


class IntegrityError(RuntimeError):
    """Bytes differ from what a record says; the message names the file and both hashes."""


RECORD_NAME = "build_record.json"  # written beside the libraries it records, last
RECORD_SCHEMA = 1  # the build record's schema: the JIT build, a fetch, a shard merge and the umbrella's write it
MAX_RECORD_BYTES = 16 << 20  # a record or manifest is a few KB; anything this big is not one


def read_record(path: Path, fix: str = "") -> dict[str, dict]:
    """{name: {name, size, sha256}} from a record or manifest's `files`; IntegrityError names the file and
    what is wrong (not JSON, no `files`, a bad entry)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_RECORD_BYTES + 1)
    except OSError as e:
        raise IntegrityError(f"cannot read {path}: {e.strerror or e}{fix}") from None
    if len(data) > MAX_RECORD_BYTES:
        raise IntegrityError(f"{path} is larger than {MAX_RECORD_BYTES} bytes; it is not a record{fix}")
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise IntegrityError(f"{path} is not valid JSON ({e}){fix}") from None
    files = obj.get("files") if isinstance(obj, dict) else None
    if not isinstance(files, list):
        raise IntegrityError(f"{path} has no `files` list of {{name, size, sha256}} entries{fix}")
    out = {}
    for i, e in enumerate(files):
        ok = isinstance(e, dict) and isinstance(e.get("name"), str) and isinstance(e.get("sha256"), str) and \
            isinstance(e.get("size"), int) and not isinstance(e.get("size"), bool)
        if not ok or e["name"] in out:
            raise IntegrityError(f"{path}: files[{i}] is not a unique {{name, size, sha256}} entry{fix}")
        out[e["name"]] = {"name": e["name"], "size": e["size"], "sha256": e["sha256"]}
    return out


def diff_entries(folder: Path, entries: Iterable[dict], workers: int | None = None) -> list[str]:
    """Every difference between `folder` and {name, size, sha256} entries, one line each.

    Sizes are compared first (free); files of the right size are hashed in
    parallel. Each line names the file and both values.
    """
    problems: list[str] = []
    to_hash: list[dict] = []
    for e in entries:
        path = Path(folder) / e["name"]
        if not path.is_file():
            problems.append(f"{path}: missing (recorded size {e['size']}, sha256 {e['sha256']})")
        elif path.stat().st_size != e["size"]:
            problems.append(f"{path}: size {path.stat().st_size} does not match the recorded {e['size']} "
                            f"(recorded sha256 {e['sha256']})")
        else:
            to_hash.append(e)
    digests = sha256_files([Path(folder) / e["name"] for e in to_hash], workers)
    for e in to_hash:
        path = Path(folder) / e["name"]
        got = digests[str(path)]
        if got != e["sha256"]:
            problems.append(f"{path}: sha256 {got} does not match the recorded {e['sha256']}")
    return problems


def verify_entries(folder: Path, entries: Iterable[dict], workers: int | None = None) -> None:
    """Check files in `folder` against {name, size, sha256} entries; raise naming every difference."""
    problems = diff_entries(folder, entries, workers)
    if problems:
        raise IntegrityError("; ".join(problems))


def record_files(paths: Iterable[Path]) -> Path:
    """Add (or replace) the {name, size, sha256} of `paths` in the build_record.json of their folder, atomically
    and under a lock (parallel links write one record). What `make` calls after it links a library, so every
    library that goes into a wheel has a record written when it was built."""
    paths = [Path(p) for p in paths]
    folders = {p.parent for p in paths}
    if len(folders) != 1:
        raise ValueError(f"record_files takes libraries of one folder, got {', '.join(sorted(map(str, folders)))}")
    folder = folders.pop()
    record = folder / RECORD_NAME
    with open(folder / f".{RECORD_NAME}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        entries = read_record(record) if record.exists() else {}
        digests = sha256_files(paths)
        for p in paths:
            entries[p.name] = file_entry(p, digests[str(p)])
        tmp = folder / f".{RECORD_NAME}.tmp-{os.getpid()}"
        tmp.write_text(json.dumps({"schema": RECORD_SCHEMA, "files": sorted(entries.values(), key=lambda e: e["name"])},
                                  indent=2, sort_keys=True) + "\n")
        os.replace(tmp, record)
    return record
