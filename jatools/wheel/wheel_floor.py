"""The symbol floor: the oldest glibc a wheel's libraries' versioned symbols allow, against the platform tag it
claims. The floor is auditwheel's own `sym_tag` (why not `overall_tag`: docs/wheels.md); a failure names the
symbol versions above the claimed tag and the libraries that import them. `invoke floor` runs it
(wheel_checks.py); the wheel build measures its tag with it.
"""
from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from pathlib import Path

from auditwheel.architecture import Architecture
from auditwheel.libc import Libc
from auditwheel.policy import WheelPolicies
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion

from jatools.wheel.wheel_scan import ElfDynamic, WheelReadError, WheelScan, scan

# PEP 513/571/599 names for the first manylinux tags (PEP 600 spells them manylinux_2_5/12/17).
LEGACY_MANYLINUX = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
ELF_MACHINES = {"EM_X86_64": "x86_64", "EM_AARCH64": "aarch64", "EM_PPC64": "ppc64le", "EM_S390": "s390x"}
_TAG = re.compile(r"^(?P<family>manylinux_(?P<major>\d+)_(?P<minor>\d+)|manylinux1|manylinux2010|manylinux2014"
                  r"|musllinux_\d+_\d+|linux)_(?P<arch>[a-z0-9_]+)$")


class FloorError(RuntimeError):
    """The wheel cannot be analysed (no libraries, several machines, a tag pip does not know)."""


def _match_tag(tag: str) -> re.Match:
    if not (m := _TAG.match(tag)):
        raise FloorError(f"{tag!r} is not a Linux platform tag pip accepts (e.g. manylinux_2_34_x86_64)")
    return m


def glibc_of_tag(tag: str) -> tuple[int, int] | None:
    """(major, minor) glibc a manylinux platform tag promises; None for `linux_*` (which promises nothing)."""
    family = (m := _match_tag(tag)).group("family")
    if family.startswith("musllinux"):
        raise FloorError(f"{tag}: musllinux tags are not for these glibc-linked libraries")
    if family == "linux" or family in LEGACY_MANYLINUX:
        return LEGACY_MANYLINUX.get(family)
    return int(m.group("major")), int(m.group("minor"))


def arch_of_tag(tag: str) -> str:
    return _match_tag(tag).group("arch")


def elf_arch(libs: list[ElfDynamic]) -> str:
    machines = {lib.machine for lib in libs}
    if len(machines) != 1:
        raise FloorError(f"the libraries are for several machines ({', '.join(sorted(machines))}); one wheel "
                         f"holds one architecture")
    if (machine := machines.pop()) not in ELF_MACHINES:
        raise FloorError(f"no Linux wheel tag for ELF machine {machine}")
    return ELF_MACHINES[machine]


@dataclass(frozen=True)
class SymbolNeed:
    version: str  # e.g. GLIBCXX_3.4.29
    first_tag: str | None  # oldest policy that provides it; None: newer than every policy auditwheel knows
    libraries: tuple[str, ...]  # the wheel's libraries that import it


def measure(libs: dict[str, ElfDynamic], arch: str) -> tuple[str, tuple[SymbolNeed, ...]]:
    """The floor of these libraries ({name in wheel: dynamic info}, all for `arch`) by auditwheel's policy table:
    the oldest tag their symbols allow (e.g. manylinux_2_34_x86_64; linux_x86_64: none) and what needs it."""
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
        # Skipped: a symbol family no policy constrains (e.g. a GPU runtime's own versions).
        if first is not None or any(prefix in p.symbol_versions for p in ordered):
            needs.append(SymbolNeed(version, first, tuple(sorted(names))))
    return policies.versioned_symbols_policy(versioned).name, tuple(needs)


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
    if not (libs := {posixpath.basename(n): m.elf for n, m in scanned.members.items() if m.elf is not None}):
        raise FloorError(f"{name}: no ELF library in the wheel, so no symbol floor to check it against")
    arch = elf_arch(list(libs.values()))
    sym_tag, needs = measure(libs, arch)
    floor_glibc = glibc_of_tag(sym_tag)
    problems = []
    for tag in claimed:
        if tag == "any":
            problems.append(f"{tag}: a wheel with native libraries cannot be tagged 'any'")
            continue
        glibc = glibc_of_tag(tag)
        if arch_of_tag(tag) != arch:
            problems.append(f"{tag}: the libraries are {arch}, the tag says {arch_of_tag(tag)}")
        elif glibc is not None and (floor_glibc is None or glibc < floor_glibc):
            above = [n for n in needs if n.first_tag is None or glibc_of_tag(n.first_tag) > glibc]
            detail = "; ".join(f"{n.version} (needs {n.first_tag or 'a glibc newer than any manylinux policy'}) from "
                               f"{', '.join(n.libraries)}" for n in above) or "see `auditwheel show` for the symbols"
            problems.append(
                f"tagged {tag}, but the versioned symbols need {sym_tag}: {detail}. Fix: tag it {sym_tag} "
                f"(unset JA_WHEEL_PLAT_NAME to use the measured floor, or set it to {sym_tag}), or build the "
                f"libraries with an older toolchain")
    stricter = not problems and floor_glibc is not None and all((glibc_of_tag(t) or (0, 0)) > floor_glibc
                                                                for t in claimed)
    note = f" (stricter than needed: {sym_tag} would do)" if stricter else ""
    message = " | ".join(problems) or f"tag {', '.join(claimed)} is not older than the symbol floor {sym_tag}{note}"
    return FloorReport(name, claimed, sym_tag, not problems, f"{name}: {message}", needs)
