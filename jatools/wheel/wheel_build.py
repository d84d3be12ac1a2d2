"""Build the lite or full wheel from the build tree: verify, stage, pack, read back, rename.

    python -m jatools.wheel.wheel_build --variant lite|full [--dist DIR] [--plat-name TAG] [--check]
    python -m jatools.wheel.wheel_build --sdist [--dist DIR]

This module is also the project's PEP 517/660 build backend (pyproject [build-system]): `python -m build`,
`pip wheel .`, `pip install [-e] .`, `uv build` call its hooks (end of the file), which call the same
`build()` as `nox -s wheel_*`, so every front-end makes the same bytes; `-C variant=full` picks the full wheel.

The steps, in order, are in docs/wheels.md. It never runs build_jit.py: a missing library fails at once with
the command that makes it. `--check` runs the floor and contents checks on the read-back's scan.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import fnmatch
import functools
import gzip
import importlib.metadata
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import tomllib
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from packaging.metadata import Metadata, RawMetadata, RFC822Message
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from jatools import atomic_write, config
from jatools.jitlibs import expect
from jatools.wheel import wheel_checks, wheel_scan
from jatools.wheel.wheel_layout import Layout, Variant, python_files, python_packages
from jatools.wheel.zip_writer import DeterministicZipWriter, WrittenMember
from jax_aiter import remedies
from jax_aiter import settings as numeric
from jax_aiter.fetch_mha import BASE_URL_KEY
from jax_aiter.integrity import (
    RECORD_NAME,
    IntegrityError,
    read_record,
    sha256_file,
    verify_entries,
)

GENERATOR = "jax-aiter jatools.wheel.wheel_build"
MIN_EPOCH = 315532800  # 1980-01-01, the first time a zip can hold
IDENTITY_SCHEMA = 1
LIB_MODE, FILE_MODE = 0o755, 0o644


class WheelBuildError(RuntimeError):
    """The wheel cannot be built; the message says what is wrong and which command fixes it."""


BUILD_ERRORS = (WheelBuildError, IntegrityError, expect.JitExpectationError, wheel_checks.FloorError,
                config.SettingError)


@dataclass(frozen=True)
class BuildOptions:
    variant: str
    dist_dir: Path
    plat_name: str | None = None  # JA_WHEEL_PLAT_NAME
    wheel_arch: str | None = None  # JA_WHEEL_ARCH: the GPU arch the wheel is for, recorded in its identity
    level: int | None = None  # libdeflate's level; None: pyproject's wheel_compress_level
    jobs: int | None = None
    source_date_epoch: int | None = None  # None: SOURCE_DATE_EPOCH, else the HEAD commit's time
    source_build: bool = False  # the libraries were built by this build, from an sdist (marked in the identity)

    @classmethod
    def from_env(cls, variant: str, dist_dir: Path, **flags) -> BuildOptions:
        """Environment (JA_WHEEL_PLAT_NAME, JA_WHEEL_ARCH, SOURCE_DATE_EPOCH) under explicit flags."""
        values = {"plat_name": os.environ.get("JA_WHEEL_PLAT_NAME") or None,
                  "wheel_arch": os.environ.get("JA_WHEEL_ARCH") or None,
                  "source_date_epoch": numeric.from_env("SOURCE_DATE_EPOCH")}
        return cls(variant=variant, dist_dir=dist_dir, **values | {k: v for k, v in flags.items() if v is not None})


@dataclass
class BuildResult:
    wheel: Path
    variant: str
    version: str
    platform_tag: str
    tag_source: str
    bytes_in: int
    bytes_out: int
    members: int
    compression: str = ""
    seconds: dict[str, float] = field(default_factory=dict)
    identity: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    scan: wheel_scan.WheelScan | None = field(default=None, repr=False)  # the read-back, for the checks

    def summary(self) -> str:
        secs = ", ".join(f"{k} {v:.2f} s" for k, v in self.seconds.items())
        ratio = self.bytes_out / self.bytes_in if self.bytes_in else 0
        return (f"wheel_build: {self.wheel}\n  variant {self.variant}, version {self.version}, tag "
                f"py3-none-{self.platform_tag} ({self.tag_source})\n  {self.members} members, "
                f"{self.bytes_in / 1e6:.1f} MB -> {self.bytes_out / 1e6:.1f} MB (ratio {ratio:.3f}, "
                f"{self.compression}); {secs}"
                + "".join(f"\n  note: {n}" for n in self.notes))


def file_name(project: dict) -> str:
    """The distribution name as wheel, sdist and dist-info names spell it (jax_aiter)."""
    return canonicalize_name(project["name"]).replace("-", "_")


def _project(root: Path) -> dict:
    return tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def library_sources(settings: config.Settings, layout: Layout, variant: Variant) -> dict[str, Path]:
    """{library name: path in the build tree}; WheelBuildError lists every missing one and its command."""
    paths = {name: settings.build_dir / layout.libraries[name].dir / name for name in variant.libraries}
    if missing := [f"{p} (produce it with: {layout.libraries[n].fix_command()})" for n, p in paths.items()
                   if not p.is_file()]:
        raise WheelBuildError(f"the {variant.name} wheel needs libraries that are not built: {'; '.join(missing)}. "
                              "The wheel build never runs build_jit.py itself.")
    return paths


def default_epoch(root: Path) -> int:
    """SOURCE_DATE_EPOCH, else the HEAD commit's time, else 1980: never the clock, so rebuilds match."""
    if (sde := numeric.from_env("SOURCE_DATE_EPOCH")) is not None:
        return max(MIN_EPOCH, sde)
    out = subprocess.run(["git", "-C", str(root), "log", "-1", "--format=%ct"], capture_output=True, text=True,
                         check=False)
    return max(MIN_EPOCH, int(out.stdout.strip())) if out.returncode == 0 and out.stdout.strip() else MIN_EPOCH


def build_identity(expectations: expect.JitExpectations, version: str, variant: Variant,
                   wheel_arch: str | None, native: dict[str, dict], base_url: str | None,
                   source_build: bool = False) -> dict:
    """The identity baked into the wheel: the JIT libraries' identity plus what this wheel is, the pins
    ({name, size, sha256} of every JIT library of its cache id and of the `native` libraries it ships: the
    loader and jax-aiter-fetch-mha accept only those bytes) and the base URL jax-aiter-fetch-mha fetches from."""
    ident = dict(expectations.identity)
    archs = list(ident.get("gpu_archs") or [])
    if wheel_arch and any(a not in archs for a in config.split_archs(wheel_arch)):
        raise WheelBuildError(
            f"JA_WHEEL_ARCH={wheel_arch} but the JIT libraries were built for "
            f"{', '.join(archs) or 'no GPU arch'} (backend {ident.get('backend')}, {expectations.source}); "
            f"rebuild them with GPU_ARCHS={wheel_arch} {remedies.door('jit')}, or unset JA_WHEEL_ARCH")
    ident.update(schema=IDENTITY_SCHEMA, version=version, variant=variant.name,
                 wheel_arch=";".join(config.split_archs(wheel_arch)) if wheel_arch else (";".join(archs) or None),
                 pins=sorted([*expectations.entries.values(), *native.values()], key=lambda e: e["name"]))
    if base_url:
        ident[BASE_URL_KEY] = base_url
    if source_build:  # built from the sdist on the installing machine, not a release build (docs/wheels.md)
        ident["source_build"] = True
    return ident


def verify_native(libs: dict[str, Path], names: list[str]) -> dict[str, dict]:
    """The umbrella library and shims against the record `make` wrote when it linked them; {name: entry}."""
    entries: dict[str, dict] = {}
    for folder in sorted({libs[n].parent for n in names}):
        here = [n for n in names if libs[n].parent == folder]
        fix = f"; run `make && make ja_mods` (each link records its library in {folder / RECORD_NAME})"
        record = read_record(folder / RECORD_NAME, fix) if (folder / RECORD_NAME).is_file() else {}
        if absent := [n for n in here if n not in record]:
            raise WheelBuildError(f"{', '.join(absent)} ha{'s' if len(absent) == 1 else 've'} no record of what "
                                  f"was linked{fix}")
        try:
            verify_entries(folder, [record[n] for n in here])
        except IntegrityError as e:
            raise IntegrityError(f"{e} ({folder / RECORD_NAME}): the library changed after make linked it; "
                                 "relink it (`make -B` for the umbrella, `make -B ja_mods` for shims)") from None
        entries.update({n: record[n] for n in here})
    return entries


def _toml_value(v) -> str:
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items()) + " }"
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return json.dumps(v)  # strings, numbers, true/false are written as TOML writes them


def anchor_pyproject(project: dict, version: str, packages: list[str], layout: Layout) -> str:
    """pyproject.toml for the staged tree: the repo's [project] at this version, libraries and the identity and
    data files as package data."""
    proj = {k: v for k, v in project.items() if k not in ("version", "readme", "dynamic")} | {"version": version}
    tables = {k: proj.pop(k) for k in list(proj) if isinstance(proj[k], dict) and k not in ("license",)}
    pkg_root = layout.lib_dir.split("/")[0]
    data_globs = [m[len(pkg_root) + 1:] for m in (f"{layout.lib_dir}/*.so", layout.identity_file, *layout.data_files)]
    lines = ["# Generated by jatools.wheel.wheel_build: this staged tree as a setuptools project, so that",
             "# `pip wheel <this folder> --no-deps --no-build-isolation` builds the equivalent wheel.",
             "[build-system]", 'requires = ["setuptools>=69", "wheel"]', 'build-backend = "setuptools.build_meta"',
             "", "[project]"]
    lines += [f"{k} = {_toml_value(v)}" for k, v in proj.items()]
    for name, table in tables.items():
        lines += ["", f"[project.{name}]"] + [f"{json.dumps(k)} = {_toml_value(v)}" for k, v in table.items()]
    lines += ["", "[tool.setuptools]", f"packages = {_toml_value(packages)}", "include-package-data = false",
              "", "[tool.setuptools.package-data]", f"{pkg_root} = {_toml_value(data_globs)}", ""]
    return "\n".join(lines)


def stage(settings: config.Settings, layout: Layout, variant: Variant, project: dict, version: str,
          libs: dict[str, Path], identity: dict,
          plat_tag: str | None = None) -> tuple[Path, dict[str, str], dict[str, str]]:
    """Write build/wheel_stage/<variant>/ atomically; return it, {member: how it was staged} and {member: sha256}
    of every file it copied or generated (the libraries are held to their records instead)."""
    stage_root = settings.build_dir / "wheel_stage"
    final = stage_root / variant.name
    tmp = stage_root / f".{variant.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        copied = [*python_files(settings.root), *layout.data_files]
        for rel in copied + license_files(project, settings.root):  # the licenses: the anchor project's
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(settings.root / rel, tmp / rel)
        how: dict[str, str] = dict.fromkeys(copied, "copy")
        # what each copied file holds now: the read-back holds the wheel to it, so a file changed in the stage
        # after staging (Python code or data, not only the libraries) does not ship
        digests = {rel: sha256_file(tmp / rel) for rel in copied}
        (tmp / layout.lib_dir).mkdir(parents=True, exist_ok=True)
        for name, src in sorted(libs.items()):
            try:
                os.link(src, tmp / layout.lib_member(name))
                how[layout.lib_member(name)] = "link"
            except OSError:
                shutil.copyfile(src, tmp / layout.lib_member(name))
                how[layout.lib_member(name)] = "copy"
        (tmp / layout.identity_file).write_text(json.dumps(identity, indent=2, sort_keys=True) + "\n")
        how[layout.identity_file] = "generated"
        digests[layout.identity_file] = sha256_file(tmp / layout.identity_file)
        (tmp / "pyproject.toml").write_text(anchor_pyproject(project, version, python_packages(settings.root), layout))
        if plat_tag:
            (tmp / "setup.cfg").write_text(f"[bdist_wheel]\npython_tag = py3\nplat_name = {plat_tag}\n")
        old = stage_root / f".{variant.name}.old-{os.getpid()}"
        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final, how, digests


def staged_members(stage_dir: Path, layout: Layout) -> list[tuple[str, Path, int]]:
    """(member, file, mode) of the package part of the wheel, in the order they are written."""
    tops = {m.split("/")[0] for m in (layout.lib_dir, layout.identity_file)}
    files = [(p.relative_to(stage_dir).as_posix(), p) for top in tops for p in (stage_dir / top).rglob("*")
             if p.is_file()]
    return sorted((rel, p, LIB_MODE if rel.startswith(layout.lib_dir + "/") else FILE_MODE) for rel, p in files)


# Core metadata field names as the spec writes them (packaging writes them lower-case, which twine rejects).
_FIELD_CASE = {"author-email": "Author-email", "maintainer-email": "Maintainer-email", "home-page": "Home-page",
               "download-url": "Download-URL", "project-url": "Project-URL"}
METADATA_VERSION = "2.4"  # License-Expression and License-File are 2.4 fields


def license_files(project: dict, root: Path) -> list[str]:
    """The files pyproject's `license-files` globs name (PEP 639), sorted; WheelBuildError when one matches nothing."""
    out: set[str] = set()
    for pattern in project.get("license-files", []):
        found = [p.relative_to(root).as_posix() for p in root.glob(pattern) if p.is_file()]
        if not found:
            raise WheelBuildError(f"pyproject.toml license-files: {pattern!r} matches no file in {root}; add the "
                                  "file (the project declares MIT: LICENSE at the root) or fix the pattern")
        out.update(found)
    return sorted(out)


def metadata_text(project: dict, version: str, root: Path) -> tuple[bytes, list[str]]:
    """METADATA (core metadata 2.4) from pyproject's [project], validated by packaging; notes on anything left out."""
    notes = []
    reqs = list(project.get("dependencies", []))
    extras = project.get("optional-dependencies", {})
    for extra, deps in extras.items():
        for dep in deps:
            r = Requirement(dep)
            marker = f'({r.marker}) and extra == "{extra}"' if r.marker else f'extra == "{extra}"'
            r.marker = None
            reqs.append(f"{r}; {marker}")
    raw: RawMetadata = {
        "metadata_version": METADATA_VERSION, "name": project["name"], "version": version,
        "summary": project.get("description", ""), "requires_python": project.get("requires-python", ""),
        "requires_dist": reqs, "provides_extra": list(extras), "classifiers": list(project.get("classifiers", [])),
        "project_urls": dict(project.get("urls", {})), "license_files": license_files(project, root)}
    if project.get("keywords"):
        raw["keywords"] = list(project["keywords"])
    for role in ("author", "maintainer"):  # PEP 621: names with emails go to *-email, names alone to the name field
        people = project.get(f"{role}s", [])
        if emails := [f"{p['name']} <{p['email']}>" if p.get("name") else p["email"] for p in people if p.get("email")]:
            raw[f"{role}_email"] = ", ".join(emails)
        if names := [p["name"] for p in people if p.get("name") and not p.get("email")]:
            raw[role] = ", ".join(names)
    lic = project.get("license")
    if isinstance(lic, str):
        raw["license_expression"] = lic
    elif isinstance(lic, dict):
        raise WheelBuildError("pyproject.toml: `license` is a table; write the SPDX expression instead "
                              '(license = "MIT") and list the files in license-files (PEP 639)')
    readme = project.get("readme")
    if isinstance(readme, str):
        path = root / readme
        if path.is_file():
            raw["description"] = path.read_text(encoding="utf-8")
            raw["description_content_type"] = "text/markdown" if readme.endswith(".md") else "text/plain"
        else:
            notes.append(f"pyproject names readme {readme!r}, which does not exist; METADATA has no description")
    try:
        meta = Metadata.from_raw(raw, validate=True)
    except Exception as e:  # packaging raises an ExceptionGroup of InvalidMetadata
        errors = getattr(e, "exceptions", [e])
        raise WheelBuildError("pyproject.toml [project] gives invalid metadata: "
                              + "; ".join(str(x) for x in errors)) from e
    out = RFC822Message()
    for name, value in meta.as_rfc822().items():
        out[_FIELD_CASE.get(name.lower(), "-".join(w.capitalize() for w in name.split("-")))] = value
    if meta.description is not None:
        out.set_payload(meta.description)
    return out.as_bytes(), notes


def wheel_text(tag: str, purelib: bool = False) -> bytes:
    # Not purelib: the libraries are platform-specific, so installers put them in platlib.
    return (f"Wheel-Version: 1.0\nGenerator: {GENERATOR}\nRoot-Is-Purelib: {str(purelib).lower()}\n"
            f"Tag: {tag}\n").encode()


def dist_info_files(project: dict, metadata: bytes, wheel: bytes, root: Path) -> dict[str, bytes]:
    """{file in the dist-info: bytes}, RECORD aside: METADATA, the license files (PEP 639: licenses/), WHEEL and
    the entry points. The wheel and prepare_metadata_for_build_wheel write the same ones."""
    groups = {"console_scripts": project.get("scripts", {}), "gui_scripts": project.get("gui-scripts", {}),
              **project.get("entry-points", {})}
    return {"METADATA": metadata,
            **{f"licenses/{rel}": (root / rel).read_bytes() for rel in license_files(project, root)},
            "WHEEL": wheel,
            "entry_points.txt": "".join(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items()) + "\n"
                                        for group, entries in groups.items() if entries).encode()}


def add_dist_info(zw: DeterministicZipWriter, dist_info: str, metadata: bytes, wheel: bytes, project: dict,
                  root: Path) -> list[WrittenMember]:
    """dist_info_files, then RECORD last. Returns the members RECORD lists (every one before it)."""
    for name, data in dist_info_files(project, metadata, wheel, root).items():
        zw.add_bytes(f"{dist_info}/{name}", data)
    written = zw.members
    record = io.StringIO()
    csv.writer(record, lineterminator="\n").writerows(
        [*([m.arcname, wheel_scan.record_hash(m.sha256), m.size] for m in written), [f"{dist_info}/RECORD", "", ""]])
    zw.add_bytes(f"{dist_info}/RECORD", record.getvalue().encode())
    return written


def platform_tag(options: BuildOptions, libs: dict[str, Path]) -> tuple[str, str]:
    """(tag, where it came from): JA_WHEEL_PLAT_NAME, else the measured symbol floor."""
    infos = {name: wheel_scan.read_dynamic(p) for name, p in libs.items()}
    arch = wheel_checks.elf_arch(list(infos.values()))
    if options.plat_name:
        tag = options.plat_name.strip().replace("-", "_").replace(".", "_")  # as bdist_wheel normalises it
        wheel_checks.glibc_of_tag(tag)  # FloorError unless a Linux tag
        if wheel_checks.arch_of_tag(tag) != arch:
            raise WheelBuildError(f"JA_WHEEL_PLAT_NAME={options.plat_name} is for {wheel_checks.arch_of_tag(tag)}, "
                                  f"but the libraries are {arch}")
        return tag, "JA_WHEEL_PLAT_NAME"
    return wheel_checks.measure(infos, arch)[0], "measured symbol floor (auditwheel policy)"


def read_back(wheel: Path, written: list[WrittenMember], jit_members: dict[str, str],
              expectations: expect.JitExpectations, jobs: int | None,
              native: dict[str, dict] | None = None, staged: dict[str, str] | None = None) -> wheel_scan.WheelScan:
    """Decompress every member of the written file: RECORD digests, JIT libraries against their record,
    `native` ({member: entry}, the umbrella and shims) against theirs and `staged` ({member: sha256}, the Python
    and data files) against what staging wrote. Returns the scan, for the checks."""
    try:
        scanned = wheel_scan.scan(wheel, workers=jobs)
    except wheel_scan.WheelReadError as e:
        raise IntegrityError(f"reading the new wheel back failed: {e}") from e
    members = scanned.members
    for member, name in jit_members.items():
        expectations.check_digest(name, members[member].sha256, f"{wheel.name}:{member}")
    for member, entry in (native or {}).items():
        if members[member].sha256 != entry["sha256"]:
            raise IntegrityError(f"{wheel.name}:{member}: sha256 {members[member].sha256} does not match the "
                                 f"{entry['sha256']} recorded when it was linked")
    for member, digest in (staged or {}).items():
        got = members[member].sha256 if member in members else "missing"
        if got != digest:
            raise IntegrityError(f"{wheel.name}:{member}: {got}, but staging wrote sha256 {digest}: the stage was "
                                 "changed after staging (another process?); build again")
    for m in written:
        got = members[m.arcname]
        if got.sha256 != m.sha256_hex or got.size != m.size:
            raise IntegrityError(f"{wheel.name}: {m.arcname} reads back as sha256 {got.sha256} ({got.size} bytes), "
                                 f"but {m.sha256_hex} ({m.size} bytes) was written")
    return scanned


PROGRESS_MIN_BYTES = 64 << 20  # members at least this big get a line of their own while packing
LOCK_NAME = ".wheel_build.lock"


def build(settings: config.Settings, options: BuildOptions, layout: Layout | None = None,
          expectations: expect.JitExpectations | None = None,
          log: Callable[[str], None] = print) -> BuildResult:
    """Build one wheel; `log` receives plain progress lines (they read the same on a terminal and in CI).

    Holds a lock on the stage and on the dist folder (in that order), so builds at once take turns instead
    of replacing each other's files, and first removes what killed builds left there."""
    from filelock import FileLock, Timeout

    with contextlib.ExitStack() as held:
        for folder, lock_at in ((settings.build_dir / "wheel_stage", settings.build_dir / ".wheel_stage.lock"),
                                (options.dist_dir, options.dist_dir / LOCK_NAME)):
            lock_at.parent.mkdir(parents=True, exist_ok=True)
            lock = FileLock(str(lock_at))
            try:
                lock.acquire(timeout=0)
            except Timeout:
                log(f"wheel_build: another wheel build holds {lock.lock_file}; waiting for it")
                lock.acquire()
            held.callback(lock.release)
            atomic_write.remove_dead_temps(folder, lambda m: log(f"wheel_build: {m}"))
        return _build_locked(settings, options, layout, expectations, log)


def _verify_libraries(settings: config.Settings, variant: Variant, version: str, libs: dict[str, Path],
                      jit_names: list[str], native_names: list[str], expectations: expect.JitExpectations | None,
                      log: Callable[[str], None]) -> tuple[expect.JitExpectations, dict[str, dict]]:
    """Every library the wheel will hold checked before staging: the JIT libraries against their record (the
    expectations), the native ones against theirs; (the expectations, {native library: its entry})."""
    try:
        expectations = expectations or expect.expectations(settings)
        log(f"wheel_build: {variant.name} {version}: verifying {len(jit_names)} JIT libraries "
            f"({sum(libs[n].stat().st_size for n in jit_names) / 1e6:.1f} MB) against {expectations.source}")
        expectations.verify_folder(settings.jit_dir, jit_names)
    except expect.JitExpectationError as e:
        raise WheelBuildError(str(e)) from e
    return expectations, verify_native(libs, native_names)


def _build_locked(settings: config.Settings, options: BuildOptions, layout: Layout | None,
                  expectations: expect.JitExpectations | None, log: Callable[[str], None]) -> BuildResult:
    t0 = time.monotonic()
    layout = layout or Layout.load()
    variant = layout.variant(options.variant)
    project = _project(settings.root)
    version = variant.version(project["version"])
    level = options.level or int(settings.raw["wheel_compress_level"])
    notes = [f"layout without {', '.join(layout.dropped)}"] if layout.dropped else []

    libs = library_sources(settings, layout, variant)
    jit_names = [n for n in variant.libraries if layout.libraries[n].kind == "jit"]
    native_names = [n for n in variant.libraries if layout.libraries[n].kind != "jit"]
    expectations, native = _verify_libraries(settings, variant, version, libs, jit_names, native_names,
                                             expectations, log)
    identity = build_identity(expectations, version, variant, options.wheel_arch, native,
                              settings.raw.get("jit_libs_base_url"), options.source_build)
    if identity.get("kernel_source_dirty"):
        notes.append("the JIT libraries were built from uncommitted kernel sources (kernel_source_dirty)")
    t_verify = time.monotonic()

    tag, tag_source = platform_tag(options, libs)
    stage_dir, how, staged_digests = stage(settings, layout, variant, project, version, libs, identity, tag)
    if copies := sorted(m for m, h in how.items() if h == "copy" and m.startswith(layout.lib_dir)):
        notes.append(f"copied (no hard link possible): {', '.join(copies)}")
    t_stage = time.monotonic()
    staged = ", ".join(f"{n} {h}" for h, n in sorted(Counter(how.values()).items()))
    log(f"wheel_build: staged {stage_dir} ({staged}); tag py3-none-{tag} ({tag_source})")

    dist_name, wheel_tag = file_name(project), f"py3-none-{tag}"
    wheel = options.dist_dir / f"{dist_name}-{version}-{wheel_tag}.whl"
    options.dist_dir.mkdir(parents=True, exist_ok=True)
    tmp = wheel.with_name(f".{wheel.name}.tmp-{os.getpid()}")
    epoch = options.source_date_epoch if options.source_date_epoch is not None else default_epoch(settings.root)
    metadata, meta_notes = metadata_text(project, version, settings.root)
    notes += meta_notes
    jit_members = {layout.lib_member(n): n for n in jit_names}
    members = staged_members(stage_dir, layout)
    log(f"wheel_build: packing {len(members)} files ({sum(p.stat().st_size for _, p, _ in members) / 1e6:.1f} MB) "
        f"with libdeflate level {level} on {options.jobs or os.cpu_count()} threads")

    def progress(m: WrittenMember) -> None:
        if m.size >= PROGRESS_MIN_BYTES:
            log(f"  {m.arcname}: {m.size / 1e6:.1f} MB -> {m.compressed_size / 1e6:.1f} MB "
                f"({time.monotonic() - t_stage:.1f} s into packing)")

    try:
        with open(tmp, "wb") as f, DeterministicZipWriter(f, time.gmtime(max(MIN_EPOCH, epoch))[:6], level=level,
                                                          workers=options.jobs) as zw:
            # JIT libraries were just hashed against their record; that digest goes into RECORD
            # unhashed again, and the read-back below proves the zipped bytes have it.
            known = {a: bytes.fromhex(expectations.entry(n)["sha256"]) for a, n in jit_members.items()}
            zw.add_files(((arcname, path, mode, known.get(arcname)) for arcname, path, mode in members),
                         on_written=progress)
            written = add_dist_info(zw, f"{dist_name}-{version}.dist-info", metadata, wheel_text(wheel_tag), project,
                                    settings.root)
        t_pack = time.monotonic()
        log(f"wheel_build: reading {tmp.name} back ({len(written) + 1} members)")
        scanned = read_back(tmp, written, jit_members, expectations, options.jobs,
                            {layout.lib_member(n): native[n] for n in native_names}, staged_digests)
        os.replace(tmp, wheel)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    t_end = time.monotonic()
    result = BuildResult(
        wheel=wheel, variant=variant.name, version=version, platform_tag=tag, tag_source=tag_source,
        bytes_in=sum(m.size for m in written), bytes_out=wheel.stat().st_size, members=len(written) + 1,
        compression=f"libdeflate (deflate {importlib.metadata.version('deflate')}) level {level}",
        seconds={"verify": t_verify - t0, "stage": t_stage - t_verify, "pack": t_pack - t_stage,
                 "read_back": t_end - t_pack, "total": t_end - t0},
        identity=identity, notes=notes, scan=replace(scanned, wheel=wheel))
    report = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(replace(result, scan=None)).items()
              if k != "scan"}
    atomic_write.write_text(settings.build_dir / "reports" / f"wheel_{variant.name}.json",
                            json.dumps(report, indent=2, sort_keys=True) + "\n")
    return result


# --- PEP 517 / PEP 660 hooks, called in the source tree (the current folder) by every front-end ---------------

CONFIG_SETTINGS = {"variant": "lite | full | source (default lite; source from an sdist without libraries): "
                              "-C variant=full, --config-settings variant=full"}
EDITABLE_PTH = "_jax_aiter_editable.pth"


def _variant(config_settings: dict | None, default: str = "lite") -> str:
    unknown = sorted(set(config_settings or {}) - set(CONFIG_SETTINGS))
    if unknown:
        raise SystemExit(f"jax-aiter build backend: unknown config setting(s) {', '.join(unknown)}; known: "
                         + "; ".join(f"{k}: {v}" for k, v in CONFIG_SETTINGS.items()))
    value = (config_settings or {}).get("variant", default)
    return value[-1] if isinstance(value, list) else value  # a setting given twice: the last one wins


@contextlib.contextmanager
def _backend_errors(hint: str = ""):
    try:
        yield
    except BUILD_ERRORS as e:
        raise SystemExit(f"jax-aiter build backend: error: {e}{hint}") from None


def get_requires_for_build_wheel(config_settings: dict | None = None) -> list[str]:
    return []  # [build-system].requires is everything


get_requires_for_build_editable = get_requires_for_build_sdist = get_requires_for_build_wheel


def prepare_metadata_for_build_wheel(metadata_directory: str, config_settings: dict | None = None) -> str:
    """PEP 517: the wheel's dist-info (METADATA, licenses, WHEEL, entry points) without building anything, so
    pip and uv resolve an sdist's dependencies before its native build."""
    variant = Layout.load().variant(_variant(config_settings))
    root = Path.cwd().resolve()
    project = _project(root)
    version = variant.version(project["version"])
    dist_info = Path(metadata_directory) / f"{file_name(project)}-{version}.dist-info"
    with _backend_errors():
        metadata, _ = metadata_text(project, version, root)
        # the tag is the build's to measure; WHEEL here says what is known before it (pip reads METADATA)
        for name, data in dist_info_files(project, metadata, wheel_text("py3-none-any"), root).items():
            (dist_info / name).parent.mkdir(parents=True, exist_ok=True)
            (dist_info / name).write_bytes(data)
    return dist_info.name


def prepare_metadata_for_build_editable(metadata_directory: str, config_settings: dict | None = None) -> str:
    """PEP 660: the editable wheel's dist-info, the same metadata."""
    return prepare_metadata_for_build_wheel(metadata_directory, config_settings)


SOURCE_VARIANT = "source"  # what an sdist without libraries builds by default (jatools/wheel/wheel_layout.toml)


def unbuilt_sdist(settings: config.Settings, variant: str = SOURCE_VARIANT) -> bool:
    """An unpacked sdist (it has PKG-INFO) whose build folder lacks a library of `variant`: a source build."""
    layout = Layout.load()
    return (settings.root / "PKG-INFO").is_file() and any(
        not (settings.build_dir / layout.libraries[n].dir / n).is_file() for n in layout.variant(variant).libraries)


def source_build(settings: config.Settings, log: Callable[[str], None]) -> None:
    """The native build of an unpacked sdist, here (umbrella, JIT libraries, shims: jatools/native/build.py's
    steps), for the backend JA_BACKEND names (auto: the CPU when no GPU compiler is found)."""
    from jatools import steps
    from jatools.native import build as native

    env = {**os.environ, "JA_ROOT_DIR": str(settings.root), "JA_JIT_LIBS": "build"}
    os.environ["JA_ROOT_DIR"] = str(settings.root)  # native_steps reads the checkout from it
    log(f"jax-aiter build backend: {settings.root} is an sdist with no native build: building the libraries here "
        f"(JA_BACKEND={env.get('JA_BACKEND') or settings.raw['backend']}; a release wheel never compiles)")
    try:
        steps.run(native.native_steps(jit="build", env=env), "source build", progress=log)
    except steps.StepFailed as e:
        raise WheelBuildError(f"the source build failed at {e.record.name}: {e}; the lines above say why "
                              "(JA_BACKEND=cpu builds the CPU libraries only)") from None


def build_wheel(wheel_directory: str, config_settings: dict | None = None,
                metadata_directory: str | None = None) -> str:
    """PEP 517: the lite wheel (or -C variant=full) from this tree's build folder. A checkout's build never
    compiles (a missing library is an error naming its command); an unpacked sdist without libraries (`pip
    install <sdist>`, `pip wheel`, `uv pip install`, `python -m build`) runs the native build first, and its
    identity says source_build."""
    stderr = functools.partial(print, file=sys.stderr, flush=True)
    with _backend_errors():
        settings = config.load(root=Path.cwd().resolve())  # the tree being built, whatever JA_ROOT_DIR says
        variant = _variant(config_settings, SOURCE_VARIANT if unbuilt_sdist(settings) else "lite")
        from_source = unbuilt_sdist(settings, variant)
        if from_source:
            source_build(settings, stderr)
        options = replace(BuildOptions.from_env(variant, Path(wheel_directory).resolve()), source_build=from_source)
        result = build(settings, options, log=stderr)
    stderr(result.summary())
    return result.wheel.name


def build_editable(wheel_directory: str, config_settings: dict | None = None,
                   metadata_directory: str | None = None) -> str:
    """PEP 660: a wheel of metadata and a .pth naming this tree, so `import jax_aiter` runs the checkout's code
    and loads its libraries from the build tree (jax_aiter/_loader.py); nothing is copied or compiled."""
    _variant(config_settings)
    root = config.load(root=Path.cwd().resolve()).root
    project = _project(root)
    version, dist_name, tag = project["version"], file_name(project), "py3-none-any"
    wheel = Path(wheel_directory).resolve() / f"{dist_name}-{version}-{tag}.whl"
    with _backend_errors():
        metadata, _ = metadata_text(project, version, root)
        with atomic_write.open_bytes(wheel) as f, DeterministicZipWriter(f, time.gmtime(default_epoch(root))[:6]) as zw:
            zw.add_bytes(EDITABLE_PTH, f"{root}\n".encode())
            add_dist_info(zw, f"{dist_name}-{version}.dist-info", metadata, wheel_text(tag, purelib=True), project,
                          root)
    return wheel.name


def sdist_files(root: Path) -> list[str]:
    """The files a rebuild needs ([tool.jax-aiter] sdist_include less sdist_exclude), sorted, as posix paths."""
    raw, out = config.defaults(root), set()
    for entry in raw["sdist_include"]:
        top = root / entry
        if not top.exists():
            raise WheelBuildError(f"pyproject.toml [tool.jax-aiter] sdist_include names {entry!r}, which is not in "
                                  f"{root}; restore it or drop it from the list")
        paths = [top] if top.is_file() else sorted(q for q in top.rglob("*") if q.is_file() or q.is_symlink())
        for q in paths:
            if q.is_symlink():
                raise WheelBuildError(f"{q} is a symbolic link; an sdist carries files only: replace it with the file "
                                      "or add it to [tool.jax-aiter] sdist_exclude")
            rel = q.relative_to(root).as_posix()
            if not any(fnmatch.fnmatchcase(rel, pat) or fnmatch.fnmatchcase(q.name, pat)
                       for pat in raw.get("sdist_exclude", [])):
                out.add(rel)
    return sorted(out)


def build_sdist(sdist_directory: str, config_settings: dict | None = None) -> str:
    """PEP 517: the sdist of this tree (`sdist`)."""
    _variant(config_settings)
    with _backend_errors():
        return sdist(Path.cwd().resolve(), Path(sdist_directory).resolve()).name


def sdist(root: Path, dist_dir: Path) -> Path:
    """jax_aiter-<version>.tar.gz with PKG-INFO and what a rebuild needs; reproducible (sorted members, owner 0,
    timestamps from SOURCE_DATE_EPOCH or the HEAD commit, gzip without a time stamp)."""
    project = _project(root)
    base, epoch = f"{file_name(project)}-{project['version']}", default_epoch(root)
    out = dist_dir / f"{base}.tar.gz"
    metadata, _ = metadata_text(project, project["version"], root)

    def info(name: str, size: int, mode: int) -> tarfile.TarInfo:
        ti = tarfile.TarInfo(f"{base}/{name}")
        ti.size, ti.mode, ti.mtime, ti.uid, ti.gid, ti.uname, ti.gname = size, mode, epoch, 0, 0, "", ""
        return ti

    with atomic_write.open_bytes(out) as f, \
            gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(info("PKG-INFO", len(metadata), FILE_MODE), io.BytesIO(metadata))
        for rel in sdist_files(root):
            with open(root / rel, "rb") as src:
                tar.addfile(info(rel, (root / rel).stat().st_size,
                                 LIB_MODE if os.access(root / rel, os.X_OK) else FILE_MODE), src)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m jatools.wheel.wheel_build", description=__doc__.splitlines()[0])
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--variant", choices=sorted(set(Layout.load().variants) - {SOURCE_VARIANT}))
    what.add_argument("--sdist", action="store_true", help="the sdist instead (what `python -m build --sdist` makes)")
    p.add_argument("--dist", type=Path, default=None, help="output folder (default: <repo>/dist)")
    p.add_argument("--plat-name", help="platform tag (default: JA_WHEEL_PLAT_NAME, else the measured floor)")
    p.add_argument("--wheel-arch", help="GPU arch the wheel is for (default: JA_WHEEL_ARCH)")
    p.add_argument("--compress-level", type=int, help="libdeflate's level, 1..12 (default: pyproject "
                   "wheel_compress_level)")
    p.add_argument("-j", "--jobs", type=int, help="compression threads (default: all cores)")
    p.add_argument("--jit-record", type=Path, help="record or manifest with the JIT libraries' identity and "
                   "{name, size, sha256} files (default: build/aiter_build/build_record.json)")
    p.add_argument("--check", action="store_true", help="then run the floor and contents checks on the wheel")
    args = p.parse_args(argv)
    try:
        settings = config.load()
    except config.SettingError as e:
        print(f"wheel_build: error: {e}", file=sys.stderr)
        return 2
    if args.sdist:
        print(f"wheel_build: {sdist(settings.root, (args.dist or settings.root / 'dist').resolve())}", flush=True)
        return 0
    try:
        options = BuildOptions.from_env(args.variant, args.dist or settings.root / "dist", plat_name=args.plat_name,
                                        wheel_arch=args.wheel_arch, level=args.compress_level, jobs=args.jobs)
        expectations = expect.expectations(settings, args.jit_record) if args.jit_record else None
        result = build(settings, options, expectations=expectations)
    except (*BUILD_ERRORS, OSError, ValueError) as e:
        print(f"wheel_build: error: {e}", file=sys.stderr)
        return 2
    print(result.summary(), flush=True)
    # --check: on the read-back's scan, the wheel is not read again; a wheel that fails leaves dist/
    code = wheel_checks.run_and_print(["floor", "contents"], [result.scan]) if args.check else 0
    if code:
        result.wheel.unlink(missing_ok=True)
        print(f"wheel_build: removed {result.wheel}: it failed the checks above, so it does not stay in "
              f"{result.wheel.parent} beside the good wheels", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
