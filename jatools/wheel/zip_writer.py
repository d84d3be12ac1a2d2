"""A deterministic zip writer that deflates several members at once with libdeflate.

Not ``zipfile``, which deflates one member at a time on one core with zlib (a full wheel holds ~2.5 GB of
libraries in a few files): each member is compressed whole by libdeflate (the `deflate` package, which releases
the GIL) from a read-only memory map, several at once on threads. Memory held: the compressed form of the
members in flight. The output depends only on the inputs and libdeflate's version: not on the thread count;
timestamps and permissions come from the caller, members are written in the order added, and the only extra
fields are ZIP64 ones, when needed.
"""
from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import stat
import struct
import zipfile
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import BinaryIO

import deflate  # libdeflate's Python bindings

ZIP64_LIMIT = zipfile.ZIP64_LIMIT  # beyond it sizes and offsets move to ZIP64 extra fields
_U32 = 0xFFFFFFFF
LEVELS = range(1, 13)  # libdeflate's compression levels
# The local file header before each member's data (APPNOTE.TXT 4.3.7): signature, version needed, flags,
# method, time, date, CRC-32, compressed size, size, name length, extra field length. The checks read it back.
LOCAL_HEADER = struct.Struct("<4sHHHHHLLLHH")
LOCAL_HEADER_SIGNATURE = b"PK\x03\x04"


@dataclass(frozen=True)
class WrittenMember:
    """What was written for one member; `sha256` is the raw digest (RECORD wants it base64)."""
    arcname: str
    size: int
    compressed_size: int
    crc32: int
    sha256: bytes
    offset: int
    mode: int

    @property
    def sha256_hex(self) -> str:
        return self.sha256.hex()


def _compress_whole(path: str | os.PathLike, level: int, sha256: bytes | None) -> tuple[int, int, bytes, bytes]:
    """(size, crc32, sha256, raw deflate stream) of a whole file, with libdeflate, from a memory map."""
    with open(path, "rb") as f, (mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if os.fstat(f.fileno()).st_size
                                 else contextlib.nullcontext(b"")) as data:  # an empty file cannot be mapped
        crc, digest = deflate.crc32(data), sha256 or hashlib.sha256(data).digest()
        return len(data), crc, digest, deflate.deflate_compress(data, level)


def _name_version_flags(arcname: str, zip64: bool) -> tuple[bytes, int, int]:
    name = arcname.encode("utf-8")
    return name, 45 if zip64 else 20, 0 if name.isascii() else 0x800


class DeterministicZipWriter:
    """Write members to `fileobj` (seekable); call `close()` to write the central directory."""

    def __init__(self, fileobj: BinaryIO, date_time: tuple[int, int, int, int, int, int], level: int = 6,
                 workers: int | None = None):
        if level not in LEVELS:
            raise ValueError(f"libdeflate's deflate level must be {LEVELS[0]}..{LEVELS[-1]}, got {level}")
        y, mo, d, h, mi, s = date_time
        if y < 1980:
            raise ValueError(f"zip timestamps start in 1980; got {date_time}")
        self._time, self._date = (h << 11) | (mi << 5) | (s // 2), ((y - 1980) << 9) | (mo << 5) | d
        self._fp, self._level = fileobj, level
        self._workers = max(1, workers or os.cpu_count() or 1)
        self._pool = ThreadPoolExecutor(max_workers=self._workers) if self._workers > 1 else None
        self._members: list[WrittenMember] = []
        self._names: set[str] = set()
        self._closed = False

    @property
    def members(self) -> list[WrittenMember]:
        return list(self._members)

    def add_bytes(self, arcname: str, data: bytes, mode: int = 0o644) -> WrittenMember:
        return self._write(arcname, mode, len(data), deflate.crc32(data), hashlib.sha256(data).digest(),
                           deflate.deflate_compress(data, self._level))

    def add_files(self, items: Iterable[tuple[str, str | os.PathLike, int, bytes | None]],
                  on_written: Callable[[WrittenMember], None] | None = None) -> list[WrittenMember]:
        """Add (arcname, path, mode, known sha256 or None) in order; members are compressed in parallel.

        A known sha256 is a digest the caller already verified for that file; it is used instead of
        hashing again (the caller must then check what it reads back)."""
        out = []
        pending: deque[tuple[str, int, Future | tuple]] = deque()

        def write_oldest() -> None:
            arcname, mode, job = pending.popleft()
            out.append(self._write(arcname, mode, *(job.result() if isinstance(job, Future) else job)))
            if on_written:
                on_written(out[-1])

        for arcname, path, mode, sha256 in items:
            job = (self._pool.submit(_compress_whole, path, self._level, sha256) if self._pool
                   else _compress_whole(path, self._level, sha256))
            pending.append((arcname, mode, job))
            while len(pending) > self._workers:
                write_oldest()
        while pending:
            write_oldest()
        return out

    def _write(self, arcname: str, mode: int, size: int, crc: int, sha256: bytes, compressed: bytes) -> WrittenMember:
        if self._closed:
            raise ValueError("zip writer is closed")
        if arcname in self._names:
            raise ValueError(f"duplicate zip member {arcname!r}")
        self._names.add(arcname)
        zip64 = size * 1.05 > ZIP64_LIMIT  # deflate may grow incompressible data slightly
        if not zip64 and (len(compressed) > ZIP64_LIMIT or size > ZIP64_LIMIT):
            raise OSError(f"{arcname}: compressed to {len(compressed)} bytes, past the ZIP64 limit reserved for it")
        offset = self._fp.tell()
        self._fp.write(self._local_header(arcname, crc, len(compressed), size, zip64))  # sizes known: written once
        self._fp.write(compressed)
        self._members.append(WrittenMember(arcname, size, len(compressed), crc, sha256, offset, mode))
        return self._members[-1]

    def _local_header(self, arcname: str, crc: int, csize: int, usize: int, zip64: bool) -> bytes:
        name, version, flags = _name_version_flags(arcname, zip64)
        extra = struct.pack("<HHQQ", 1, 16, usize, csize) if zip64 else b""
        return LOCAL_HEADER.pack(LOCAL_HEADER_SIGNATURE, version, flags, zipfile.ZIP_DEFLATED, self._time, self._date,
                                 crc, _U32 if zip64 else csize, _U32 if zip64 else usize, len(name),
                                 len(extra)) + name + extra

    def _central_entry(self, m: WrittenMember) -> bytes:
        big = [v for v in (m.size, m.compressed_size, m.offset) if v > ZIP64_LIMIT]
        name, version, flags = _name_version_flags(m.arcname, bool(big))
        extra = struct.pack(f"<HH{len(big)}Q", 1, 8 * len(big), *big) if big else b""
        csize, size, offset = (_U32 if v > ZIP64_LIMIT else v for v in (m.compressed_size, m.size, m.offset))
        return struct.pack(
            zipfile.structCentralDir, zipfile.stringCentralDir, version, 3, version, 0, flags,  # 3: made on Unix
            zipfile.ZIP_DEFLATED, self._time, self._date, m.crc32, csize, size, len(name), len(extra), 0, 0, 0,
            (stat.S_IFREG | m.mode) << 16, offset) + name + extra

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._pool:
            self._pool.shutdown()
        start = self._fp.tell()
        for m in self._members:
            self._fp.write(self._central_entry(m))
        end = self._fp.tell()
        count, size = len(self._members), end - start
        if count > zipfile.ZIP_FILECOUNT_LIMIT or start > ZIP64_LIMIT or size > ZIP64_LIMIT:
            self._fp.write(struct.pack(zipfile.structEndArchive64, zipfile.stringEndArchive64, 44, 45, 45, 0, 0,
                                       count, count, size, start))
            self._fp.write(struct.pack(zipfile.structEndArchive64Locator, zipfile.stringEndArchive64Locator,
                                       0, end, 1))
            count, size, start = min(count, 0xFFFF), min(size, _U32), min(start, _U32)
        self._fp.write(struct.pack(zipfile.structEndArchive, zipfile.stringEndArchive, 0, 0, count, count,
                                   size, start, 0))

    def __enter__(self):  # the writer itself
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self.close()
        elif self._pool:
            self._pool.shutdown(cancel_futures=True)
