"""Judge a wheel read once (wheel_scan.py): the content policy, the ELF rules, the glibc symbol floor, the clients.

    python -m jatools.wheel.wheel_checks [--floor] [--contents] [--clients] DIST...   (none given: floor + contents)

Every check runs on one wheel_scan.scan, so one command inflates a wheel once. The floor is auditwheel's own `sym_tag` (why not `overall_tag`: docs/wheels.md); a
failure names the symbol versions above the claimed tag and the libraries that import them.
"""
from __future__ import annotations

import argparse
import email.parser
import functools
import json
import os
import posixpath
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from auditwheel.architecture import Architecture
from auditwheel.libc import Libc
from auditwheel.policy import WheelPolicies
from packaging.metadata import Metadata
from packaging.utils import (
    InvalidWheelFilename,
    canonicalize_name,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from jatools.wheel.wheel_layout import Layout, LayoutError, Variant, python_packages
from jatools.wheel.wheel_scan import (
    ElfDynamic,
    WheelReadError,
    WheelScan,
    baked_identity,
    dist_info_dir,
    pin_problems,
    record_problems,
    scan,
)

ORIGIN_TOKENS = ("$ORIGIN", "${ORIGIN}")


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


def _identity_variant(scanned: WheelScan, layout: Layout) -> str | None:
    """The variant the wheel's identity names (None when it cannot be read; the checks below report that)."""
    return (baked_identity(scanned, layout) or {}).get("variant")


@dataclass
class _Wheel:
    """What every content rule reads: the wheel's scan, its file name's parts, its variant and the layout."""

    path: Path
    scanned: WheelScan
    layout: Layout
    variant: Variant
    name: str
    version: Version
    tags: frozenset
    report: ContentsReport

    @functools.cached_property
    def dist_info(self) -> str:
        return dist_info_dir(self.path)

    @functools.cached_property
    def dist_files(self) -> dict[str, bytes | None]:
        """{name under the dist-info: its bytes}."""
        prefix = self.dist_info + "/"
        return {n[len(prefix):]: m.data for n, m in self.scanned.members.items() if n.startswith(prefix)}

    @functools.cached_property
    def required(self) -> list[str]:
        return [*self.layout.required_files, self.layout.identity_file,
                *map(self.layout.lib_member, self.variant.libraries)]

    @functools.cached_property
    def identity(self) -> tuple[dict | None, str | None]:
        """(the identity file's JSON, or None; why it cannot be read, or None). A missing one is a missing file."""
        f = self.layout.identity_file
        try:
            return (json.loads(self.scanned.members[f].data or b"") if f in self.scanned.members else None), None
        except json.JSONDecodeError as e:
            return None, f"{f} is not valid JSON ({e})"


def _read_wheel(wheel: Path | WheelScan, layout: Layout, report: ContentsReport) -> _Wheel | None:
    """The wheel, scanned and named; None (and the problem in the report) when its name or members cannot be read.
    The tag is checked here, on the file name, before anything is read."""
    path = wheel.wheel if isinstance(wheel, WheelScan) else wheel
    try:
        name, version, _, tags = parse_wheel_filename(path.name)
        report.problems += [f"tag {t} should be py3-none-<platform>: the libraries are loaded with ctypes, not as "
                            f"CPython extensions, and they are platform-specific" for t in tags
                            if t.interpreter != "py3" or t.abi != "none" or t.platform == "any"]
        scanned = wheel if isinstance(wheel, WheelScan) else scan(wheel)
        variant = layout.variant_for_version(str(version), _identity_variant(scanned, layout))
    except (InvalidWheelFilename, InvalidVersion) as e:
        report.problems.append(f"not a valid wheel file name ({e})")
        return None
    except (LayoutError, WheelReadError) as e:
        report.problems.append(str(e))
        return None
    report.variant = variant.name
    return _Wheel(path, scanned, layout, variant, name, version, tags, report)


def _members_rule(w: _Wheel) -> list[str]:
    """No member twice; RECORD as the members are."""
    dupes = sorted({n for n in w.scanned.names if w.scanned.names.count(n) > 1})
    return ([f"members stored twice: {', '.join(dupes)}"] if dupes else []) + record_problems(w.scanned)


def _pins_rule(w: _Wheel) -> list[str]:
    """Every library matches its pin in the identity file."""
    pinned = pin_problems(w.scanned, w.layout)
    if not pinned:
        w.report.notes.append(f"every library matches its pin in {w.layout.identity_file}: these are the bytes the "
                              "wheel was built with; who built it is what a build attestation says (docs/security.md)")
    return pinned


def _dist_info_rule(w: _Wheel) -> list[str]:
    """The dist-info holds exactly its files; METADATA is valid and names the file name's project and version."""
    problems, expected = [], set(w.layout.dist_info_files)
    if w.dist_files.get("METADATA") is not None:
        try:
            meta = Metadata.from_email(w.dist_files["METADATA"], validate=True)
            if canonicalize_name(meta.name) != canonicalize_name(w.name) or str(meta.version) != str(w.version):
                problems.append(f"METADATA names {meta.name} {meta.version}, the file name {w.name} {w.version}")
            expected |= {f"licenses/{f}" for f in meta.license_files or []}  # PEP 639: in the dist-info's licenses/
        except Exception as e:  # noqa: BLE001 - packaging raises an ExceptionGroup of InvalidMetadata
            problems.append("METADATA is invalid: " + "; ".join(str(x) for x in getattr(e, "exceptions", [e])))
    problems += [f"{w.dist_info}/{missing} is missing" for missing in sorted(expected - set(w.dist_files))]
    return problems + [f"{w.dist_info}/{extra} is not expected in the dist-info"
                       for extra in sorted(set(w.dist_files) - expected)]


def _wheel_file_rule(w: _Wheel) -> list[str]:
    """WHEEL: version 1.0, not purelib, the file name's tags."""
    if w.dist_files.get("WHEEL") is None:
        return []  # reported as a missing file
    msg = email.parser.Parser().parsestr(w.dist_files["WHEEL"].decode("utf-8"))
    wheel_tags = set(msg.get_all("Tag") or [])
    return [problem for bad, problem in (
        (msg.get("Wheel-Version") != "1.0", f"WHEEL: Wheel-Version is {msg.get('Wheel-Version')!r}, expected '1.0'"),
        ((msg.get("Root-Is-Purelib") or "").lower() != "false",
         "WHEEL: Root-Is-Purelib must be false (the wheel holds native libraries)"),
        (wheel_tags != {str(t) for t in w.tags},
         f"WHEEL: Tag {sorted(wheel_tags)} differs from the file name's {sorted(map(str, w.tags))}")) if bad]


def _files_rule(w: _Wheel) -> list[str]:
    """The variant's files, none it leaves out, nothing else but the modules of the packages."""
    problems = [f"{r} is missing from the {w.variant.name} wheel (jatools/wheel/wheel_layout.toml requires it)"
                for r in w.required if r not in w.scanned.names]
    not_here = [w.layout.lib_member(n) for n in w.layout.libraries if n not in w.variant.libraries]
    py_dirs = {p.replace(".", "/") for p in python_packages()}
    for n in w.scanned.names:
        if n.startswith(w.dist_info + "/") or n in w.required:
            continue
        if n in not_here:
            fetched = posixpath.basename(n) in w.variant.fetched
            problems.append(f"{n} must not be in the {w.variant.name} wheel"
                            + (" (users fetch it with jax-aiter-fetch-mha)" if fetched else ""))
        elif not (n.endswith(".py") and posixpath.dirname(n) in py_dirs):
            problems.append(f"{n} is not expected in a wheel (not a library of the variant, not a module of the "
                            f"packages pyproject lists)")
    return problems


def _identity_rule(w: _Wheel) -> list[str]:
    """The identity file: valid JSON, every key, the wheel's version and variant, a known backend."""
    (ident, error), f = w.identity, w.layout.identity_file
    if ident is None:
        return [error] if error else []
    missing = [k for k in IDENTITY_KEYS if k not in ident]
    return [problem for bad, problem in (
        (missing, f"{f} lacks {', '.join(missing)}"),
        (ident.get("version") != str(w.version), f"{f} says version {ident.get('version')}, the wheel is {w.version}"),
        (ident.get("variant") != w.variant.name,
         f"{f} says variant {ident.get('variant')}, the version's local label makes it {w.variant.name}"),
        (ident.get("backend") not in BACKENDS,
         f"{f}: backend {ident.get('backend')!r} is not one of {', '.join(BACKENDS)}")) if bad]


def _elf_rule(w: _Wheel) -> list[str]:
    """The libraries: ELF files in the library folder, named by their SONAME, needing only what the wheel has or
    the backend allows."""
    backend = (w.identity[0] or {}).get("backend", "cpu")
    in_wheel = {posixpath.basename(n) for n in w.scanned.members if n.startswith(w.layout.lib_dir + "/")}
    problems = [f"{member.name} is not an ELF shared library" for lib in w.variant.libraries
                if (member := w.scanned.members.get(w.layout.lib_member(lib))) is not None and member.data is not None]
    for member, m in sorted(w.scanned.members.items()):
        problems += [m.elf_error] if m.elf_error else []
        if m.elf is None:
            continue
        if posixpath.dirname(member) != w.layout.lib_dir:
            problems.append(f"{member} is a native library outside {w.layout.lib_dir}/")
        if m.elf.soname and m.elf.soname != posixpath.basename(member):
            problems.append(f"{member}: SONAME {m.elf.soname} differs from its file name; other libraries find it by "
                            f"that name")
        problems += [f"{member} needs {dep}, which is neither in the wheel nor allowed from outside for the {backend} "
                     f"backend (allowlist in jatools/wheel/wheel_layout.toml [external])" for dep in m.elf.needed
                     if not (dep in in_wheel or w.layout.external_allowed(dep, backend) or dep in w.variant.fetched)]
    return problems


def _runpath_problem(w: _Wheel, member: str, kind: str, entries: list[str], entry: str, dirs: set[str]) -> str | None:
    """What is wrong with one RPATH/RUNPATH entry (None: nothing; a harmless one becomes a note)."""
    folder, bad = posixpath.dirname(member), [s for s in w.layout.runpath_forbidden if s in entry]
    token = next((t for t in ORIGIN_TOKENS if entry == t or entry.startswith(t + "/")), None)
    # Where an $ORIGIN entry points in the wheel ('..': outside it); None: not $ORIGIN-relative.
    target = token and posixpath.normpath(posixpath.join(folder, entry[len(token) + 1:]))
    where = f"{member}: {kind} entry {entry!r}"
    if not entry:
        return (f"{member}: {kind} has an empty entry ({':'.join(entries)!r}), which glibc reads as the current "
                f"directory: a library would load from wherever Python runs. Remove the stray ':' from the link line "
                f"and rebuild")
    if bad:
        return (f"{where} names {bad[0]}; TheRock resolves its runtime through ldconfig, never that folder. Remove it "
                f"from the link line and rebuild")
    if target is None:
        return f"{where} is not relative to $ORIGIN (a build-machine path); link with -rpath '$ORIGIN' only and rebuild"
    if target == ".." or target.startswith("../"):
        return f"{where} points outside the wheel ({target})"
    if target not in dirs:
        w.report.notes.append(f"{where} names {target}/, which the wheel does not have (a build-tree folder; "
                              f"harmless, the loader ignores it)")
    return None


def _runpath_rule(w: _Wheel) -> list[str]:
    """Every RPATH/RUNPATH entry relative to $ORIGIN, inside the wheel, never a forbidden folder."""
    dirs = {str(d) for n in w.scanned.members for d in PurePosixPath(n).parents if d.parts}  # the wheel's folders
    return [problem for member, m in sorted(w.scanned.members.items()) if m.elf is not None
            for kind, entries in (("RPATH", m.elf.rpath), ("RUNPATH", m.elf.runpath)) for entry in entries
            if (problem := _runpath_problem(w, member, kind, entries, entry, dirs))]


# The content policy, rule by rule, in the order their problems are listed.
CONTENTS_RULES = (_members_rule, _pins_rule, _dist_info_rule, _wheel_file_rule, _files_rule, _identity_rule,
                  _elf_rule, _runpath_rule)


def check_contents(wheel: Path | WheelScan, layout: Layout | None = None) -> ContentsReport:
    """The content policy on a wheel (scanned here unless given as a scan): CONTENTS_RULES, each a list of problems."""
    report = ContentsReport((wheel.wheel if isinstance(wheel, WheelScan) else wheel).name)
    read = _read_wheel(wheel, layout or Layout.load(), report)
    for rule in CONTENTS_RULES if read else ():
        report.problems += rule(read)
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
    with tempfile.TemporaryDirectory(prefix="ja-repack-") as tmp:
        said = _client(["-m", "wheel", "unpack", "-d", f"{tmp}/u", str(wheel)], "wheel unpack")
        unpacked = next(Path(tmp, "u").glob("*"), None) if said is None else None
        Path(tmp, "p").mkdir()
        if said := said or _client(["-m", "wheel", "pack", "-d", f"{tmp}/p", str(unpacked)], "wheel pack"):
            return [f"{wheel.name}: {said}"]
        again = next(Path(tmp, "p").glob("*.whl"))
        problems = [f"{wheel.name}: `wheel pack` names it {again.name}"] if again.name != wheel.name else []
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
    said = [_client(["-m", "twine", "check", "--strict", *map(str, dists)], "twine check --strict")]
    if wheels:
        ignore = ["--ignore", ",".join(CHECK_WHEEL_CONTENTS_IGNORE)] if CHECK_WHEEL_CONTENTS_IGNORE else []
        said.append(_client(["-m", "check_wheel_contents", *ignore, *map(str, wheels)], "check-wheel-contents"))
    return [s for s in said if s] + [p for w in wheels for p in repack_problems(w)]


# --- the one door: `invoke floor|contents`, `python -m jatools.wheel.wheel_checks`, `wheel_build --check` -------

CHECKS = ("floor", "contents", "clients")


def run(checks: list[str], dists: list[Path | WheelScan]) -> tuple[list[str], list[str]]:
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
        for check in scanned_checks:
            try:
                report = check_floor(scanned) if check == "floor" else check_contents(scanned)
                say(check, report.ok, report.message)
            except FloorError as e:
                say(check, False, str(e))
    if "clients" in checks:
        for problem in (problems := client_problems(paths)):
            say("clients", False, problem)
        if not problems:
            say("clients", True, "twine check --strict, check-wheel-contents, wheel unpack + pack accept "
                                 + ", ".join(p.name for p in paths))
    return ok, failed


def run_and_print(checks: list[str], dists: list[Path | WheelScan]) -> int:
    """`run`: the ok lines on stdout, the failures on stderr; the exit code (1: a check failed)."""
    ok, failed = run(checks, dists)
    for line in ok:
        print(line, flush=True)
    for line in failed:
        print(line, file=sys.stderr)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m jatools.wheel.wheel_checks", description=__doc__.splitlines()[0])
    p.add_argument("dists", nargs="+", type=Path, help="wheels (and, with --clients, sdists)")
    p.add_argument("--floor", action="store_true", help="the platform tag against the symbol floor (invoke floor)")
    p.add_argument("--contents", action="store_true", help="the content policy and RECORD (invoke contents)")
    p.add_argument("--clients", action="store_true", help="the clients users run: twine check --strict, "
                   "check-wheel-contents, wheel unpack + pack")
    args = p.parse_args(argv)
    return run_and_print([c for c in CHECKS if getattr(args, c)] or ["floor", "contents"], args.dists)


if __name__ == "__main__":
    sys.exit(main())
