"""The wheel content policy: right files for the variant, only allowed outside libraries, clean RUNPATHs,
valid RECORD and metadata.

What a variant must and may hold is data (jatools/wheel/wheel_layout.toml); this module
only applies it to a wheel it reads back, so it can judge wheels built anywhere.

    python -m jatools.wheel.wheel_contents WHEEL...
"""
from __future__ import annotations

import argparse
import email.parser
import json
import os
import posixpath
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from packaging.metadata import Metadata
from packaging.utils import (
    InvalidWheelFilename,
    canonicalize_name,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion

from jatools.wheel import elf, wheel_members
from jatools.wheel.wheel_layout import Layout, LayoutError, Variant, python_packages

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

    def message(self) -> str:
        if self.ok:
            return f"{self.wheel}: contents of the {self.variant} variant are as expected" + "".join(
                f"\n  note: {n}" for n in self.notes)
        return f"{self.wheel}: " + "".join(f"\n  - {p}" for p in self.problems)


def _check_record(report: ContentsReport, names: list[str], record: dict[str, tuple[str, str]],
                  scanned: dict[str, wheel_members.MemberScan], record_path: str) -> None:
    for name in names:
        if name == record_path:
            continue
        if name not in record:
            report.problems.append(f"{name} is in the zip but not in RECORD")
            continue
        want_hash, want_size = record[name]
        got = scanned[name]
        if want_hash != got.record_hash or want_size != str(got.size):
            report.problems.append(f"{name}: RECORD says {want_hash} ({want_size} bytes), the member is "
                                   f"{got.record_hash} ({got.size} bytes); the wheel was altered after it was built")
    for name in record:
        if name not in names:
            report.problems.append(f"RECORD lists {name}, which is not in the wheel")


def _check_dist_info(report: ContentsReport, zf: zipfile.ZipFile, dist_info: str, layout: Layout, name: str,
                     version: str, tags: set[str]) -> None:
    present = {n[len(dist_info) + 1:] for n in zf.namelist() if n.startswith(dist_info + "/")}
    expected = set(layout.dist_info_files)
    if "METADATA" in present:
        try:
            meta = Metadata.from_email(zf.read(f"{dist_info}/METADATA"), validate=True)
            if canonicalize_name(meta.name) != canonicalize_name(name) or str(meta.version) != version:
                report.problems.append(f"METADATA names {meta.name} {meta.version}, the file name {name} {version}")
            # PEP 639: each License-File is in the dist-info's licenses/ folder.
            expected |= {f"licenses/{f}" for f in meta.license_files or []}
        except Exception as e:  # noqa: BLE001 - packaging raises an ExceptionGroup of InvalidMetadata
            errors = getattr(e, "exceptions", [e])
            report.problems.append("METADATA is invalid: " + "; ".join(str(x) for x in errors))
    for missing in sorted(expected - present):
        report.problems.append(f"{dist_info}/{missing} is missing")
    for extra in sorted(present - expected):
        report.problems.append(f"{dist_info}/{extra} is not expected in the dist-info")
    if "WHEEL" in present:
        msg = email.parser.Parser().parsestr(zf.read(f"{dist_info}/WHEEL").decode("utf-8"))
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


def _check_identity(report: ContentsReport, zf: zipfile.ZipFile, layout: Layout, variant: Variant,
                    version: str) -> dict | None:
    try:
        ident = json.loads(zf.read(layout.identity_file))
    except KeyError:
        return None  # reported as a missing file
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


def _check_elves(report: ContentsReport, elves: dict[str, elf.ElfDynamic], names: list[str], layout: Layout,
                 variant: Variant, backend: str) -> None:
    in_wheel = {posixpath.basename(n) for n in names if n.startswith(layout.lib_dir + "/")}
    dirs = {d for n in names for d in _parents(n)} | {""}
    for member, info in sorted(elves.items()):
        base = posixpath.basename(member)
        if posixpath.dirname(member) != layout.lib_dir:
            report.problems.append(f"{member} is a native library outside {layout.lib_dir}/")
        if info.soname and info.soname != base:
            report.problems.append(f"{member}: SONAME {info.soname} differs from its file name; other libraries "
                                   f"find it by that name")
        for dep in info.needed:
            if dep in in_wheel or layout.external_allowed(dep, backend):
                continue
            if dep in variant.fetched:
                continue
            report.problems.append(
                f"{member} needs {dep}, which is neither in the wheel nor allowed from outside for the {backend} "
                f"backend (allowlist in jatools/wheel/wheel_layout.toml [external])")
        for kind, entries in (("RPATH", info.rpath), ("RUNPATH", info.runpath)):
            for entry in entries:
                bad = [s for s in layout.runpath_forbidden if s in entry]
                target = elf.resolve_in_tree(posixpath.dirname(member), entry)
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


def check_wheel(wheel: Path, layout: Layout | None = None, workers: int | None = None) -> ContentsReport:
    layout = layout or Layout.load()
    report = ContentsReport(wheel.name)
    try:
        name, version, _, tags = parse_wheel_filename(wheel.name)
    except (InvalidWheelFilename, InvalidVersion) as e:
        report.problems.append(f"not a valid wheel file name ({e})")
        return report
    tag_strs = {str(t) for t in tags}
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
    dist_info = wheel_members.dist_info_dir(wheel)
    with tempfile.TemporaryDirectory(prefix="ja-contents-") as tmp:
        try:
            record = wheel_members.read_record(wheel)
            scanned = wheel_members.scan(wheel, extract_dir=Path(tmp), workers=workers)
        except wheel_members.WheelReadError as e:
            report.problems.append(str(e))
            return report
        with zipfile.ZipFile(wheel) as zf:
            names = [i.filename for i in zf.infolist() if not i.is_dir()]
            dupes = sorted({n for n in names if names.count(n) > 1})
            if dupes:
                report.problems.append(f"members stored twice: {', '.join(dupes)}")
            _check_record(report, names, record, scanned, f"{dist_info}/RECORD")
            _check_dist_info(report, zf, dist_info, layout, str(name), str(version), tag_strs)
            _check_files(report, names, layout, variant, dist_info)
            ident = _check_identity(report, zf, layout, variant, str(version))
        elves = {}
        for member, s in scanned.items():
            if s.is_elf and s.extracted is not None:
                try:
                    elves[member] = elf.read_dynamic(s.extracted)
                except ValueError as e:
                    report.problems.append(f"{member}: {e}")
        for lib in variant.libraries:
            member = layout.lib_member(lib)
            if member in scanned and not scanned[member].is_elf:
                report.problems.append(f"{member} is not an ELF shared library")
        _check_elves(report, elves, names, layout, variant, (ident or {}).get("backend", "cpu"))
    return report


def check_wheels(wheels: list[Path], layout: Layout | None = None) -> list[ContentsReport]:
    return [check_wheel(w, layout) for w in wheels]


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
    `check-wheel-contents` and `wheel unpack` + `wheel pack` (wheels). Empty: every client accepts them.
    `auditwheel show` against the measured floor is `invoke floor` (jatools/wheel/wheel_floor.py)."""
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m jatools.wheel.wheel_contents", description=__doc__.splitlines()[0])
    p.add_argument("dists", nargs="+", type=Path, help="wheels (and, with --clients, sdists)")
    p.add_argument("--clients", action="store_true", help="instead, run the clients users run on them (twine "
                   "check --strict, check-wheel-contents, wheel unpack + pack)")
    args = p.parse_args(argv)
    if args.clients:
        problems = client_problems(args.dists)
        for problem in problems:
            print(f"clients: FAIL {problem}", file=sys.stderr)
        if not problems:
            print(f"clients: ok twine check --strict, check-wheel-contents, wheel unpack + pack accept "
                  f"{', '.join(d.name for d in args.dists)}")
        return 1 if problems else 0
    failed = False
    for r in check_wheels(args.dists):
        print(f"contents: {'ok' if r.ok else 'FAIL'} {r.message()}", file=sys.stdout if r.ok else sys.stderr)
        failed |= not r.ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
