"""Read a wheel once: every member inflated (libdeflate) and hashed on threads, the small members' bytes kept,
each library's dynamic section and symbol versions read (pyelftools); RECORD and the pins checked against it.

Every check of jatools/wheel/wheel_checks.py (floor, contents) runs on one `scan`, so one command inflates a
wheel once.
"""
from __future__ import annotations

import base64
import contextlib
import csv
import glob
import hashlib
import io
import json
import mmap
import os
import posixpath
import struct
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import deflate
from auditwheel.elfutils import elf_find_versioned_symbols
from elftools.common.exceptions import ELFError
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile
from packaging.utils import (
    parse_wheel_filename,
)

from jatools.wheel import device_code
from jatools.wheel.wheel_layout import Layout
from jatools.wheel.zip_writer import LOCAL_HEADER, LOCAL_HEADER_SIGNATURE

ELF_MAGIC = b"\x7fELF"
REBUILD = "`bash scripts/build_wheel.sh --variant lite|full`"


class WheelReadError(RuntimeError):
    """The wheel cannot be read as a zip, or a member cannot be read back."""


@dataclass(frozen=True)
class ElfDynamic:
    """The dynamic-linking facts of one ELF file (auditwheel sums them over the wheel; a failure names the library)."""
    machine: str
    soname: str | None
    needed: tuple[str, ...]
    rpath: tuple[str, ...]
    runpath: tuple[str, ...]
    # {needed library: sorted version names} as auditwheel counts them, e.g. {"libstdc++.so.6": ["GLIBCXX_3.4.29"]}
    version_needs: dict[str, list[str]]
    # {backend: archs} of the GPU code it carries (jatools/wheel/device_code.py), e.g. {"cuda": ("sm_80", "sm_90a")}
    device: dict[str, tuple[str, ...]] = field(default_factory=dict)
    device_error: str | None = None  # a device-code section that cannot be read


def read_dynamic(path: str | Path, stream: BinaryIO | ReadOnlyView | None = None) -> ElfDynamic:
    """Parse the ELF file at `path` (or `stream`, named `path` in errors); ValueError when it is not one."""
    try:
        with contextlib.ExitStack() as stack:
            elf = ELFFile(stream or stack.enter_context(open(path, "rb")))
            tags = [t for s in elf.iter_sections() if isinstance(s, DynamicSection) for t in s.iter_tags()]

            def values(d_tag: str) -> list[str]:
                return [getattr(t, d_tag[3:].lower()) for t in tags if t.entry.d_tag == d_tag]

            # RPATH/RUNPATH entries as written, empty ones kept: the contents check rejects them.
            rpath, runpath = (tuple(e for v in values(d) for e in v.split(":")) for d in ("DT_RPATH", "DT_RUNPATH"))
            versions: dict[str, set[str]] = {}
            for lib, version in elf_find_versioned_symbols(elf):
                versions.setdefault(lib, set()).add(version)
            sections = {s.name: (s["sh_offset"], s["sh_size"]) for s in elf.iter_sections()
                        if s.name in device_code.SECTIONS}
            device, device_error = {}, None
            if sections:
                buffer = stream._view if isinstance(stream, ReadOnlyView) else stack.enter_context(
                    mmap.mmap(elf.stream.fileno(), 0, access=mmap.ACCESS_READ))
                try:
                    device = device_code.device_archs(buffer, sections)
                except device_code.DeviceCodeError as e:
                    device_error = f"{path}: {e}"
            return ElfDynamic(elf["e_machine"], (values("DT_SONAME") or [None])[-1], tuple(values("DT_NEEDED")),
                              rpath, runpath, {lib: sorted(v) for lib, v in sorted(versions.items())}, device,
                              device_error)
    except (ELFError, OSError) as e:
        raise ValueError(f"{path}: not a readable ELF shared library ({e})") from e


class ReadOnlyView:
    """A file over a buffer for pyelftools (seek, tell, read), without the copy io.BytesIO makes of the
    bytearray libdeflate returns: a library's bytes are held once, however large."""

    def __init__(self, buffer: bytes | bytearray):
        self._view, self._pos = memoryview(buffer), 0

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._pos = offset + (0, self._pos, len(self._view))[whence]
        return self._pos

    def tell(self) -> int:
        return self._pos

    def read(self, size: int = -1) -> bytes:
        out = bytes(self._view[self._pos:len(self._view) if size < 0 else self._pos + size])
        self._pos += len(out)
        return out


@dataclass(frozen=True)
class Member:
    name: str
    size: int
    sha256: str  # hex
    data: bytes | None = None  # a non-ELF member's bytes (metadata, modules); None for a library
    elf: ElfDynamic | None = None
    elf_error: str | None = None  # ELF magic, but not a readable ELF file


@dataclass(frozen=True)
class WheelScan:
    wheel: Path
    names: tuple[str, ...]  # as the central directory lists them (twice if stored twice)
    members: dict[str, Member]


def record_hash(digest: bytes) -> str:
    """A digest as RECORD spells it: sha256=<urlsafe base64, no padding>."""
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def dist_info_dir(wheel: Path) -> str:
    name, version, _, _ = parse_wheel_filename(wheel.name)
    return f"{str(name).replace('-', '_')}-{version}.dist-info"


def _inflate(zf: zipfile.ZipFile, mm: mmap.mmap, info: zipfile.ZipInfo) -> bytes | bytearray:
    """A member's bytes: deflated ones inflated whole by libdeflate, CRC-32 checked as zipfile would."""
    if info.compress_type != zipfile.ZIP_DEFLATED:
        return zf.read(info)  # stored: zipfile checks the CRC
    signature, *_, name_length, extra_length = LOCAL_HEADER.unpack_from(mm, info.header_offset)
    if signature != LOCAL_HEADER_SIGNATURE:
        raise zipfile.BadZipFile("bad local header signature")
    start = info.header_offset + LOCAL_HEADER.size + name_length + extra_length
    if start + info.compress_size > len(mm):
        raise EOFError("it runs past the end of the file")
    with memoryview(mm) as view, view[start:start + info.compress_size] as compressed:
        data = deflate.deflate_decompress(compressed, info.file_size)
    if deflate.crc32(data) != info.CRC:
        raise zipfile.BadZipFile("bad CRC-32")
    return data


def scan(wheel: Path, workers: int | None = None) -> WheelScan:
    """Read every member of `wheel` once; WheelReadError names an unreadable file or a corrupt member."""
    try:
        with zipfile.ZipFile(wheel) as zf, open(wheel, "rb") as f, \
                mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            infos = [i for i in zf.infolist() if not i.is_dir()]

            def one(info: zipfile.ZipInfo) -> Member:
                try:
                    data = _inflate(zf, mm, info)
                    name, size, digest = info.filename, len(data), hashlib.sha256(data).hexdigest()
                    if data[:4] != ELF_MAGIC:
                        return Member(name, size, digest, bytes(data))
                    try:
                        return Member(name, size, digest, elf=read_dynamic(name, ReadOnlyView(data)))
                    except ValueError as e:
                        return Member(name, size, digest, elf_error=str(e))
                except (zipfile.BadZipFile, deflate.DeflateError, EOFError, OSError, struct.error) as e:
                    raise WheelReadError(f"{wheel.name}: member {info.filename} cannot be read back ({e})") from e

            # Largest first, so the big libraries start at once and the small files fill in around them.
            order = sorted(infos, key=lambda i: -i.file_size)
            with ThreadPoolExecutor(max_workers=max(1, min(len(order), workers or os.cpu_count() or 1))) as pool:
                members = {m.name: m for m in pool.map(one, order)}
    except (zipfile.BadZipFile, OSError, ValueError) as e:
        raise WheelReadError(f"{wheel}: not a readable zip/wheel ({e})") from e
    return WheelScan(wheel, tuple(i.filename for i in infos), members)


def find_wheels(spec: str, dist_dir: Path) -> list[Path]:
    """Wheels named by `spec`: paths or globs, comma-separated (`invoke floor -w 'dist/*.whl'`, `-w a.whl,b.whl`);
    empty means every wheel in `dist_dir`."""
    parts = [p.strip() for p in spec.split(",") if p.strip()] if spec else [str(dist_dir / "*.whl")]
    found = [Path(m) for part in parts for m in (sorted(glob.glob(part)) if any(c in part for c in "*?[") else [part])]
    missing = [str(p) for p in found if not p.is_file()]
    if missing or not found:
        where = ", ".join(missing) if missing else (spec or str(dist_dir / "*.whl"))
        raise WheelReadError(f"no wheel at {where}; build one with `nox -s wheel_lite` / `nox -s wheel_full` "
                             f"(or {REBUILD})")
    return found


class RecordError(RuntimeError):
    """The wheel's bytes differ from its RECORD; the message names the files."""


def record_problems(scanned: WheelScan) -> list[str]:
    """How the members differ from RECORD (every member listed with its hash and size, nothing else listed).
    Installers (pip, uv) do not compare them, so a file changed after the build would install silently."""
    record_path = f"{dist_info_dir(scanned.wheel)}/RECORD"
    record = scanned.members.get(record_path)
    if record is None or record.data is None:
        return [f"{record_path} is missing"]
    rows: dict[str, tuple[str, str]] = {}
    for row in filter(None, csv.reader(io.StringIO(record.data.decode("utf-8")))):
        if len(row) != 3:
            return [f"malformed RECORD row {row!r}"]
        if row[0] in rows:
            return [f"RECORD lists {row[0]} twice"]
        rows[row[0]] = (row[1], row[2])
    problems = []
    for name, got in scanned.members.items():
        if name == record_path:
            continue
        if name not in rows:
            problems.append(f"{name} is in the zip but not in RECORD")
        elif rows[name] != ((got_hash := record_hash(bytes.fromhex(got.sha256))), str(got.size)):
            problems.append(f"{name}: RECORD says {rows[name][0]} ({rows[name][1]} bytes), the member is "
                            f"{got_hash} ({got.size} bytes); the wheel was altered after it was built")
    return problems + [f"RECORD lists {n}, which is not in the wheel" for n in rows if n not in scanned.members]


def read_record_text(wheel: Path) -> str:
    """The RECORD file of `wheel`, as text (shipped to the clean room to check the installed bytes)."""
    with zipfile.ZipFile(wheel) as zf:
        return zf.read(f"{dist_info_dir(wheel)}/RECORD").decode()


def scan_or_refuse(wheel: Path) -> WheelScan:
    """scan(wheel), a wheel that cannot be read refused as a RecordError (what the checks below raise)."""
    try:
        return scan(wheel)
    except WheelReadError as e:
        raise RecordError(f"{e}; rebuild the wheel ({REBUILD})") from None


def verify_record(wheel: Path, scanned: WheelScan | None = None) -> int:
    """Raise RecordError unless every member matches RECORD and RECORD lists only members; return the count.
    The clean room refuses such a wheel before making an environment. `scanned`: the wheel's scan, if made."""
    scanned = scanned or scan_or_refuse(wheel)
    if problems := record_problems(scanned):
        raise RecordError(f"{wheel.name} does not match its RECORD: {'; '.join(problems[:6])}. Rebuild the "
                          f"wheel ({REBUILD}) instead of editing it")
    return len(scanned.members)


def _identity(data: bytes | None) -> dict | None:
    """An identity file's bytes as its JSON object; None when missing, not JSON, or not an object."""
    try:
        ident = json.loads(data) if data is not None else None
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return ident if isinstance(ident, dict) else None


def baked_identity(scanned: WheelScan, layout: Layout) -> dict | None:
    """The wheel's build identity, or None when it is missing or not a JSON object."""
    member = scanned.members.get(layout.identity_file)
    return _identity(member.data or b"" if member is not None else None)


def read_identity(wheel: Path, layout: Layout) -> dict | None:
    """baked_identity without a scan: only the identity member is read (for choosing wheels before checking them);
    None also when the wheel cannot be read as a zip."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            data = zf.read(layout.identity_file)
    except (KeyError, OSError, zipfile.BadZipFile):
        return None
    return _identity(data)


def wheel_variant(wheel: Path, layout: Layout) -> str:
    """The variant `wheel` belongs to: its version's local label, the identity's variant where several share it
    (Layout.variant_for_version). LayoutError for a label no variant uses."""
    version = parse_wheel_filename(wheel.name)[1]
    return layout.variant_for_version(str(version), (read_identity(wheel, layout) or {}).get("variant")).name


def pin_problems(scanned: WheelScan, layout: Layout | None = None) -> list[str]:
    """Each library in the wheel against the pin its build identity names ({name, size, sha256}: the pins the
    loader and jax-aiter-fetch-mha hold installed bytes to). A library changed after the build, with RECORD
    regenerated to match, is self-consistent for RECORD but not for the pins. What this proves, and what it
    does not (the identity travels in the same zip): docs/security.md."""
    layout = layout or Layout.load()
    ident = baked_identity(scanned, layout)
    if ident is None:
        return [(f"{layout.identity_file} is missing or not JSON: the wheel has no pins to check its libraries "
                 "against")]
    pins = {e.get("name"): e for e in ident.get("pins") or [] if isinstance(e, dict)}
    problems = []
    for name, m in sorted(scanned.members.items()):
        if posixpath.dirname(name) != layout.lib_dir or not name.endswith(".so"):
            continue
        pin = pins.get(posixpath.basename(name))
        if pin is None:
            problems.append(f"{name} has no pin in {layout.identity_file}: nothing says which bytes it must hold")
        elif (m.sha256, m.size) != (pin.get("sha256"), pin.get("size")):
            problems.append(f"{name} is sha256 {m.sha256} ({m.size} bytes), but its pin in {layout.identity_file} "
                            f"is {pin.get('sha256')} ({pin.get('size')} bytes): the library was changed after the "
                            f"wheel was built; rebuild the wheel ({REBUILD})")
    return problems


def verify_pins(wheel: Path, scanned: WheelScan | None = None) -> int:
    """Raise RecordError unless every library in the wheel has the bytes its pin names; return how many.
    `scanned`: the wheel's scan, if made."""
    scanned, layout = scanned or scan_or_refuse(wheel), Layout.load()
    if problems := pin_problems(scanned, layout):
        raise RecordError(f"{wheel.name}: {'; '.join(problems[:6])}")
    return sum(1 for n in scanned.members if n.startswith(layout.lib_dir + "/") and n.endswith(".so"))
