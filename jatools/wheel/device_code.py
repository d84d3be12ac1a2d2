"""Which GPU code a library carries, read from its ELF sections without a GPU toolkit: the backend and the archs.

    CUDA  `.nv_fatbin`: fat binaries (magic 0xBA55ED50), each a list of entries; an entry's header names its kind
          (cubin or PTX), its SM arch and whether it is the arch-specific variant (sm_90a). `cuobjdump --list-elf`
          lists the same cubins (tests/wheel/test_device_code.py holds the two equal on an nvcc build).
    ROCm  `.hip_fatbin`: clang offload bundles ("__CLANG_OFFLOAD_BUNDLE__", a table of entries named by target:
          `hipv4-amdgcn-amd-amdhsa--gfx950`), or compressed ones ("CCOB", zlib or zstd; only the table is inflated).

The content check (wheel_contents.py) holds each library's code to the backend and archs its wheel's lane names, so
a wheel labelled rocm7 whose libraries are CPU or CUDA builds is refused.
"""
from __future__ import annotations

import re
import struct
import zlib

SECTIONS = {".nv_fatbin": "cuda", ".hip_fatbin": "rocm"}
FATBIN_MAGIC = 0xBA55ED50
FATBIN_HEADER = struct.Struct("<IHHQ")  # magic, version, header size, size of the entries that follow
FATBIN_ENTRY = struct.Struct("<HHIQIIHHI")  # kind, -, header size, payload size, -, -, minor, major, sm arch
FATBIN_FLAGS = struct.Struct("<Q")  # at offset 40 of an entry: 0x100000 marks the arch-specific variant (sm_90a)
CUBIN, PTX, ARCH_SPECIFIC = 2, 1, 0x100000
BUNDLE_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"
COMPRESSED_MAGIC = b"CCOB"
ZLIB, ZSTD = 0, 1
TABLE_MAX = 1 << 20  # an offload bundle's entry table is a few hundred bytes; inflate no more than this of one


class DeviceCodeError(ValueError):
    """A device-code section that cannot be read (truncated, or a format this reader does not know)."""


def device_archs(buffer, sections: dict[str, tuple[int, int]]) -> dict[str, tuple[str, ...]]:
    """{backend: sorted archs} of the device code in an ELF file's bytes `buffer` (any bytes-like object, not
    copied), given {section name: (file offset, size)}; a backend with such a section but no code reads as ()."""
    out: dict[str, set[str]] = {}
    view = memoryview(buffer)
    for name, (offset, size) in sections.items():
        backend = SECTIONS.get(name)
        if backend is None:
            continue
        if offset + size > len(view):
            raise DeviceCodeError(f"section {name} runs past the end of the file")
        data = view[offset:offset + size]
        out.setdefault(backend, set()).update(_cuda(data) if backend == "cuda" else _rocm(data))
    return {b: tuple(sorted(a)) for b, a in sorted(out.items())}


def _cuda(data: memoryview) -> set[str]:
    archs, pos = set(), 0
    while pos + FATBIN_HEADER.size <= len(data):
        magic, _, header, size = FATBIN_HEADER.unpack_from(data, pos)
        if magic != FATBIN_MAGIC:
            if not any(data[pos:pos + 64]):  # padding between the fat binaries of several objects
                pos += 8
                continue
            raise DeviceCodeError(f"no fat binary at offset {pos} of .nv_fatbin (magic {magic:#x})")
        entry, end = pos + header, pos + header + size
        if end > len(data):
            raise DeviceCodeError(f"the fat binary at offset {pos} of .nv_fatbin runs past the section")
        while entry + 48 <= end:
            kind, _, entry_header, payload, _, _, _, _, sm = FATBIN_ENTRY.unpack_from(data, entry)
            (flags,) = FATBIN_FLAGS.unpack_from(data, entry + 40)
            if kind == CUBIN:
                archs.add(f"sm_{sm}{'a' if flags & ARCH_SPECIFIC else ''}")
            elif kind == PTX:
                archs.add(f"compute_{sm}")
            if entry_header == 0:
                raise DeviceCodeError(f"an entry of the fat binary at offset {pos} of .nv_fatbin has no header")
            entry += entry_header + payload
        pos = end
    return archs


def _table(bundle: bytes | memoryview, where: str) -> tuple[set[str], int]:
    """(the gfx targets an offload bundle's table names, the bundle's length as the table gives it)."""
    try:
        (count,) = struct.unpack_from("<Q", bundle, len(BUNDLE_MAGIC))
        pos, archs, extent = len(BUNDLE_MAGIC) + 8, set(), 0
        for _ in range(count):
            offset, size, id_len = struct.unpack_from("<QQQ", bundle, pos)
            target = bytes(bundle[pos + 24:pos + 24 + id_len]).decode()
            if len(target) != id_len:
                raise DeviceCodeError(f"the offload bundle {where} is cut off in its entry table")
            pos += 24 + id_len
            extent = max(extent, offset + size)
            kind, _, arch = target.partition("--")
            if "amdgcn" in kind:
                archs.add(arch)
    except (struct.error, UnicodeDecodeError) as e:
        raise DeviceCodeError(f"the offload bundle {where} has an unreadable entry table ({e})") from None
    return archs, max(extent, pos)


def _inflated_table(data: memoryview, pos: int) -> tuple[set[str], int | None]:
    """A compressed bundle ("CCOB" version 1 to 3): (its targets, its length when the header gives it)."""
    version, method = struct.unpack_from("<HH", data, pos + 4)
    fields = {1: "<IQ", 2: "<IIQ", 3: "<QQQ"}.get(version)
    if fields is None or method not in (ZLIB, ZSTD):
        raise DeviceCodeError(f"compressed offload bundle version {version}, method {method} at offset {pos} of "
                              ".hip_fatbin is not one this reader knows")
    head = struct.unpack_from(fields, data, pos + 8)
    total = head[0] if version > 1 else None
    body = data[pos + 8 + struct.calcsize(fields):pos + total if total else len(data)]
    if method == ZSTD:
        import zstandard

        reader = zstandard.ZstdDecompressor().stream_reader(bytes(body[:TABLE_MAX]))
        table = reader.read(TABLE_MAX)
    else:
        table = zlib.decompressobj().decompress(bytes(body[:TABLE_MAX]), TABLE_MAX)
    if not table.startswith(BUNDLE_MAGIC):
        raise DeviceCodeError(f"the compressed offload bundle at offset {pos} of .hip_fatbin holds no bundle")
    return _table(table, f"compressed at offset {pos} of .hip_fatbin")[0], total


def _rocm(data: memoryview) -> set[str]:
    archs, pos = set(), 0
    starts = re.compile(re.escape(BUNDLE_MAGIC) + b"|" + COMPRESSED_MAGIC)
    while (m := starts.search(data, pos)) is not None:
        pos = m.start()
        if data[pos:pos + 4] == COMPRESSED_MAGIC:
            found, total = _inflated_table(data, pos)
            archs |= found
            if total is None:  # version 1 gives no length: the rest of the section is its compressed bytes
                break
            pos += total
            continue
        else:
            found, extent = _table(data[pos:], f"at offset {pos} of .hip_fatbin")
            pos += extent
            archs |= found
    return archs


def base_arch(arch: str) -> str:
    """The GPU an arch's code is for, without its variant: sm_90a -> sm_90, gfx90a:xnack- -> gfx90a."""
    arch = arch.split(":")[0]
    return arch[:-1] if re.fullmatch(r"sm_\d+[af]", arch) else arch
