"""Read a built wheel back: every member's sha256 (streamed, members in parallel), RECORD, ELF members.

The build reads its wheel back to prove the JIT libraries survived compression;
`invoke contents` and `invoke floor` read wheels they did not build. The
decompressors and hashlib release the GIL, so threads decompress and hash
several members at once. A deflated member is inflated whole by libdeflate (the
`deflate` package, which the wheel build uses anyway), from a memory map of the
wheel, about twice as fast as zlib; its CRC-32 is checked against the central
directory as zipfile would. That holds one member's bytes in memory; without the
package, members are streamed through zipfile (zlib) instead.
"""
from __future__ import annotations

import base64
import contextlib
import csv
import hashlib
import io
import mmap
import os
import struct
import tempfile
import zipfile
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import parse_wheel_filename

from jatools.wheel import elf

READ_CHUNK = 4 << 20


class WheelReadError(RuntimeError):
    """The wheel cannot be read as a zip, or lacks its dist-info."""


@dataclass(frozen=True)
class MemberScan:
    name: str
    size: int
    sha256: str  # hex
    is_elf: bool
    extracted: Path | None = None

    @property
    def record_hash(self) -> str:
        """The digest as RECORD spells it: sha256=<urlsafe base64, no padding>."""
        return record_hash(bytes.fromhex(self.sha256))


def record_hash(digest: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def dist_info_dir(wheel: Path) -> str:
    name, version, _, _ = parse_wheel_filename(wheel.name)
    return f"{str(name).replace('-', '_')}-{version}.dist-info"


def read_record(wheel: Path) -> dict[str, tuple[str, str]]:
    """{path: (hash, size)} from the wheel's RECORD ('' for RECORD's own row)."""
    record = f"{dist_info_dir(wheel)}/RECORD"
    with _open_zip(wheel) as zf:
        try:
            text = zf.read(record).decode("utf-8")
        except KeyError:
            raise WheelReadError(f"{wheel.name}: no {record}") from None
    rows = {}
    for row in csv.reader(io.StringIO(text)):
        if not row:
            continue
        if len(row) != 3:
            raise WheelReadError(f"{wheel.name}: malformed RECORD row {row!r}")
        if row[0] in rows:
            raise WheelReadError(f"{wheel.name}: RECORD lists {row[0]} twice")
        rows[row[0]] = (row[1], row[2])
    return rows


def _open_zip(wheel: Path) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(wheel)
    except (zipfile.BadZipFile, OSError) as e:
        raise WheelReadError(f"{wheel}: not a readable zip/wheel ({e})") from e


def _libdeflate():
    try:
        import deflate
    except ImportError:
        return None
    return deflate


def _scan_whole(wheel: Path, info: zipfile.ZipInfo, extract_dir: Path | None, deflate) -> MemberScan:
    """One deflated member inflated whole by libdeflate, from a memory map of the wheel."""
    with open(wheel, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        fields = struct.unpack(zipfile.structFileHeader,
                               mm[info.header_offset:info.header_offset + zipfile.sizeFileHeader])
        if fields[zipfile._FH_SIGNATURE] != zipfile.stringFileHeader:
            raise zipfile.BadZipFile(f"bad local header magic for {info.filename}")
        start = (info.header_offset + zipfile.sizeFileHeader + fields[zipfile._FH_FILENAME_LENGTH]
                 + fields[zipfile._FH_EXTRA_FIELD_LENGTH])
        if start + info.compress_size > len(mm):
            raise EOFError(f"{info.filename} runs past the end of the file")
        try:
            with memoryview(mm) as view, view[start:start + info.compress_size] as compressed:
                data = deflate.deflate_decompress(compressed, info.file_size)
        except deflate.DeflateError as e:
            raise zipfile.BadZipFile(f"invalid deflate data in {info.filename} ({e})") from e
    if deflate.crc32(data) != info.CRC:
        raise zipfile.BadZipFile(f"bad CRC-32 for file {info.filename!r}")
    is_elf = data[:4] == elf.ELF_MAGIC
    target = None
    if is_elf and extract_dir is not None:
        target = extract_dir / info.filename
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return MemberScan(info.filename, len(data), hashlib.sha256(data).hexdigest(), is_elf, target)


def _scan_one(wheel: Path, name: str, extract_dir: Path | None) -> MemberScan:
    h = hashlib.sha256()
    size = 0
    target = None
    with _open_zip(wheel) as zf, zf.open(name) as src, contextlib.ExitStack() as stack:
        head = src.read(READ_CHUNK)
        is_elf = head[:4] == elf.ELF_MAGIC
        out = None
        if is_elf and extract_dir is not None:
            target = extract_dir / name
            target.parent.mkdir(parents=True, exist_ok=True)
            out = stack.enter_context(open(target, "wb"))
        chunk = head
        while chunk:
            h.update(chunk)
            size += len(chunk)
            if out:
                out.write(chunk)
            chunk = src.read(READ_CHUNK)
    return MemberScan(name, size, h.hexdigest(), is_elf, target)


def scan(wheel: Path, names: list[str] | None = None, extract_dir: Path | None = None,
         workers: int | None = None) -> dict[str, MemberScan]:
    """Decompress and hash `names` (default: every member); ELF members are copied out to `extract_dir`.

    A corrupt member (bad CRC or deflate data) raises WheelReadError naming it.
    """
    with _open_zip(wheel) as zf:
        infos = zf.infolist()
    all_names = [i.filename for i in infos if not i.is_dir()]
    names = all_names if names is None else names
    missing = [n for n in names if n not in all_names]
    if missing:
        raise WheelReadError(f"{wheel.name}: no member {', '.join(missing)}")
    # Largest first so the big libraries start at once and small files fill in around them.
    sizes = {i.filename: i.file_size for i in infos}
    order = sorted(names, key=lambda n: -sizes[n])
    workers = max(1, min(len(order) or 1, workers or os.cpu_count() or 1))

    deflate = _libdeflate()
    by_name = {i.filename: i for i in infos}

    def one(name: str) -> MemberScan:
        info = by_name[name]
        try:
            if deflate is not None and info.compress_type == zipfile.ZIP_DEFLATED:
                return _scan_whole(wheel, info, extract_dir, deflate)
            return _scan_one(wheel, name, extract_dir)
        except (zipfile.BadZipFile, zlib.error, OSError, EOFError, ValueError) as e:
            raise WheelReadError(f"{wheel.name}: member {name} cannot be read back ({e})") from e

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return {s.name: s for s in pool.map(one, order)}


@contextlib.contextmanager
def extracted_elves(wheel: Path, workers: int | None = None) -> Iterator[dict[str, elf.ElfDynamic]]:
    """{member: dynamic info} of every ELF member, unpacked to a temporary folder for the duration."""
    with tempfile.TemporaryDirectory(prefix="ja-wheel-") as tmp:
        scanned = scan(wheel, extract_dir=Path(tmp), workers=workers)
        yield {name: elf.read_dynamic(s.extracted) for name, s in sorted(scanned.items())
               if s.is_elf and s.extracted is not None}


def find_wheels(spec: str, dist_dir: Path) -> list[Path]:
    """Wheels named by `spec`: paths or globs, comma-separated; empty means every wheel in `dist_dir`.

    One spec may name several (`invoke floor -w 'dist/*.whl'`, `invoke floor -w a.whl,b.whl`).
    """
    import glob

    parts = [p.strip() for p in spec.split(",") if p.strip()] if spec else [str(dist_dir / "*.whl")]
    found: list[Path] = []
    for part in parts:
        matches = sorted(glob.glob(part)) if any(c in part for c in "*?[") else [part]
        found += [Path(m) for m in matches]
    missing = [str(p) for p in found if not p.is_file()]
    if missing or not found:
        where = ", ".join(missing) if missing else (spec or str(dist_dir / "*.whl"))
        raise WheelReadError(f"no wheel at {where}; build one with `nox -s wheel_lite` / `nox -s wheel_full` "
                             f"(or `bash scripts/build_wheel.sh --variant lite|full`)")
    return found
