"""Read a wheel once and judge it: RECORD, the content policy, the ELF rules, the glibc symbol floor, the clients.

    python -m jatools.wheel.wheel_checks [--floor] [--contents] [--clients] DIST...   (none given: floor + contents)

`scan` opens the zip once and reads, inflates (libdeflate, from a memory map) and
hashes each member once, several members at once on threads (the inflater and
hashlib release the GIL); from that one read it keeps the bytes of the small
members (metadata, modules) and parses each ELF member's dynamic section and
symbol versions with pyelftools. Every check runs on a scan, so the checks of
one command inflate a wheel once: the wheel build's read-back (whose scan
`--check` reuses), `invoke contents`, `invoke floor` and the clean room's RECORD
check (`verify_record`).

The floor is auditwheel's own computation of `auditwheel show`'s `sym_tag`: its
policy table (`WheelPolicies.versioned_symbols_policy`) over the symbol versions
its `elfutils` finds in the wheel's libraries (tests/wheel/test_wheel_build.py
compares the two on built wheels, so they cannot drift). `overall_tag` also
counts GPU runtime libraries outside auditwheel's allowlist, which makes it
`linux_*` for every GPU wheel, so it is not used. A failure names the symbol
versions above the claimed tag and the libraries that import them, which
auditwheel does not say.
"""
from __future__ import annotations

import argparse
import base64
import contextlib
import csv
import email.parser
import glob
import hashlib
import io
import json
import mmap
import os
import posixpath
import re
import struct
import subprocess
import sys
import tempfile
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import deflate
from auditwheel.architecture import Architecture
from auditwheel.elfutils import elf_find_versioned_symbols
from auditwheel.libc import Libc
from auditwheel.policy import WheelPolicies
from elftools.common.exceptions import ELFError
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile
from packaging.metadata import Metadata
from packaging.utils import (
    InvalidWheelFilename,
    canonicalize_name,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion

from jatools.wheel.wheel_layout import Layout, LayoutError, Variant, python_packages
from jatools.wheel.zip_writer import LOCAL_HEADER, LOCAL_HEADER_SIGNATURE

ELF_MAGIC = b"\x7fELF"
ORIGIN_TOKENS = ("$ORIGIN", "${ORIGIN}")


class WheelReadError(RuntimeError):
    """The wheel cannot be read as a zip, or a member cannot be read back."""


# --- ELF: what the dynamic loader sees in a library -------------------------------------------------------

@dataclass(frozen=True)
class ElfDynamic:
    """The dynamic-linking facts of one ELF file (auditwheel only reports them summed over the whole wheel,
    so that a failure can name the library at fault)."""

    machine: str
    soname: str | None
    needed: tuple[str, ...]
    rpath: tuple[str, ...]
    runpath: tuple[str, ...]
    # {needed library: sorted version names} as auditwheel counts them, e.g. {"libstdc++.so.6": ["GLIBCXX_3.4.29"]}
    version_needs: dict[str, list[str]] = field(default_factory=dict)


def read_dynamic(path: str | Path, stream: BinaryIO | _ReadOnlyView | None = None) -> ElfDynamic:
    """Parse the ELF file at `path` (or `stream`, named `path` in errors); ValueError when it is not one."""
    try:
        with contextlib.ExitStack() as stack:
            elf = ELFFile(stream or stack.enter_context(open(path, "rb")))
            soname, needed, rpath, runpath = None, [], [], []
            for section in elf.iter_sections():
                if not isinstance(section, DynamicSection):
                    continue
                for tag in section.iter_tags():
                    if tag.entry.d_tag == "DT_NEEDED":
                        needed.append(tag.needed)
                    elif tag.entry.d_tag == "DT_SONAME":
                        soname = tag.soname
                    elif tag.entry.d_tag == "DT_RPATH":
                        rpath += tag.rpath.split(":")  # empty entries kept: the contents check rejects them
                    elif tag.entry.d_tag == "DT_RUNPATH":
                        runpath += tag.runpath.split(":")
            versions: dict[str, set[str]] = {}
            for lib, version in elf_find_versioned_symbols(elf):
                versions.setdefault(lib, set()).add(version)
            return ElfDynamic(elf["e_machine"], soname, tuple(needed), tuple(rpath), tuple(runpath),
                              {lib: sorted(v) for lib, v in sorted(versions.items())})
    except (ELFError, OSError) as e:
        raise ValueError(f"{path}: not a readable ELF shared library ({e})") from e


class _ReadOnlyView:
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


def resolve_in_tree(member_dir: str, entry: str) -> str | None:
    """Where an $ORIGIN entry of a file in `member_dir` points, as a path relative to the tree root.

    Returns None for entries that are not $ORIGIN-relative, and a path starting
    with '..' for entries that leave the tree.
    """
    for token in ORIGIN_TOKENS:
        if entry == token or entry.startswith(token + "/"):
            return posixpath.normpath(posixpath.join(member_dir, entry[len(token) + 1:]))
    return None


# --- the scan: every member read, inflated and hashed once ------------------------------------------------

@dataclass(frozen=True)
class Member:
    name: str
    size: int
    sha256: str  # hex
    data: bytes | None = None  # a non-ELF member's bytes (metadata, modules); None for a library
    elf: ElfDynamic | None = None
    elf_error: str | None = None  # ELF magic, but not a readable ELF file

    @property
    def is_elf(self) -> bool:
        return self.data is None

    @property
    def record_hash(self) -> str:
        return record_hash(bytes.fromhex(self.sha256))


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


def _read_member(zf: zipfile.ZipFile, mm: mmap.mmap, info: zipfile.ZipInfo) -> Member:
    data = _inflate(zf, mm, info)
    digest = hashlib.sha256(data).hexdigest()
    if data[:4] != ELF_MAGIC:
        return Member(info.filename, len(data), digest, bytes(data))
    try:
        return Member(info.filename, len(data), digest, elf=read_dynamic(info.filename, _ReadOnlyView(data)))
    except ValueError as e:
        return Member(info.filename, len(data), digest, elf_error=str(e))


def scan(wheel: Path, workers: int | None = None) -> WheelScan:
    """Read every member of `wheel` once; WheelReadError names an unreadable file or a corrupt member."""
    try:
        with zipfile.ZipFile(wheel) as zf, open(wheel, "rb") as f, \
                mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            infos = [i for i in zf.infolist() if not i.is_dir()]

            def one(info: zipfile.ZipInfo) -> Member:
                try:
                    return _read_member(zf, mm, info)
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
    """Wheels named by `spec`: paths or globs, comma-separated; empty means every wheel in `dist_dir`.

    One spec may name several (`invoke floor -w 'dist/*.whl'`, `invoke floor -w a.whl,b.whl`).
    """
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


# --- RECORD -------------------------------------------------------------------------------------------------

class RecordError(RuntimeError):
    """The wheel's bytes differ from its RECORD; the message names the files."""


def record_problems(scanned: WheelScan) -> list[str]:
    """How the members differ from RECORD (every member listed with its hash and size, nothing else listed).

    Installers (pip, uv) do not compare a wheel's files with its RECORD, so a file
    changed after the wheel was built would install silently."""
    record_path = f"{dist_info_dir(scanned.wheel)}/RECORD"
    record = scanned.members.get(record_path)
    if record is None or record.data is None:
        return [f"{record_path} is missing"]
    rows: dict[str, tuple[str, str]] = {}
    for row in csv.reader(io.StringIO(record.data.decode("utf-8"))):
        if not row:
            continue
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
            continue
        want_hash, want_size = rows[name]
        if want_hash != got.record_hash or want_size != str(got.size):
            problems.append(f"{name}: RECORD says {want_hash} ({want_size} bytes), the member is "
                            f"{got.record_hash} ({got.size} bytes); the wheel was altered after it was built")
    problems += [f"RECORD lists {name}, which is not in the wheel" for name in rows if name not in scanned.members]
    return problems


def read_record_text(wheel: Path) -> str:
    """The RECORD file of `wheel`, as text (shipped to the clean room to check the installed bytes)."""
    with zipfile.ZipFile(wheel) as zf:
        return zf.read(f"{dist_info_dir(wheel)}/RECORD").decode()


def verify_record(wheel: Path, workers: int | None = None) -> int:
    """Raise RecordError unless every member matches RECORD and RECORD lists only members; return the count.

    The clean room refuses such a wheel before making an environment."""
    try:
        scanned = scan(wheel, workers)
    except WheelReadError as e:
        raise RecordError(f"{e}; rebuild the wheel (`bash scripts/build_wheel.sh --variant lite|full`)") from None
    problems = record_problems(scanned)
    if problems:
        raise RecordError(f"{wheel.name} does not match its RECORD: {'; '.join(problems[:6])}. Rebuild the "
                          "wheel (`bash scripts/build_wheel.sh --variant lite|full`) instead of editing it")
    return len(scanned.members)


# --- the content policy (jatools/wheel/wheel_layout.toml applied to a wheel read back) -------------------------

IDENTITY_KEYS = ("version", "variant", "kernel_source_revision", "recipe_hash", "cache_id", "gpu_archs",
                 "backend", "toolchain", "ffi_api_version")
BACKENDS = ("cpu", "cuda", "rocm")


@dataclass
class ContentsReport:
    wheel: str
    variant: str | None = None
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def message(self) -> str:
        if self.ok:
            return f"{self.wheel}: contents of the {self.variant} variant are as expected" + "".join(
                f"\n  note: {n}" for n in self.notes)
        return f"{self.wheel}: " + "".join(f"\n  - {p}" for p in self.problems)


def _check_dist_info(report: ContentsReport, scanned: WheelScan, dist_info: str, layout: Layout, name: str,
                     version: str, tags: set[str]) -> None:
    files = {n[len(dist_info) + 1:]: m.data for n, m in scanned.members.items() if n.startswith(dist_info + "/")}
    expected = set(layout.dist_info_files)
    if files.get("METADATA") is not None:
        try:
            meta = Metadata.from_email(files["METADATA"], validate=True)
            if canonicalize_name(meta.name) != canonicalize_name(name) or str(meta.version) != version:
                report.problems.append(f"METADATA names {meta.name} {meta.version}, the file name {name} {version}")
            # PEP 639: each License-File is in the dist-info's licenses/ folder.
            expected |= {f"licenses/{f}" for f in meta.license_files or []}
        except Exception as e:  # noqa: BLE001 - packaging raises an ExceptionGroup of InvalidMetadata
            errors = getattr(e, "exceptions", [e])
            report.problems.append("METADATA is invalid: " + "; ".join(str(x) for x in errors))
    for missing in sorted(expected - set(files)):
        report.problems.append(f"{dist_info}/{missing} is missing")
    for extra in sorted(set(files) - expected):
        report.problems.append(f"{dist_info}/{extra} is not expected in the dist-info")
    if files.get("WHEEL") is not None:
        msg = email.parser.Parser().parsestr(files["WHEEL"].decode("utf-8"))
        if msg.get("Wheel-Version") != "1.0":
            report.problems.append(f"WHEEL: Wheel-Version is {msg.get('Wheel-Version')!r}, expected '1.0'")
        if (msg.get("Root-Is-Purelib") or "").lower() != "false":
            report.problems.append("WHEEL: Root-Is-Purelib must be false (the wheel holds native libraries)")
        wheel_tags = set(msg.get_all("Tag") or [])
        if wheel_tags != tags:
            report.problems.append(f"WHEEL: Tag {sorted(wheel_tags)} differs from the file name's {sorted(tags)}")


def _check_files(report: ContentsReport, names: list[str], layout: Layout, variant: Variant, dist_info: str) -> None:
    required = list(layout.required_files) + [layout.identity_file] + [layout.lib_member(n) for n in variant.libraries]
    for r in required:
        if r not in names:
            report.problems.append(f"{r} is missing from the {variant.name} wheel (jatools/wheel/wheel_layout.toml "
                                   f"requires it)")
    not_here = [layout.lib_member(n) for n in layout.libraries if n not in variant.libraries]
    py_dirs = {p.replace(".", "/") for p in python_packages()}
    for name in names:
        if name.startswith(dist_info + "/") or name in required:
            continue
        if name in not_here:
            report.problems.append(f"{name} must not be in the {variant.name} wheel"
                                   + (" (users fetch it with jax-aiter-fetch-mha)"
                                      if posixpath.basename(name) in variant.fetched else ""))
        elif not (name.endswith(".py") and posixpath.dirname(name) in py_dirs):
            report.problems.append(f"{name} is not expected in a wheel (not a library of the variant, not a module "
                                   f"of the packages pyproject lists)")


def _check_identity(report: ContentsReport, scanned: WheelScan, layout: Layout, variant: Variant,
                    version: str) -> dict | None:
    member = scanned.members.get(layout.identity_file)
    if member is None:
        return None  # reported as a missing file
    try:
        ident = json.loads(member.data or b"")
    except json.JSONDecodeError as e:
        report.problems.append(f"{layout.identity_file} is not valid JSON ({e})")
        return None
    missing = [k for k in IDENTITY_KEYS if k not in ident]
    if missing:
        report.problems.append(f"{layout.identity_file} lacks {', '.join(missing)}")
    if ident.get("version") != version:
        report.problems.append(f"{layout.identity_file} says version {ident.get('version')}, the wheel is {version}")
    if ident.get("variant") != variant.name:
        report.problems.append(f"{layout.identity_file} says variant {ident.get('variant')}, the version's local "
                               f"label makes it {variant.name}")
    if ident.get("backend") not in BACKENDS:
        report.problems.append(f"{layout.identity_file}: backend {ident.get('backend')!r} is not one of "
                               f"{', '.join(BACKENDS)}")
    return ident


def _check_elves(report: ContentsReport, scanned: WheelScan, layout: Layout, variant: Variant, backend: str) -> None:
    names = list(scanned.members)
    in_wheel = {posixpath.basename(n) for n in names if n.startswith(layout.lib_dir + "/")}
    dirs = {d for n in names for d in _parents(n)} | {""}
    for lib in variant.libraries:
        member = scanned.members.get(layout.lib_member(lib))
        if member is not None and not member.is_elf:
            report.problems.append(f"{member.name} is not an ELF shared library")
    for member, m in sorted(scanned.members.items()):
        if m.elf_error:
            report.problems.append(m.elf_error)
        if m.elf is None:
            continue
        info, base = m.elf, posixpath.basename(member)
        if posixpath.dirname(member) != layout.lib_dir:
            report.problems.append(f"{member} is a native library outside {layout.lib_dir}/")
        if info.soname and info.soname != base:
            report.problems.append(f"{member}: SONAME {info.soname} differs from its file name; other libraries "
                                   f"find it by that name")
        for dep in info.needed:
            if dep in in_wheel or layout.external_allowed(dep, backend) or dep in variant.fetched:
                continue
            report.problems.append(
                f"{member} needs {dep}, which is neither in the wheel nor allowed from outside for the {backend} "
                f"backend (allowlist in jatools/wheel/wheel_layout.toml [external])")
        for kind, entries in (("RPATH", info.rpath), ("RUNPATH", info.runpath)):
            for entry in entries:
                bad = [s for s in layout.runpath_forbidden if s in entry]
                target = resolve_in_tree(posixpath.dirname(member), entry)
                if not entry:
                    report.problems.append(f"{member}: {kind} has an empty entry ({':'.join(entries)!r}), which glibc "
                                           f"reads as the current directory: a library would load from wherever "
                                           f"Python runs. Remove the stray ':' from the link line and rebuild")
                elif bad:
                    report.problems.append(f"{member}: {kind} entry {entry!r} names {bad[0]}; TheRock resolves its "
                                           f"runtime through ldconfig, never that folder. Remove it from the link "
                                           f"line and rebuild")
                elif target is None:
                    report.problems.append(f"{member}: {kind} entry {entry!r} is not relative to $ORIGIN (a "
                                           f"build-machine path); link with -rpath '$ORIGIN' only and rebuild")
                elif target == ".." or target.startswith("../"):
                    report.problems.append(f"{member}: {kind} entry {entry!r} points outside the wheel ({target})")
                elif target not in dirs:
                    report.notes.append(f"{member}: {kind} entry {entry!r} names {target}/, which the wheel does "
                                        f"not have (a build-tree folder; harmless, the loader ignores it)")


def _parents(path: str) -> list[str]:
    out = []
    d = posixpath.dirname(path)
    while d:
        out.append(d)
        d = posixpath.dirname(d)
    return out


def check_contents(wheel: Path | WheelScan, layout: Layout | None = None) -> ContentsReport:
    """The content policy on a wheel (scanned here unless given as a scan)."""
    path = wheel.wheel if isinstance(wheel, WheelScan) else wheel
    layout = layout or Layout.load()
    report = ContentsReport(path.name)
    try:
        name, version, _, tags = parse_wheel_filename(path.name)
    except (InvalidWheelFilename, InvalidVersion) as e:
        report.problems.append(f"not a valid wheel file name ({e})")
        return report
    for t in tags:
        if t.interpreter != "py3" or t.abi != "none" or t.platform == "any":
            report.problems.append(f"tag {t} should be py3-none-<platform>: the libraries are loaded with ctypes, "
                                   f"not as CPython extensions, and they are platform-specific")
    try:
        variant = layout.variant_for_version(str(version))
    except LayoutError as e:
        report.problems.append(str(e))
        return report
    report.variant = variant.name
    try:
        scanned = wheel if isinstance(wheel, WheelScan) else scan(wheel)
    except WheelReadError as e:
        report.problems.append(str(e))
        return report
    dist_info = dist_info_dir(path)
    dupes = sorted({n for n in scanned.names if scanned.names.count(n) > 1})
    if dupes:
        report.problems.append(f"members stored twice: {', '.join(dupes)}")
    report.problems += record_problems(scanned)
    _check_dist_info(report, scanned, dist_info, layout, str(name), str(version), {str(t) for t in tags})
    _check_files(report, list(scanned.names), layout, variant, dist_info)
    ident = _check_identity(report, scanned, layout, variant, str(version))
    _check_elves(report, scanned, layout, variant, (ident or {}).get("backend", "cpu"))
    report.problems = list(dict.fromkeys(report.problems))  # a missing RECORD is a missing file and no RECORD
    return report


# --- the symbol floor: the oldest glibc the libraries' versioned symbols allow, against the tag claimed ------

# PEP 513/571/599 names for the first manylinux tags (PEP 600 spells them manylinux_2_5/12/17).
LEGACY_MANYLINUX = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
ELF_MACHINES = {"EM_X86_64": "x86_64", "EM_AARCH64": "aarch64", "EM_PPC64": "ppc64le", "EM_S390": "s390x"}
_TAG = re.compile(r"^(?P<family>manylinux_(?P<major>\d+)_(?P<minor>\d+)|manylinux1|manylinux2010|manylinux2014"
                  r"|musllinux_\d+_\d+|linux)_(?P<arch>[a-z0-9_]+)$")


class FloorError(RuntimeError):
    """The wheel cannot be analysed (no libraries, several machines, a tag pip does not know)."""


def _match_tag(tag: str) -> re.Match:
    m = _TAG.match(tag)
    if not m:
        raise FloorError(f"{tag!r} is not a Linux platform tag pip accepts (e.g. manylinux_2_34_x86_64)")
    return m


def glibc_of_tag(tag: str) -> tuple[int, int] | None:
    """(major, minor) glibc a manylinux platform tag promises; None for `linux_*` (which promises nothing)."""
    m = _match_tag(tag)
    family = m.group("family")
    if family == "linux":
        return None
    if family in LEGACY_MANYLINUX:
        return LEGACY_MANYLINUX[family]
    if family.startswith("musllinux"):
        raise FloorError(f"{tag}: musllinux tags are not for these glibc-linked libraries")
    return int(m.group("major")), int(m.group("minor"))


def arch_of_tag(tag: str) -> str:
    return _match_tag(tag).group("arch")


def normalise_plat_name(name: str) -> str:
    """JA_WHEEL_PLAT_NAME as bdist_wheel normalises it (`-` and `.` become `_`), checked to be a Linux tag."""
    tag = name.strip().replace("-", "_").replace(".", "_")
    glibc_of_tag(tag)
    return tag


def elf_arch(libs: list[ElfDynamic]) -> str:
    machines = {lib.machine for lib in libs}
    if len(machines) != 1:
        raise FloorError(f"the libraries are for several machines ({', '.join(sorted(machines))}); one wheel "
                         f"holds one architecture")
    machine = machines.pop()
    if machine not in ELF_MACHINES:
        raise FloorError(f"no Linux wheel tag for ELF machine {machine}")
    return ELF_MACHINES[machine]


@dataclass(frozen=True)
class SymbolNeed:
    version: str  # e.g. GLIBCXX_3.4.29
    first_tag: str | None  # oldest policy that provides it; None: newer than every policy auditwheel knows
    libraries: tuple[str, ...]  # the wheel's libraries that import it


@dataclass(frozen=True)
class Floor:
    tag: str  # oldest tag the symbols allow, e.g. manylinux_2_34_x86_64 (linux_x86_64: none)
    needs: tuple[SymbolNeed, ...] = field(default_factory=tuple)

    def above(self, glibc: tuple[int, int]) -> list[SymbolNeed]:
        """Symbol versions a claim of `glibc` cannot satisfy."""
        return [n for n in self.needs if n.first_tag is None or glibc_of_tag(n.first_tag) > glibc]


def measure(libs: dict[str, ElfDynamic], arch: str | None = None) -> Floor:
    """The floor of these libraries ({name in wheel: dynamic info}) by auditwheel's policy table."""
    arch = arch or elf_arch(list(libs.values()))
    policies = WheelPolicies(libc=Libc.GLIBC, arch=Architecture(arch))
    by_version: dict[str, set[str]] = {}
    versioned: dict[str, set[str]] = {}
    for name, info in libs.items():
        for dep, versions in info.version_needs.items():
            versioned.setdefault(dep, set()).update(versions)
            for v in versions:
                by_version.setdefault(v, set()).add(name)
    ordered = sorted((p for p in policies if p.name != policies.linux.name), key=lambda p: -p.priority)
    needs = []
    for version, names in sorted(by_version.items()):
        prefix, _, number = version.partition("_")
        first = next((p.name for p in ordered if number in p.symbol_versions.get(prefix, ())), None)
        if first is None and not any(prefix in p.symbol_versions for p in ordered):
            continue  # a symbol family no policy constrains (e.g. a GPU runtime's own versions)
        needs.append(SymbolNeed(version, first, tuple(sorted(names))))
    return Floor(policies.versioned_symbols_policy(versioned).name, tuple(needs))


@dataclass(frozen=True)
class FloorReport:
    wheel: str
    claimed: tuple[str, ...]
    sym_tag: str
    ok: bool
    message: str
    needs: tuple[SymbolNeed, ...]


def check_floor(wheel: Path | WheelScan) -> FloorReport:
    """Compare the wheel's platform tag(s) with the floor of its libraries; attribute any excess to libraries."""
    try:
        scanned = wheel if isinstance(wheel, WheelScan) else scan(wheel)
        _, _, _, tags = parse_wheel_filename(scanned.wheel.name)
    except (WheelReadError, InvalidWheelFilename, InvalidVersion) as e:
        raise FloorError(str(e)) from e
    name = scanned.wheel.name
    claimed = tuple(sorted({t.platform for t in tags}))
    libs = {posixpath.basename(n): m.elf for n, m in scanned.members.items() if m.elf is not None}
    if not libs:
        raise FloorError(f"{name}: no ELF library in the wheel, so no symbol floor to check it against")
    arch = elf_arch(list(libs.values()))
    floor = measure(libs, arch)
    sym_tag, floor_glibc = floor.tag, glibc_of_tag(floor.tag)
    problems = []
    for tag in claimed:
        if tag == "any":
            problems.append(f"{tag}: a wheel with native libraries cannot be tagged 'any'")
            continue
        glibc = glibc_of_tag(tag)
        if arch_of_tag(tag) != arch:
            problems.append(f"{tag}: the libraries are {arch}, the tag says {arch_of_tag(tag)}")
        elif glibc is not None and (floor_glibc is None or glibc < floor_glibc):
            detail = "; ".join(
                f"{n.version} (needs {n.first_tag or 'a glibc newer than any manylinux policy'}) "
                f"from {', '.join(n.libraries)}" for n in floor.above(glibc)) or "see `auditwheel show` for the symbols"
            problems.append(
                f"tagged {tag}, but the versioned symbols need {sym_tag}: {detail}. Fix: tag it {sym_tag} "
                f"(unset JA_WHEEL_PLAT_NAME to use the measured floor, or set it to {sym_tag}), or build the "
                f"libraries with an older toolchain")
    if problems:
        return FloorReport(name, claimed, sym_tag, False, f"{name}: " + " | ".join(problems), floor.needs)
    stricter = floor_glibc is not None and all((glibc_of_tag(t) or (0, 0)) > floor_glibc for t in claimed)
    note = f" (stricter than needed: {sym_tag} would do)" if stricter else ""
    return FloorReport(name, claimed, sym_tag, True,
                       f"{name}: tag {', '.join(claimed)} is not older than the symbol floor {sym_tag}{note}",
                       floor.needs)


# --- the clients users run: each must accept every distribution we publish ----------------------------
# check-wheel-contents codes we configure off, each for a reason (docs/wheels.md):
CHECK_WHEEL_CONTENTS_IGNORE: dict[str, str] = {}


def _client(argv: list[str], what: str) -> str | None:
    """Run a client as users do (this interpreter's module); None when it accepts, else what it said."""
    out = subprocess.run([sys.executable, *argv], capture_output=True, text=True, check=False,
                         env={**os.environ, "NO_COLOR": "1"})
    if out.returncode == 0:
        return None
    if "No module named" in out.stderr:
        return (f"{what}: the client is not installed ({out.stderr.strip().splitlines()[-1]}); install the "
                "`clients` dependency group: pip install --group clients")
    return f"{what} rejects it (exit {out.returncode}): {(out.stdout + out.stderr).strip()[-1500:]}"


def repack_problems(wheel: Path) -> list[str]:
    """`wheel unpack` then `wheel pack`: the same file name, members and bytes (RECORD rows as a set)."""
    problems = []
    with tempfile.TemporaryDirectory(prefix="ja-repack-") as tmp:
        said = _client(["-m", "wheel", "unpack", "-d", f"{tmp}/u", str(wheel)], "wheel unpack")
        unpacked = next(Path(tmp, "u").glob("*"), None) if said is None else None
        Path(tmp, "p").mkdir()
        said = said or _client(["-m", "wheel", "pack", "-d", f"{tmp}/p", str(unpacked)], "wheel pack")
        if said:
            return [f"{wheel.name}: {said}"]
        again = next(Path(tmp, "p").glob("*.whl"))
        if again.name != wheel.name:
            problems.append(f"{wheel.name}: `wheel pack` names it {again.name}")
        with zipfile.ZipFile(wheel) as a, zipfile.ZipFile(again) as b:
            ours, theirs = sorted(a.namelist()), sorted(b.namelist())
            if ours != theirs:
                problems.append(f"{wheel.name}: `wheel pack` gives other members: only ours "
                                f"{sorted(set(ours) - set(theirs))}, only theirs {sorted(set(theirs) - set(ours))}")
            for n in sorted(set(ours) & set(theirs)):
                same = (set(a.read(n).splitlines()) == set(b.read(n).splitlines()) if n.endswith("/RECORD")
                        else a.read(n) == b.read(n))
                if not same:
                    problems.append(f"{wheel.name}: {n} differs after `wheel unpack` + `wheel pack`")
    return problems


def client_problems(dists: list[Path]) -> list[str]:
    """What the clients users run say about these wheels/sdists: `twine check --strict` (all),
    `check-wheel-contents` and `wheel unpack` + `wheel pack` (wheels). Empty: every client accepts them."""
    wheels = [d for d in dists if d.suffix == ".whl"]
    problems = [p for p in [_client(["-m", "twine", "check", "--strict", *map(str, dists)], "twine check --strict")]
                if p]
    if wheels:
        ignore = ["--ignore", ",".join(CHECK_WHEEL_CONTENTS_IGNORE)] if CHECK_WHEEL_CONTENTS_IGNORE else []
        said = _client(["-m", "check_wheel_contents", *ignore, *map(str, wheels)], "check-wheel-contents")
        problems += [said] if said else []
    for w in wheels:
        problems += repack_problems(w)
    return problems


# --- the one door: `invoke floor|contents`, `python -m jatools.wheel.wheel_checks`, `wheel_build --check` -------

CHECKS = ("floor", "contents", "clients")


def run(checks: list[str], dists: list[Path | WheelScan], layout: Layout | None = None) -> tuple[list[str], list[str]]:
    """Run `checks` (CHECKS) on `dists`, each wheel scanned once for floor and contents together (a scan given
    is used as it is); return the lines `<check>: ok ...` and the lines `<check>: FAIL ...`."""
    ok: list[str] = []
    failed: list[str] = []

    def say(check: str, good: bool, message: str) -> None:
        (ok if good else failed).append(f"{check}: {'ok' if good else 'FAIL'} {message}")

    paths = [d.wheel if isinstance(d, WheelScan) else d for d in dists]
    scanned_checks = [c for c in ("floor", "contents") if c in checks]
    for dist in dists if scanned_checks else []:
        try:
            if not isinstance(dist, WheelScan) and dist.suffix != ".whl":
                raise WheelReadError(f"{dist.name} is not a wheel; only the clients check an sdist (--clients)")
            scanned = dist if isinstance(dist, WheelScan) else scan(dist)
        except WheelReadError as e:
            for check in scanned_checks:
                say(check, False, str(e))
            continue
        if "floor" in checks:
            try:
                floor = check_floor(scanned)
                say("floor", floor.ok, floor.message)
            except FloorError as e:
                say("floor", False, str(e))
        if "contents" in checks:
            contents = check_contents(scanned, layout)
            say("contents", contents.ok, contents.message)
    if "clients" in checks:
        problems = client_problems(paths)
        for problem in problems:
            say("clients", False, problem)
        if not problems:
            say("clients", True, "twine check --strict, check-wheel-contents, wheel unpack + pack accept "
                                 + ", ".join(p.name for p in paths))
    return ok, failed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m jatools.wheel.wheel_checks", description=__doc__.splitlines()[0])
    p.add_argument("dists", nargs="+", type=Path, help="wheels (and, with --clients, sdists)")
    p.add_argument("--floor", action="store_true", help="the platform tag against the symbol floor (invoke floor)")
    p.add_argument("--contents", action="store_true", help="the content policy and RECORD (invoke contents)")
    p.add_argument("--clients", action="store_true", help="the clients users run: twine check --strict, "
                   "check-wheel-contents, wheel unpack + pack")
    args = p.parse_args(argv)
    checks = [c for c in CHECKS if getattr(args, c)] or ["floor", "contents"]
    ok, failed = run(checks, args.dists)
    for line in ok:
        print(line)
    for line in failed:
        print(line, file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
