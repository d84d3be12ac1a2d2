"""The content policy on a wheel read once (wheel_scan.py): jatools/wheel/wheel_layout.toml and the op table
applied rule by rule (`CONTENTS_RULES`): members and RECORD, the pins, the dist-info, WHEEL, the variant's
files, the build identity, the ELF rules, each library's GPU code against the lane's backend and archs, and
RUNPATHs. `invoke contents` runs it (wheel_checks.py).
"""
from __future__ import annotations

import email.parser
import functools
import json
import posixpath
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from packaging.metadata import Metadata
from packaging.utils import (
    InvalidWheelFilename,
    canonicalize_name,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from jatools.wheel import device_code
from jatools.wheel.wheel_layout import (
    SOURCE_VARIANT,
    Layout,
    LayoutError,
    Variant,
    python_packages,
)
from jatools.wheel.wheel_scan import (
    REBUILD,
    WheelReadError,
    WheelScan,
    baked_identity,
    dist_info_dir,
    pin_problems,
    record_problems,
    scan,
)
from jax_aiter import remedies

ORIGIN_TOKENS = ("$ORIGIN", "${ORIGIN}")
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
         f"{f}: backend {ident.get('backend')!r} is not one of {', '.join(BACKENDS)}"),
        *_lane_problems(w, ident)) if bad]


def _lane_problems(w: _Wheel, ident: dict) -> list[tuple[bool, str]]:
    """The version's lane label names the lane of the libraries' backend, and the identity says the same."""
    if w.variant.name == SOURCE_VARIANT or ident.get("backend") not in w.layout.lanes:
        return []
    want, named = w.layout.lanes[ident["backend"]].name, w.layout.lane_for_version(str(w.version))
    f = w.layout.identity_file
    return [(named is None or named.name != want,
             (f"{w.version} names lane {named.name if named else '(none)'}, but the libraries are {ident['backend']}'s "
             f"(lane {want}): two backends' wheels would share a file name")),
            (ident.get("lane") != want, f"{f} says lane {ident.get('lane')}, the {ident['backend']} lane is {want}")]


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


def _device_rule(w: _Wheel) -> list[str]:
    """Each library's GPU code is its lane's (jatools/wheel/device_code.py): no other backend's; for a GPU lane,
    every JIT library has its backend's code, and a library with such code has it for exactly the identity's
    archs (an arch-specific variant, sm_90a, counts as its GPU's)."""
    ident = w.identity[0] or {}
    backend = ident.get("backend")
    if backend not in BACKENDS:
        return []  # the identity rule names that
    lane, archs = ident.get("lane") or backend, [str(a) for a in ident.get("gpu_archs") or []]
    want = {device_code.base_arch(a) for a in archs}
    gpu = " GPU_ARCHS='" + ";".join(archs) + "'" if archs else ""
    fix = (f"rebuild the libraries for the lane (JA_BACKEND={backend}{gpu}: make, {remedies.door('jit')}, "
           "make ja_mods), then the wheel")
    problems = []
    for member, m in sorted(w.scanned.members.items()):
        if m.elf is None:
            continue
        if m.elf.device_error:
            problems.append(f"{m.elf.device_error}; {fix}")
        problems += [f"{member} carries {other} GPU code ({', '.join(found) or 'no arch'}), but the wheel is the "
                     f"{lane} lane (backend {backend}); {fix}" for other, found in m.elf.device.items()
                     if other != backend]
        spec = w.layout.libraries.get(posixpath.basename(member))
        if backend == "cpu" or (found := m.elf.device.get(backend)) is None:
            if backend != "cpu" and spec is not None and spec.kind == "jit":
                problems.append(f"{member} has no {backend} GPU code, but the wheel is the {lane} lane (built for "
                                f"{', '.join(archs) or 'no arch'}): a build for another backend labelled {lane}; {fix}")
            continue
        got = {device_code.base_arch(a) for a in found if not a.startswith("compute_")}
        if got != want:
            problems.append(f"{member} has {backend} code for {', '.join(sorted(got)) or 'no arch'}, but the wheel's "
                            f"identity says {', '.join(archs) or 'no arch'}"
                            + (f" (none for {', '.join(sorted(want - got))})" if want - got else "")
                            + (f" (code for {', '.join(sorted(got - want))}, which it does not claim)"
                               if got - want else "") + f"; {fix}")
    return problems


def _runpath_problem(w: _Wheel, member: str, kind: str, entries: list[str], entry: str, dirs: set[str]) -> str | None:
    """What is wrong with one RPATH/RUNPATH entry (None: nothing)."""
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
        return (f"{where} names {target}/, which the wheel does not have: an installed library would search a "
                f"folder that is not there (a build-tree entry the wheel build makes $ORIGIN: "
                f"jatools/wheel/runpath.py). Rebuild the wheel ({REBUILD})")
    return None


def _runpath_rule(w: _Wheel) -> list[str]:
    """Every RPATH/RUNPATH entry relative to $ORIGIN, naming a folder the wheel has, never a forbidden one."""
    dirs = {str(d) for n in w.scanned.members for d in PurePosixPath(n).parents if d.parts}  # the wheel's folders
    return [problem for member, m in sorted(w.scanned.members.items()) if m.elf is not None
            for kind, entries in (("RPATH", m.elf.rpath), ("RUNPATH", m.elf.runpath)) for entry in entries
            if (problem := _runpath_problem(w, member, kind, entries, entry, dirs))]


# The content policy, rule by rule, in the order their problems are listed.
CONTENTS_RULES = (_members_rule, _pins_rule, _dist_info_rule, _wheel_file_rule, _files_rule, _identity_rule,
                  _elf_rule, _device_rule, _runpath_rule)


def check_contents(wheel: Path | WheelScan, layout: Layout | None = None) -> ContentsReport:
    """The content policy on a wheel (scanned here unless given as a scan): CONTENTS_RULES, each a list of problems."""
    report = ContentsReport((wheel.wheel if isinstance(wheel, WheelScan) else wheel).name)
    read = _read_wheel(wheel, layout or Layout.load(), report)
    for rule in CONTENTS_RULES if read else ():
        report.problems += rule(read)
    report.problems = list(dict.fromkeys(report.problems))  # a missing RECORD is a missing file and no RECORD
    return report
