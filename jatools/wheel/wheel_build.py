"""Build the lite or full wheel from the build tree: verify, stage, pack, read back, rename.

    python -m jatools.wheel.wheel_build --variant lite|full [--dist DIR] [--plat-name TAG] [--check]
    python -m jatools.wheel.wheel_build --sdist [--dist DIR]

This module is also the project's PEP 517/660 build backend (pyproject [build-system]):
`python -m build`, `pip wheel .`, `pip install [-e] .`, `uv build` call its hooks
(end of the file), which call the same `build()`; `-C variant=full` picks the full wheel.

1. Find every library the variant holds (jatools/wheel/wheel_layout.toml). A missing one
   fails at once with the command that makes it; this never runs build_jit.py.
2. Verify the JIT libraries' sha256 against their record (jatools/jitlibs/jit_cache.py).
3. Stage build/wheel_stage/<variant>/ atomically: the Python package, the libraries
   in jax_aiter/_lib/ (hard links when possible), the build identity, and a
   pyproject.toml that makes the staged tree a setuptools project, so
   `pip wheel build/wheel_stage/<variant> --no-deps --no-build-isolation` (the
   reference's route) builds the same wheel for comparison.
4. Tag: JA_WHEEL_PLAT_NAME when given, else the floor auditwheel's policy assigns
   to the libraries' versioned symbols.
5. Pack with jatools.wheel.zip_writer (libdeflate on all cores; fixed order,
   permissions and timestamps: SOURCE_DATE_EPOCH, else the HEAD commit's time),
   into a temporary file in the dist folder.
6. Read every member back out of that file (jatools.wheel.wheel_checks.scan): each must
   hash to its RECORD entry and each library to its record again; only then is it
   renamed into place. `--check` runs the floor and contents checks on that same read.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import fnmatch
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
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from packaging.metadata import Metadata, RawMetadata, RFC822Message
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from jatools import atomic_write, config
from jatools.jitlibs import jit_cache
from jatools.wheel import wheel_checks
from jatools.wheel.wheel_layout import Layout, Variant, python_files, python_packages
from jatools.wheel.zip_writer import DeterministicZipWriter, WrittenMember
from jax_aiter import settings as numeric
from jax_aiter.fetch_mha import BASE_URL_KEY
from jax_aiter.integrity import RECORD_NAME, IntegrityError, read_record, verify_entries

GENERATOR = "jax-aiter jatools.wheel.wheel_build"
MIN_EPOCH = 315532800  # 1980-01-01, the first time a zip can hold
IDENTITY_SCHEMA = 1
LIB_MODE, FILE_MODE = 0o755, 0o644


class WheelBuildError(RuntimeError):
    """The wheel cannot be built; the message says what is wrong and which command fixes it."""


@dataclass(frozen=True)
class BuildOptions:
    variant: str
    dist_dir: Path
    plat_name: str | None = None  # JA_WHEEL_PLAT_NAME
    wheel_arch: str | None = None  # JA_WHEEL_ARCH: the GPU arch the wheel is for, recorded in its identity
    level: int | None = None  # libdeflate's level; None: pyproject's wheel_compress_level
    jobs: int | None = None
    source_date_epoch: int | None = None  # None: SOURCE_DATE_EPOCH, else the HEAD commit's time

    @classmethod
    def from_env(cls, variant: str, dist_dir: Path, env: dict[str, str] | None = None, **flags) -> BuildOptions:
        """Environment (JA_WHEEL_PLAT_NAME, JA_WHEEL_ARCH, SOURCE_DATE_EPOCH) under explicit flags."""
        env = os.environ if env is None else env
        values = {
            "plat_name": env.get("JA_WHEEL_PLAT_NAME") or None,
            "wheel_arch": env.get("JA_WHEEL_ARCH") or None,
            "source_date_epoch": numeric.from_env("SOURCE_DATE_EPOCH", env),
        }
        values.update({k: v for k, v in flags.items() if v is not None})
        return cls(variant=variant, dist_dir=dist_dir, **values)


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
    scan: wheel_checks.WheelScan | None = field(default=None, repr=False)  # the read-back, for the checks

    def summary(self) -> str:
        secs = ", ".join(f"{k} {v:.2f} s" for k, v in self.seconds.items())
        ratio = self.bytes_out / self.bytes_in if self.bytes_in else 0
        return (f"wheel_build: {self.wheel}\n  variant {self.variant}, version {self.version}, tag "
                f"py3-none-{self.platform_tag} ({self.tag_source})\n  {self.members} members, "
                f"{self.bytes_in / 1e6:.1f} MB -> {self.bytes_out / 1e6:.1f} MB (ratio {ratio:.3f}, "
                f"{self.compression}); {secs}"
                + "".join(f"\n  note: {n}" for n in self.notes))


# --- inputs ---------------------------------------------------------------------------

def file_name(project: dict) -> str:
    """The distribution name as wheel, sdist and dist-info names spell it (jax_aiter)."""
    return canonicalize_name(project["name"]).replace("-", "_")


def _project(root: Path) -> dict:
    with open(root / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def library_sources(settings: config.Settings, layout: Layout, variant: Variant) -> dict[str, Path]:
    """{library name: path in the build tree}; WheelBuildError lists every missing one and its command."""
    found, missing = {}, []
    for name in variant.libraries:
        spec = layout.libraries[name]
        path = settings.build_dir / spec.dir / name
        if path.is_file():
            found[name] = path
        else:
            missing.append(f"{path} (produce it with: {spec.fix_command()})")
    if missing:
        raise WheelBuildError(
            f"the {variant.name} wheel needs libraries that are not built: " + "; ".join(missing)
            + ". The wheel build never runs build_jit.py itself.")
    return found


def default_epoch(root: Path, env: dict[str, str] | None = None) -> int:
    """SOURCE_DATE_EPOCH, else the HEAD commit's time, else 1980: never the clock, so rebuilds match."""
    env = os.environ if env is None else env
    if (sde := numeric.from_env("SOURCE_DATE_EPOCH", env)) is not None:
        return max(MIN_EPOCH, sde)
    out = subprocess.run(["git", "-C", str(root), "log", "-1", "--format=%ct"], capture_output=True, text=True,
                         check=False)
    return max(MIN_EPOCH, int(out.stdout.strip())) if out.returncode == 0 and out.stdout.strip() else MIN_EPOCH


def build_identity(expectations: jit_cache.JitExpectations, version: str, variant: Variant,
                   wheel_arch: str | None, native: dict[str, dict] | None = None, base_url: str | None = None) -> dict:
    """The identity baked into the wheel: the JIT libraries' identity plus what this wheel is, the pins
    ({name, size, sha256} of every JIT library of its cache id and of the `native` libraries it ships: the
    loader and jax-aiter-fetch-mha accept only those bytes) and the base URL jax-aiter-fetch-mha fetches from."""
    ident = dict(expectations.identity)
    archs = list(ident.get("gpu_archs") or [])
    if wheel_arch:
        wanted = config.split_archs(wheel_arch)
        absent = [a for a in wanted if a not in archs]
        if absent:
            raise WheelBuildError(
                f"JA_WHEEL_ARCH={wheel_arch} but the JIT libraries were built for "
                f"{', '.join(archs) or 'no GPU arch'} (backend {ident.get('backend')}, {expectations.source}); "
                f"rebuild them with GPU_ARCHS={wheel_arch} python3 jax_aiter/jit/build_jit.py, or unset JA_WHEEL_ARCH")
    ident.update({
        "schema": IDENTITY_SCHEMA,
        "version": version,
        "variant": variant.name,
        "wheel_arch": ";".join(config.split_archs(wheel_arch)) if wheel_arch else (";".join(archs) or None),
        "pins": sorted([*expectations.entries.values(), *(native or {}).values()], key=lambda e: e["name"]),
    })
    if base_url:
        ident[BASE_URL_KEY] = base_url
    return ident


def verify_native(libs: dict[str, Path], names: list[str]) -> dict[str, dict]:
    """The umbrella library and shims against the record `make` wrote when it linked them; {name: entry}."""
    entries: dict[str, dict] = {}
    for folder in sorted({libs[n].parent for n in names}):
        here = [n for n in names if libs[n].parent == folder]
        fix = f"; run `make && make ja_mods` (each link records its library in {folder / RECORD_NAME})"
        record = read_record(folder / RECORD_NAME, fix) if (folder / RECORD_NAME).is_file() else {}
        absent = [n for n in here if n not in record]
        if absent:
            raise WheelBuildError(f"{', '.join(absent)} ha{'s' if len(absent) == 1 else 've'} no record of what "
                                  f"was linked{fix}")
        try:
            verify_entries(folder, [record[n] for n in here])
        except IntegrityError as e:
            raise IntegrityError(f"{e} ({folder / RECORD_NAME}): the library changed after make linked it; "
                                 "relink it (`make -B` for the umbrella, `make -B ja_mods` for shims)") from None
        entries.update({n: record[n] for n in here})
    return entries


# --- staging ----------------------------------------------------------------------------

def _link_or_copy(src: Path, dst: Path) -> str:
    try:
        os.link(src, dst)
        return "link"
    except OSError:
        shutil.copyfile(src, dst)
        return "copy"


def _toml_value(v) -> str:
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items()) + " }"
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, bool):
        return "true" if v else "false"
    return json.dumps(v)


def anchor_pyproject(project: dict, version: str, packages: list[str], lib_dir: str, data_files: list[str]) -> str:
    """pyproject.toml for the staged tree: the repo's [project] at this version, libraries as package data."""
    proj = {k: v for k, v in project.items() if k not in ("version", "readme", "dynamic")}
    proj["version"] = version
    tables = {k: proj.pop(k) for k in list(proj) if isinstance(proj[k], dict) and k not in ("license",)}
    pkg_root = lib_dir.split("/")[0]
    data_globs = [f"{lib_dir[len(pkg_root) + 1:]}/*.so", *(f[len(pkg_root) + 1:] for f in data_files)]
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


def stage(settings: config.Settings, layout: Layout, variant: Variant, version: str, libs: dict[str, Path],
          identity: dict, plat_tag: str | None = None) -> tuple[Path, dict[str, str]]:
    """Write build/wheel_stage/<variant>/ atomically; return it and {member: how it was staged}."""
    stage_root = settings.build_dir / "wheel_stage"
    final = stage_root / variant.name
    tmp = stage_root / f".{variant.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    how: dict[str, str] = {}
    try:
        for rel in [*python_files(settings.root), *layout.data_files]:
            dst = tmp / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(settings.root / rel, dst)
            how[rel] = "copy"
        lib_dir = tmp / layout.lib_dir
        lib_dir.mkdir(parents=True, exist_ok=True)
        for name, src in sorted(libs.items()):
            how[layout.lib_member(name)] = _link_or_copy(src, lib_dir / name)
        (tmp / layout.identity_file).write_text(json.dumps(identity, indent=2, sort_keys=True) + "\n")
        how[layout.identity_file] = "generated"
        project = _project(settings.root)
        for rel in license_files(project["project"], settings.root):  # the anchor project's license-files
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(settings.root / rel, tmp / rel)
        (tmp / "pyproject.toml").write_text(anchor_pyproject(
            project["project"], version, python_packages(settings.root), layout.lib_dir,
            [layout.identity_file, *layout.data_files]))
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
    return final, how


def staged_members(stage_dir: Path, layout: Layout) -> list[tuple[str, Path, int]]:
    """(member, file, mode) of the package part of the wheel, in the order they are written."""
    pkg_roots = sorted({m.split("/")[0] for m in (layout.lib_dir, layout.identity_file)})
    out = []
    for top in pkg_roots:
        for p in sorted((stage_dir / top).rglob("*")):
            if p.is_file():
                rel = p.relative_to(stage_dir).as_posix()
                out.append((rel, p, LIB_MODE if rel.startswith(layout.lib_dir + "/") else FILE_MODE))
    return sorted(out)


# --- dist-info ----------------------------------------------------------------------------

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
        "metadata_version": METADATA_VERSION,
        "name": project["name"],
        "version": version,
        "summary": project.get("description", ""),
        "requires_python": project.get("requires-python", ""),
        "requires_dist": reqs,
        "provides_extra": list(extras),
        "classifiers": list(project.get("classifiers", [])),
        "project_urls": dict(project.get("urls", {})),
        "license_files": license_files(project, root),
    }
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
    lower = meta.as_rfc822()
    out = RFC822Message()
    for name, value in lower.items():
        out[_FIELD_CASE.get(name.lower(), "-".join(w.capitalize() for w in name.split("-")))] = value
    if meta.description is not None:
        out.set_payload(meta.description)
    return out.as_bytes(), notes


def entry_points_text(project: dict) -> bytes:
    groups = {"console_scripts": project.get("scripts", {}), "gui_scripts": project.get("gui-scripts", {})}
    groups.update(project.get("entry-points", {}))
    out = io.StringIO()
    for group, entries in groups.items():
        if entries:
            out.write(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items()) + "\n")
    return out.getvalue().encode()


def wheel_text(tag: str, purelib: bool = False) -> bytes:
    # Not purelib: the libraries are platform-specific, so installers put them in platlib.
    return (f"Wheel-Version: 1.0\nGenerator: {GENERATOR}\nRoot-Is-Purelib: {str(purelib).lower()}\n"
            f"Tag: {tag}\n").encode()


def add_dist_info(zw: DeterministicZipWriter, dist_info: str, metadata: bytes, wheel: bytes, project: dict,
                  root: Path, licenses: list[str]) -> list[WrittenMember]:
    """METADATA, the license files (PEP 639: .dist-info/licenses/), WHEEL, entry points, then RECORD last.

    Returns the members RECORD lists (every one before it)."""
    zw.add_bytes(f"{dist_info}/METADATA", metadata)
    for rel in licenses:
        zw.add_bytes(f"{dist_info}/licenses/{rel}", (root / rel).read_bytes())
    zw.add_bytes(f"{dist_info}/WHEEL", wheel)
    zw.add_bytes(f"{dist_info}/entry_points.txt", entry_points_text(project))
    written = zw.members
    zw.add_bytes(f"{dist_info}/RECORD", record_text(written, f"{dist_info}/RECORD"))
    return written


def record_text(members: list[WrittenMember], record_path: str) -> bytes:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    for m in members:
        w.writerow([m.arcname, wheel_checks.record_hash(m.sha256), m.size])
    w.writerow([record_path, "", ""])
    return out.getvalue().encode()


# --- the build -------------------------------------------------------------------------------

def platform_tag(options: BuildOptions, libs: dict[str, Path]) -> tuple[str, str]:
    """(tag, where it came from): JA_WHEEL_PLAT_NAME, else the measured symbol floor."""
    infos = {name: wheel_checks.read_dynamic(p) for name, p in libs.items()}
    arch = wheel_checks.elf_arch(list(infos.values()))
    if options.plat_name:
        tag = wheel_checks.normalise_plat_name(options.plat_name)
        if wheel_checks.arch_of_tag(tag) != arch:
            raise WheelBuildError(f"JA_WHEEL_PLAT_NAME={options.plat_name} is for {wheel_checks.arch_of_tag(tag)}, "
                                  f"but the libraries are {arch}")
        return tag, "JA_WHEEL_PLAT_NAME"
    return wheel_checks.measure(infos, arch).tag, "measured symbol floor (auditwheel policy)"


def read_back(wheel: Path, written: list[WrittenMember], jit_members: dict[str, str],
              expectations: jit_cache.JitExpectations, jobs: int | None,
              native: dict[str, dict] | None = None) -> wheel_checks.WheelScan:
    """Decompress every member of the written file: RECORD digests, JIT libraries against their record and
    `native` ({member: entry}, the umbrella and shims) against theirs. Returns the scan, for the checks."""
    try:
        scanned = wheel_checks.scan(wheel, workers=jobs)
    except wheel_checks.WheelReadError as e:
        raise IntegrityError(f"reading the new wheel back failed: {e}") from e
    members = scanned.members
    for member, name in jit_members.items():
        expectations.check_digest(name, members[member].sha256, f"{wheel.name}:{member}")
    for member, entry in (native or {}).items():
        if members[member].sha256 != entry["sha256"]:
            raise IntegrityError(f"{wheel.name}:{member}: sha256 {members[member].sha256} does not match the "
                                 f"{entry['sha256']} recorded when it was linked")
    for m in written:
        got = members[m.arcname]
        if got.sha256 != m.sha256_hex or got.size != m.size:
            raise IntegrityError(f"{wheel.name}: {m.arcname} reads back as sha256 {got.sha256} ({got.size} bytes), "
                                 f"but {m.sha256_hex} ({m.size} bytes) was written")
    return scanned


PROGRESS_MIN_BYTES = 64 << 20  # members at least this big get a line of their own while packing
LOCK_NAME = ".wheel_build.lock"


def build(settings: config.Settings, options: BuildOptions, layout: Layout | None = None,
          expectations: jit_cache.JitExpectations | None = None,
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


def _build_locked(settings: config.Settings, options: BuildOptions, layout: Layout | None,
                  expectations: jit_cache.JitExpectations | None, log: Callable[[str], None]) -> BuildResult:
    t0 = time.monotonic()
    layout = layout or Layout.load()
    variant = layout.variant(options.variant)
    project = _project(settings.root)["project"]
    version = variant.version(project["version"])
    level = options.level or int(settings.raw["wheel_compress_level"])
    notes = [f"layout without {', '.join(layout.dropped)}"] if layout.dropped else []

    libs = library_sources(settings, layout, variant)
    jit_names = [n for n in variant.libraries if layout.libraries[n].kind == "jit"]
    jit_bytes = sum(libs[n].stat().st_size for n in jit_names)
    try:
        expectations = expectations or jit_cache.expectations(settings)
        log(f"wheel_build: {variant.name} {version}: verifying {len(jit_names)} JIT libraries "
            f"({jit_bytes / 1e6:.1f} MB) against {expectations.source}")
        expectations.verify_folder(settings.jit_dir, jit_names)
    except jit_cache.JitExpectationError as e:
        raise WheelBuildError(str(e)) from e
    native_names = [n for n in variant.libraries if layout.libraries[n].kind != "jit"]
    native = verify_native(libs, native_names)
    identity = build_identity(expectations, version, variant, options.wheel_arch, native,
                              settings.raw.get("jit_libs_base_url"))
    if identity.get("kernel_source_dirty"):
        notes.append("the JIT libraries were built from uncommitted kernel sources (kernel_source_dirty)")
    t_verify = time.monotonic()

    tag, tag_source = platform_tag(options, libs)
    stage_dir, how = stage(settings, layout, variant, version, libs, identity, tag)
    copies = sorted(m for m, h in how.items() if h == "copy" and m.startswith(layout.lib_dir))
    if copies:
        notes.append(f"copied (no hard link possible): {', '.join(copies)}")
    t_stage = time.monotonic()
    log(f"wheel_build: staged {stage_dir} ({', '.join(f'{v} {k}' for k, v in _count(how).items())}); "
        f"tag py3-none-{tag} ({tag_source})")

    dist_name = file_name(project)
    wheel_tag = f"py3-none-{tag}"
    wheel = options.dist_dir / f"{dist_name}-{version}-{wheel_tag}.whl"
    dist_info = f"{dist_name}-{version}.dist-info"
    options.dist_dir.mkdir(parents=True, exist_ok=True)
    tmp = wheel.with_name(f".{wheel.name}.tmp-{os.getpid()}")
    epoch = options.source_date_epoch if options.source_date_epoch is not None else default_epoch(settings.root)
    date_time = time.gmtime(max(MIN_EPOCH, epoch))[:6]
    metadata, meta_notes = metadata_text(project, version, settings.root)
    notes += meta_notes
    licenses = license_files(project, settings.root)
    jit_members = {layout.lib_member(n): n for n in jit_names}
    members = staged_members(stage_dir, layout)
    total = sum(p.stat().st_size for _, p, _ in members)
    log(f"wheel_build: packing {len(members)} files ({total / 1e6:.1f} MB) with libdeflate level {level} on "
        f"{options.jobs or os.cpu_count()} threads")

    def progress(m: WrittenMember) -> None:
        if m.size >= PROGRESS_MIN_BYTES:
            log(f"  {m.arcname}: {m.size / 1e6:.1f} MB -> {m.compressed_size / 1e6:.1f} MB "
                f"({time.monotonic() - t_stage:.1f} s into packing)")

    try:
        with open(tmp, "wb") as f, DeterministicZipWriter(f, date_time, level=level, workers=options.jobs) as zw:
            # JIT libraries were just hashed against their record; that digest goes into RECORD
            # unhashed again, and the read-back below proves the zipped bytes have it.
            known = {a: bytes.fromhex(expectations.entry(n)["sha256"]) for a, n in jit_members.items()}
            zw.add_files(((arcname, path, mode, known.get(arcname)) for arcname, path, mode in members),
                         on_written=progress)
            written = add_dist_info(zw, dist_info, metadata, wheel_text(wheel_tag), project, settings.root, licenses)
        t_pack = time.monotonic()
        log(f"wheel_build: reading {tmp.name} back ({len(written) + 1} members)")
        scanned = read_back(tmp, written, jit_members, expectations, options.jobs,
                            {layout.lib_member(n): native[n] for n in native_names})
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
        identity=identity, notes=notes, scan=replace(scanned, wheel=wheel),
    )
    _write_report(settings, result)
    return result


def _count(how: dict[str, str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in how.values():
        out[v] = out.get(v, 0) + 1
    return dict(sorted(out.items()))


def _write_report(settings: config.Settings, result: BuildResult) -> Path:
    path = settings.build_dir / "reports" / f"wheel_{result.variant}.json"
    data = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(replace(result, scan=None)).items()
            if k != "scan"}
    atomic_write.write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")
    return path


# --- PEP 517 / PEP 660 backend (pyproject [build-system]: build-backend = "jatools.wheel.wheel_build") --------
# `python -m build`, `pip wheel .`, `pip install [-e] .`, `uv build`, `uv pip install [-e] .` call these hooks in
# the source tree (the current folder). build_wheel is `build()` above, the function `nox -s wheel_*` and
# scripts/build_wheel.sh run, so every front-end makes the same bytes for the same inputs and SOURCE_DATE_EPOCH.

CONFIG_SETTINGS = {"variant": "lite | full (default lite): -C variant=full, --config-settings variant=full"}


def _hook_setting(config_settings: dict | None, key: str, default: str) -> str:
    unknown = sorted(set(config_settings or {}) - set(CONFIG_SETTINGS))
    if unknown:
        raise SystemExit(f"jax-aiter build backend: unknown config setting(s) {', '.join(unknown)}; known: "
                         + "; ".join(f"{k}: {v}" for k, v in CONFIG_SETTINGS.items()))
    value = (config_settings or {}).get(key, default)
    return value[-1] if isinstance(value, list) else value  # a setting given twice: the last one wins


def _source_settings() -> config.Settings:
    """Settings of the tree being built (the hooks' current folder), whatever JA_ROOT_DIR says."""
    return config.load(root=Path.cwd().resolve())


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def get_requires_for_build_wheel(config_settings: dict | None = None) -> list[str]:
    return []  # [build-system].requires is everything


def get_requires_for_build_editable(config_settings: dict | None = None) -> list[str]:
    return []


def get_requires_for_build_sdist(config_settings: dict | None = None) -> list[str]:
    return []


def build_wheel(wheel_directory: str, config_settings: dict | None = None,
                metadata_directory: str | None = None) -> str:
    """PEP 517: the lite wheel (or -C variant=full) from this tree's build folder; never compiles anything."""
    settings = _source_settings()
    variant = _hook_setting(config_settings, "variant", "lite")
    options = BuildOptions.from_env(variant, Path(wheel_directory).resolve())
    unbuilt_sdist = (settings.root / "PKG-INFO").is_file() and not settings.build_dir.is_dir()  # before build() locks
    try:
        result = build(settings, options, log=_stderr)
    except (WheelBuildError, IntegrityError, jit_cache.JitExpectationError, wheel_checks.FloorError) as e:
        hint = ""
        if unbuilt_sdist:
            hint = (f"\n  {settings.root} is an unpacked sdist with no native build: build the libraries here "
                    "(make && python3 jax_aiter/jit/build_jit.py && make ja_mods), or point JA_BUILD_DIR at a "
                    "checkout's build folder (JA_BUILD_DIR=/path/to/checkout/build python -m build), or build the "
                    "wheel straight from the checkout (python -m build --wheel, uv build --wheel)")
        raise SystemExit(f"jax-aiter build backend: error: {e}{hint}") from None
    _stderr(result.summary())
    return result.wheel.name


EDITABLE_PTH = "_jax_aiter_editable.pth"


def build_editable(wheel_directory: str, config_settings: dict | None = None,
                   metadata_directory: str | None = None) -> str:
    """PEP 660: a wheel of metadata and a .pth naming this tree, so `import jax_aiter` runs the checkout's code
    and loads its libraries from the build tree (jax_aiter/_loader.py); nothing is copied or compiled."""
    _hook_setting(config_settings, "variant", "lite")
    try:
        return _editable(Path(wheel_directory).resolve(), _source_settings())
    except WheelBuildError as e:
        raise SystemExit(f"jax-aiter build backend: error: {e}") from None


def _editable(wheel_directory: Path, settings: config.Settings) -> str:
    project = _project(settings.root)["project"]
    version = project["version"]
    dist_name = file_name(project)
    dist_info = f"{dist_name}-{version}.dist-info"
    tag = "py3-none-any"
    wheel = wheel_directory / f"{dist_name}-{version}-{tag}.whl"
    metadata, _ = metadata_text(project, version, settings.root)
    date_time = time.gmtime(default_epoch(settings.root))[:6]
    with atomic_write.open_bytes(wheel) as f, DeterministicZipWriter(f, date_time) as zw:
        zw.add_bytes(EDITABLE_PTH, f"{settings.root}\n".encode())
        add_dist_info(zw, dist_info, metadata, wheel_text(tag, purelib=True), project, settings.root,
                      license_files(project, settings.root))
    return wheel.name


def sdist_files(root: Path) -> list[str]:
    """The files a rebuild needs ([tool.jax-aiter] sdist_include less sdist_exclude), sorted, as posix paths."""
    raw = config.defaults(root)
    excluded = list(raw.get("sdist_exclude", []))
    out: set[str] = set()
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
            if not any(fnmatch.fnmatchcase(rel, pat) or fnmatch.fnmatchcase(q.name, pat) for pat in excluded):
                out.add(rel)
    return sorted(out)


def build_sdist(sdist_directory: str, config_settings: dict | None = None) -> str:
    """PEP 517: the sdist of this tree (`sdist`)."""
    _hook_setting(config_settings, "variant", "lite")
    try:
        return sdist(Path.cwd().resolve(), Path(sdist_directory).resolve()).name
    except WheelBuildError as e:
        raise SystemExit(f"jax-aiter build backend: error: {e}") from None


def sdist(root: Path, dist_dir: Path) -> Path:
    """jax_aiter-<version>.tar.gz with PKG-INFO and what a rebuild needs; reproducible (sorted members, owner 0,
    timestamps from SOURCE_DATE_EPOCH or the HEAD commit, gzip without a time stamp)."""
    project = _project(root)["project"]
    version = project["version"]
    base = f"{file_name(project)}-{version}"
    out = dist_dir / f"{base}.tar.gz"
    epoch = default_epoch(root)
    metadata, _ = metadata_text(project, version, root)

    def info(name: str, size: int, mode: int) -> tarfile.TarInfo:
        ti = tarfile.TarInfo(f"{base}/{name}")
        ti.size, ti.mode, ti.mtime, ti.uid, ti.gid, ti.uname, ti.gname = size, mode, epoch, 0, 0, "", ""
        return ti

    with atomic_write.open_bytes(out) as f, \
            gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(info("PKG-INFO", len(metadata), FILE_MODE), io.BytesIO(metadata))
        for rel in sdist_files(root):
            path = root / rel
            mode = LIB_MODE if os.access(path, os.X_OK) else FILE_MODE
            with open(path, "rb") as src:
                tar.addfile(info(rel, path.stat().st_size, mode), src)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m jatools.wheel.wheel_build", description=__doc__.splitlines()[0])
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--variant", choices=sorted(Layout.load().variants))
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
    settings = config.load()
    if args.sdist:
        print(f"wheel_build: {sdist(settings.root, (args.dist or settings.root / 'dist').resolve())}", flush=True)
        return 0
    try:
        options = BuildOptions.from_env(args.variant, args.dist or settings.root / "dist", plat_name=args.plat_name,
                                        wheel_arch=args.wheel_arch, level=args.compress_level, jobs=args.jobs)
        expectations = jit_cache.expectations(settings, args.jit_record) if args.jit_record else None
        result = build(settings, options, expectations=expectations)
    except (WheelBuildError, IntegrityError, jit_cache.JitExpectationError, wheel_checks.FloorError,
            OSError, ValueError) as e:
        print(f"wheel_build: error: {e}", file=sys.stderr)
        return 2
    print(result.summary(), flush=True)
    if args.check:  # on the read-back's scan: the wheel is not read again
        ok, failed = wheel_checks.run(["floor", "contents"], [result.scan])
        for line in ok:
            print(line, flush=True)
        for line in failed:
            print(line, file=sys.stderr)
        return 1 if failed else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
