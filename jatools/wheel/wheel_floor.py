"""The glibc floor a wheel's libraries need, measured with auditwheel, against the tag the wheel claims.

A platform tag is a promise: `manylinux_2_28` says the wheel loads on glibc 2.28.
The versioned symbols the libraries import (GLIBC_2.x, GLIBCXX_3.4.x, ...) decide
whether that is true. auditwheel's policy table maps symbol versions to tags; its
`sym_tag` is the oldest tag the symbols allow. (`overall_tag` also counts GPU
runtime libraries outside auditwheel's allowlist, which makes it `linux_*` for
every GPU wheel, so it is not used.) A failure names the symbol versions above the
claimed tag and the libraries that import them, which auditwheel does not say.

    python -m jatools.wheel.wheel_floor WHEEL...
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from auditwheel.architecture import Architecture
from auditwheel.libc import Libc
from auditwheel.policy import WheelPolicies
from packaging.utils import parse_wheel_filename

from jatools.wheel import (
    elf,  # PEP 513/571/599 names for the first manylinux tags (PEP 600 spells them manylinux_2_5/12/17).
)

LEGACY_MANYLINUX = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
ELF_MACHINES = {"EM_X86_64": "x86_64", "EM_AARCH64": "aarch64", "EM_PPC64": "ppc64le", "EM_S390": "s390x"}
_TAG = re.compile(r"^(?P<family>manylinux_(?P<major>\d+)_(?P<minor>\d+)|manylinux1|manylinux2010|manylinux2014"
                  r"|musllinux_\d+_\d+|linux)_(?P<arch>[a-z0-9_]+)$")


class FloorError(RuntimeError):
    """The wheel claims an older glibc than its symbols allow (or cannot be analysed)."""


def glibc_of_tag(tag: str) -> tuple[int, int] | None:
    """(major, minor) glibc a manylinux platform tag promises; None for `linux_*` (which promises nothing)."""
    m = _TAG.match(tag)
    if not m:
        raise FloorError(f"{tag!r} is not a Linux platform tag pip accepts (e.g. manylinux_2_34_x86_64)")
    family = m.group("family")
    if family == "linux":
        return None
    if family in LEGACY_MANYLINUX:
        return LEGACY_MANYLINUX[family]
    if family.startswith("musllinux"):
        raise FloorError(f"{tag}: musllinux tags are not for these glibc-linked libraries")
    return int(m.group("major")), int(m.group("minor"))


def arch_of_tag(tag: str) -> str:
    m = _TAG.match(tag)
    if not m:
        raise FloorError(f"{tag!r} is not a Linux platform tag pip accepts (e.g. manylinux_2_34_x86_64)")
    return m.group("arch")


def normalise_plat_name(name: str) -> str:
    """JA_WHEEL_PLAT_NAME as bdist_wheel normalises it (`-` and `.` become `_`), checked to be a Linux tag."""
    tag = name.strip().replace("-", "_").replace(".", "_")
    glibc_of_tag(tag)
    return tag


def elf_arch(libs: list[elf.ElfDynamic]) -> str:
    machines = {lib.machine for lib in libs}
    if len(machines) != 1:
        raise FloorError(f"the libraries are for several machines ({', '.join(sorted(machines))}); one wheel "
                         f"holds one architecture")
    machine = machines.pop()
    if machine not in ELF_MACHINES:
        raise FloorError(f"no Linux wheel tag for ELF machine {machine}")
    return ELF_MACHINES[machine]


def _policies(arch: str) -> WheelPolicies:
    return WheelPolicies(libc=Libc.GLIBC, arch=Architecture(arch))


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


def measure(libs: dict[str, elf.ElfDynamic], arch: str | None = None) -> Floor:
    """The floor of these libraries ({name in wheel: dynamic info}) by auditwheel's policy table."""
    arch = arch or elf_arch(list(libs.values()))
    policies = _policies(arch)
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
    tag = policies.versioned_symbols_policy(versioned).name
    return Floor(tag, tuple(needs))


def auditwheel_show(wheel: Path) -> dict:
    """`auditwheel show --json WHEEL`, parsed; FloorError with auditwheel's words when it fails."""
    cmd = [sys.executable, "-m", "auditwheel", "show", "--json", str(wheel)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    try:
        data = json.loads(out.stdout[out.stdout.index("{"):]) if "{" in out.stdout else {}
    except json.JSONDecodeError:
        data = {}
    if out.returncode != 0 or "sym_tag" not in data:
        raise FloorError(f"{wheel.name}: `auditwheel show --json` failed (exit {out.returncode}): "
                         f"{data.get('error') or out.stderr.strip()[-800:] or out.stdout.strip()[-800:]}")
    return data


@dataclass(frozen=True)
class FloorReport:
    wheel: str
    claimed: tuple[str, ...]
    sym_tag: str
    ok: bool
    message: str
    needs: tuple[SymbolNeed, ...]


def check_wheel(wheel: Path) -> FloorReport:
    """Compare the wheel's platform tag(s) with auditwheel's sym_tag; attribute any excess to libraries."""
    from jatools.wheel.wheel_members import (
        extracted_elves,  # local: only this path unpacks the wheel
    )

    _, _, _, tags = parse_wheel_filename(wheel.name)
    claimed = tuple(sorted({t.platform for t in tags}))
    shown = auditwheel_show(wheel)
    sym_tag = shown["sym_tag"]
    floor_glibc = glibc_of_tag(sym_tag)
    with extracted_elves(wheel) as libs:
        floor = measure({Path(k).name: v for k, v in libs.items()}, arch_of_tag(sym_tag))
    problems = []
    if floor.tag != sym_tag:  # the tag the build measured must be the one auditwheel shows
        problems.append(f"the measured symbol floor {floor.tag} disagrees with `auditwheel show`'s sym_tag {sym_tag}; "
                        "update auditwheel and jatools/wheel/wheel_floor.py together")
    for tag in claimed:
        if tag == "any":
            problems.append(f"{tag}: a wheel with native libraries cannot be tagged 'any'")
            continue
        glibc = glibc_of_tag(tag)
        if arch_of_tag(tag) != arch_of_tag(sym_tag):
            problems.append(f"{tag}: the libraries are {arch_of_tag(sym_tag)}, the tag says {arch_of_tag(tag)}")
        elif glibc is not None and (floor_glibc is None or glibc < floor_glibc):
            above = floor.above(glibc)
            detail = "; ".join(
                f"{n.version} (needs {n.first_tag or 'a glibc newer than any manylinux policy'}) "
                f"from {', '.join(n.libraries)}" for n in above) or "see `auditwheel show` for the symbols"
            problems.append(
                f"tagged {tag}, but the versioned symbols need {sym_tag}: {detail}. Fix: tag it {sym_tag} "
                f"(unset JA_WHEEL_PLAT_NAME to use the measured floor, or set it to {sym_tag}), or build the "
                f"libraries with an older toolchain")
    if problems:
        return FloorReport(wheel.name, claimed, sym_tag, False, f"{wheel.name}: " + " | ".join(problems), floor.needs)
    stricter = floor_glibc is not None and all((glibc_of_tag(t) or (0, 0)) > floor_glibc for t in claimed)
    note = f" (stricter than needed: {sym_tag} would do)" if stricter else ""
    return FloorReport(wheel.name, claimed, sym_tag, True,
                       f"{wheel.name}: tag {', '.join(claimed)} is not older than the symbol floor {sym_tag}{note}",
                       floor.needs)


def check_wheels(wheels: list[Path]) -> list[FloorReport]:
    return [check_wheel(w) for w in wheels]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m jatools.wheel.wheel_floor", description=__doc__.splitlines()[0])
    p.add_argument("wheels", nargs="+", type=Path)
    args = p.parse_args(argv)
    failed = False
    for w in args.wheels:
        try:
            r = check_wheel(w)
        except FloorError as e:
            print(f"floor: FAIL {e}", file=sys.stderr)
            failed = True
            continue
        print(f"floor: {'ok' if r.ok else 'FAIL'} {r.message}", file=sys.stdout if r.ok else sys.stderr)
        failed |= not r.ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
