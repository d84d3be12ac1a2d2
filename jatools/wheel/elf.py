"""Read what the dynamic loader sees in a shared library: SONAME, DT_NEEDED, RPATH/RUNPATH, symbol versions.

The wheel checks need these per library (auditwheel only reports them summed
over the whole wheel), so that a failure can name the library at fault.
pyelftools does the parsing; nothing here runs ``readelf`` or ``ldd``.
"""
from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerNeedSection

ELF_MAGIC = b"\x7fELF"
ORIGIN_TOKENS = ("$ORIGIN", "${ORIGIN}")


@dataclass(frozen=True)
class ElfDynamic:
    """The dynamic-linking facts of one ELF file."""

    path: str
    machine: str
    soname: str | None
    needed: tuple[str, ...]
    rpath: tuple[str, ...]
    runpath: tuple[str, ...]
    # {needed library: sorted version names}, e.g. {"libstdc++.so.6": ["GLIBCXX_3.4", "GLIBCXX_3.4.29"]}
    version_needs: dict[str, list[str]] = field(default_factory=dict)

    @property
    def search_paths(self) -> tuple[str, ...]:
        return self.rpath + self.runpath


def is_elf(path: str | Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == ELF_MAGIC


def read_dynamic(path: str | Path) -> ElfDynamic:
    """Parse `path`; raise ValueError naming the file when it is not a readable ELF file."""
    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            soname, needed, rpath, runpath = None, [], [], []
            versions: dict[str, set[str]] = {}
            for section in elf.iter_sections():
                if isinstance(section, DynamicSection):
                    for tag in section.iter_tags():
                        if tag.entry.d_tag == "DT_NEEDED":
                            needed.append(tag.needed)
                        elif tag.entry.d_tag == "DT_SONAME":
                            soname = tag.soname
                        elif tag.entry.d_tag == "DT_RPATH":
                            rpath += tag.rpath.split(":")  # empty entries kept: the contents check rejects them
                        elif tag.entry.d_tag == "DT_RUNPATH":
                            runpath += tag.runpath.split(":")
                elif isinstance(section, GNUVerNeedSection):
                    for verneed, auxiliaries in section.iter_versions():
                        names = versions.setdefault(verneed.name, set())
                        names.update(aux.name for aux in auxiliaries)
            return ElfDynamic(
                path=str(path),
                machine=elf["e_machine"],
                soname=soname,
                needed=tuple(needed),
                rpath=tuple(rpath),
                runpath=tuple(runpath),
                version_needs={lib: sorted(v) for lib, v in sorted(versions.items())},
            )
    except (ELFError, OSError) as e:
        raise ValueError(f"{path}: not a readable ELF shared library ({e})") from e


def origin_relative(entry: str) -> str | None:
    """The part after $ORIGIN ('' for $ORIGIN itself), or None when the entry does not start with it."""
    for token in ORIGIN_TOKENS:
        if entry == token:
            return ""
        if entry.startswith(token + "/"):
            return entry[len(token) + 1:]
    return None


def resolve_in_tree(member_dir: str, entry: str) -> str | None:
    """Where an $ORIGIN entry of a file in `member_dir` points, as a path relative to the tree root.

    Returns None for entries that are not $ORIGIN-relative, and a path starting
    with '..' for entries that leave the tree.
    """
    rel = origin_relative(entry)
    if rel is None:
        return None
    return posixpath.normpath(posixpath.join(member_dir, rel)) if rel else posixpath.normpath(member_dir)
