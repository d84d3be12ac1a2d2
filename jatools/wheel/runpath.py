"""A library's RUNPATH as it must read inside the wheel, written into its bytes in place, as auditwheel repair does.

In the build tree the umbrella and shims live in one folder and the JIT libraries in another, so each library's
RUNPATH names its own folder and the other (`$ORIGIN:$ORIGIN/../aiter_build`): a library loads on its own, in any
order (docs/build.md). In the wheel every library sits in one folder (jatools/wheel/wheel_layout.toml `lib_dir`),
where those build-tree entries name folders that do not exist; the wheel build drops them (`wheel_entries`), so an
installed library's RUNPATH names only folders the wheel has. The rewrite is in place (the string shrinks and the
rest of its slot is zeroed, as chrpath does), so nothing else in the file moves and the result depends only on the
input bytes; it is refused when another name in the string table shares the bytes it would change.
"""
from __future__ import annotations

from pathlib import Path

from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerDefSection, GNUVerNeedSection

from jatools import config
from jatools.wheel.wheel_scan import ReadOnlyView, read_dynamic

ORIGIN_TOKENS = ("$ORIGIN", "${ORIGIN}")
PATH_TAGS = ("DT_RUNPATH", "DT_RPATH")
STRING_TAGS = ("DT_NEEDED", "DT_SONAME", "DT_RPATH", "DT_RUNPATH", "DT_AUXILIARY", "DT_FILTER")


class RunpathError(ValueError):
    """A dynamic string that cannot be rewritten in place; the message names the library and the fix."""


def build_tree_folders() -> tuple[str, ...]:
    """The build tree's library folders (config.BUILD_TREE: the umbrella's and shims', the JIT libraries')."""
    return tuple(sorted({config.BUILD_TREE["umbrella"], config.BUILD_TREE["jit"]}))


def wheel_entries(entries: tuple[str, ...] | list[str]) -> list[str]:
    """`entries` as the wheel needs them: an entry naming a build-tree library folder beside the library's own
    ($ORIGIN/../aiter_build) becomes `$ORIGIN`, since in the wheel those libraries are its siblings, and repeats are
    dropped. Every other entry stays as it is (the contents check judges it)."""
    tree = {f"{t}/../{folder}" for t in ORIGIN_TOKENS for folder in build_tree_folders()}
    return list(dict.fromkeys("$ORIGIN" if e.rstrip("/") in tree else e for e in entries))


def _string_refs(elf: ELFFile, strtab_index: int) -> list[int]:
    """The offsets into the dynamic string table that anything in the file names (tags, symbols, versions)."""
    refs = []
    for section in elf.iter_sections():
        if isinstance(section, DynamicSection):
            refs += [t.entry.d_val for t in section.iter_tags() if t.entry.d_tag in STRING_TAGS]
        elif section["sh_link"] != strtab_index:
            continue
        elif section["sh_type"] == "SHT_DYNSYM":
            refs += [s["st_name"] for s in section.iter_symbols()]
        elif isinstance(section, GNUVerNeedSection):
            for need, auxes in section.iter_versions():
                refs += [need["vn_file"], *(a["vna_name"] for a in auxes)]
        elif isinstance(section, GNUVerDefSection):
            refs += [a["vda_name"] for _, auxes in section.iter_versions() for a in auxes]
    return refs


def _dynamic(data: bytearray) -> tuple[ELFFile, DynamicSection | None]:
    elf = ELFFile(ReadOnlyView(data))
    return elf, next((s for s in elf.iter_sections() if isinstance(s, DynamicSection)), None)


def set_dynamic_string(data: bytearray, tag: str, old: str, new: str, where: str = "the library") -> None:
    """Set the dynamic entry `tag` whose string is `old` to `new` in `data` (an ELF shared library's bytes), in
    place: `new` may not be longer, and no other name may share the bytes that change (RunpathError otherwise)."""
    if len(new.encode()) > len(old.encode()):
        raise RunpathError(f"{where}: {tag} {new!r} is longer than {old!r}; an in-place rewrite only shortens it")
    elf, dynamic = _dynamic(data)
    if dynamic is None:
        raise RunpathError(f"{where} has no dynamic section")
    strtab = elf.get_section(dynamic["sh_link"])
    hits = {t.entry.d_val for t in dynamic.iter_tags()
            if t.entry.d_tag == tag and strtab.get_string(t.entry.d_val) == old}
    if not hits:
        raise RunpathError(f"{where}: no {tag} entry {old!r}")
    size = len(old.encode())
    if [r for r in _string_refs(elf, dynamic["sh_link"]) for h in hits if h < r <= h + size]:
        raise RunpathError(f"{where}: other names share the bytes of its {tag} string {old!r} (a linker merged them), "
                           "so it cannot be rewritten in place; relink it without that entry")
    for h in hits:
        at = strtab["sh_offset"] + h
        data[at:at + size] = new.encode().ljust(size, b"\0")


def needs_rewrite(path: Path) -> bool:
    """Whether the library at `path` has an RPATH/RUNPATH entry the wheel must rewrite (reads its headers only)."""
    info = read_dynamic(path)
    return any(wheel_entries(list(e)) != list(e) for e in (info.rpath, info.runpath) if e)


def for_wheel(data: bytearray, where: str) -> str | None:
    """Rewrite a library's RPATH/RUNPATH in `data` as the wheel needs them (`wheel_entries`), in place; the new
    RUNPATH, or None when it needed no rewrite. `where` names the library in errors."""
    changed = None
    for tag in PATH_TAGS:
        _, dynamic = _dynamic(data)
        values = [getattr(t, tag[3:].lower()) for t in dynamic.iter_tags() if t.entry.d_tag == tag] if dynamic else []
        for value in values:
            kept = ":".join(wheel_entries(value.split(":")))
            if kept != value:
                set_dynamic_string(data, tag, value, kept, where)
                changed = kept
    return changed
