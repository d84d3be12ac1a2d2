"""Build the lite or full wheel from the build tree: verify, stage, pack, read back, rename.

    python -m jatools.wheel.wheel_build --variant lite|full [--dist DIR] [--plat-name TAG] [--check]
    python -m jatools.wheel.wheel_build --sdist [--dist DIR]

`build()` is what `nox -s wheel_*` and the PEP 517 backend's build_wheel (build_backend.py) both call. The steps,
in order, are in docs/wheels.md: the libraries are checked and staged (wheel_stage.py), packed with the
dist-info (dist_metadata.py) and read back. It never runs build_jit.py: a missing library fails at once with
the command that makes it. `--check` runs the floor and contents checks on the read-back's scan; `--sdist`
writes the sdist (sdist.py).
"""
from __future__ import annotations

import argparse
import contextlib
import errno
import importlib.metadata
import json
import os
import shutil
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from jatools import atomic_write, config
from jatools.jitlibs import expect
from jatools.wheel import sdist, wheel_checks, wheel_floor, wheel_scan, wheel_stage
from jatools.wheel.dist_metadata import (
    MIN_EPOCH,
    WheelBuildError,
    add_dist_info,
    default_epoch,
    file_name,
    metadata_text,
    project_table,
    wheel_text,
)
from jatools.wheel.wheel_layout import SOURCE_VARIANT, Layout, Variant
from jatools.wheel.zip_writer import DeterministicZipWriter, WrittenMember
from jax_aiter import settings as numeric
from jax_aiter.integrity import IntegrityError

BUILD_ERRORS = (WheelBuildError, IntegrityError, expect.JitExpectationError, wheel_floor.FloorError,
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


def platform_tag(options: BuildOptions, libs: dict[str, Path]) -> tuple[str, str]:
    """(tag, where it came from): JA_WHEEL_PLAT_NAME, else the measured symbol floor."""
    infos = {name: wheel_scan.read_dynamic(p) for name, p in libs.items()}
    arch = wheel_floor.elf_arch(list(infos.values()))
    if options.plat_name:
        tag = options.plat_name.strip().replace("-", "_").replace(".", "_")  # as bdist_wheel normalises it
        wheel_floor.glibc_of_tag(tag)  # FloorError unless a Linux tag
        if wheel_floor.arch_of_tag(tag) != arch:
            raise WheelBuildError(f"JA_WHEEL_PLAT_NAME={options.plat_name} is for {wheel_floor.arch_of_tag(tag)}, "
                                  f"but the libraries are {arch}")
        return tag, "JA_WHEEL_PLAT_NAME"
    return wheel_floor.measure(infos, arch)[0], "measured symbol floor (auditwheel policy)"


def earned(scanned: wheel_scan.WheelScan, tag_source: str) -> None:
    """The platform tag the wheel is about to carry is earned by its libraries' versioned symbols (auditwheel's
    sym_tag, jatools/wheel/wheel_floor.py), whatever set it and whichever front-end called; FloorError otherwise,
    so no wheel with an unearned tag is written."""
    report = wheel_floor.check_floor(scanned)
    if not report.ok:
        raise wheel_floor.FloorError(f"not written: the tag comes from {tag_source} and claims more than the "
                                     f"libraries earn: {report.message}")


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
        stage = settings.path("wheel_stage")
        for folder, lock_at in ((stage, stage.with_name(f".{stage.name}.lock")),
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


@dataclass
class _Verified:
    """The variant's libraries, each checked against its record, and the identity the wheel will carry."""

    variant: Variant
    project: dict
    version: str
    libs: dict[str, Path]
    expectations: expect.JitExpectations
    jit_members: dict[str, str]  # {member: JIT library} shipped as built
    native_members: dict[str, dict]  # {member: the entry make recorded for the umbrella or shim} shipped as built
    rewritten: dict[str, dict]  # {member: the entry of the copy whose RUNPATH the wheel build rewrote}
    identity: dict
    notes: list[str]


@dataclass(frozen=True)
class _Staged:
    tag: str
    tag_source: str
    folder: Path
    digests: dict[str, str]  # {member: sha256} of every file staging copied or generated


def _verify(settings: config.Settings, options: BuildOptions, layout: Layout,
            expectations: expect.JitExpectations | None, log: Callable[[str], None]) -> _Verified:
    variant = layout.variant(options.variant)
    project = project_table(settings.root)
    wheel_stage.check_python_part(settings.root, layout)  # a wheel without its Python package is no wheel of ours
    libs = wheel_stage.library_sources(settings, layout, variant)  # a missing library fails first, naming its fix
    try:
        expectations = expectations or expect.expectations(settings)
    except expect.JitExpectationError as e:
        raise WheelBuildError(str(e)) from e
    lane = wheel_stage.lane_of(layout, expectations)
    version = variant.version(project["version"], lane)
    notes = [f"layout without {', '.join(layout.dropped)}"] if layout.dropped else []
    jit_names = [n for n in variant.libraries if layout.libraries[n].kind == "jit"]
    native_names = [n for n in variant.libraries if layout.libraries[n].kind != "jit"]
    expectations, native = wheel_stage.verify_libraries(settings, variant, version, libs, jit_names, native_names,
                                                        expectations, log)
    recorded = {**{n: expectations.entry(n) for n in jit_names}, **{n: native[n] for n in native_names}}
    libs, rewritten = wheel_stage.ship(libs, recorded, ship_dir(settings, variant.name))
    if rewritten:
        notes.append(f"RUNPATH build-tree entries made $ORIGIN in {len(rewritten)} libraries (all are siblings in "
                     f"{layout.lib_dir}/)")
    identity = wheel_stage.build_identity(expectations, version, variant, options.wheel_arch, native,
                                          settings.raw.get("jit_libs_base_url"), options.source_build, lane,
                                          {b: lane.name for b, lane in layout.lanes.items()}, rewritten)
    if identity.get("kernel_source_dirty"):
        notes.append("the JIT libraries were built from uncommitted kernel sources (kernel_source_dirty)")
    member = layout.lib_member
    return _Verified(variant, project, version, libs, expectations,
                     {member(n): n for n in jit_names if n not in rewritten},
                     {member(n): native[n] for n in native_names if n not in rewritten},
                     {member(n): e for n, e in rewritten.items()}, identity, notes)


def ship_dir(settings: config.Settings, variant: str) -> Path:
    """Where the rewritten copies of a build's libraries are made (in the stage folder, whose lock the build holds;
    removed when the build ends, or by the next build when it was killed)."""
    return settings.path("wheel_stage") / f".{variant}-ship.tmp-{os.getpid()}"


def _stage(settings: config.Settings, options: BuildOptions, layout: Layout, v: _Verified,
           log: Callable[[str], None]) -> _Staged:
    tag, tag_source = platform_tag(options, v.libs)
    folder, how, digests = wheel_stage.stage(settings, layout, v.variant, v.project, v.version, v.libs, v.identity,
                                             tag)
    if copies := sorted(m for m, h in how.items() if h == "copy" and m.startswith(layout.lib_dir)):
        v.notes.append(f"copied (no hard link possible): {', '.join(copies)}")
    staged = ", ".join(f"{n} {h}" for h, n in sorted(Counter(how.values()).items()))
    log(f"wheel_build: staged {folder} ({staged}); tag py3-none-{tag} ({tag_source})")
    return _Staged(tag, tag_source, folder, digests)


def _pack(tmp: Path, settings: config.Settings, options: BuildOptions, layout: Layout, v: _Verified, s: _Staged,
          level: int, log: Callable[[str], None]) -> list[WrittenMember]:
    """The staged files and the dist-info, RECORD last, zipped into `tmp`; the members RECORD lists."""
    epoch = options.source_date_epoch if options.source_date_epoch is not None else default_epoch(settings.root)
    metadata, meta_notes = metadata_text(v.project, v.version, settings.root)
    v.notes.extend(meta_notes)
    members = wheel_stage.staged_members(s.folder, layout)
    log(f"wheel_build: packing {len(members)} files ({sum(p.stat().st_size for _, p, _ in members) / 1e6:.1f} MB) "
        f"with libdeflate level {level} on {options.jobs or os.cpu_count()} threads")
    start = time.monotonic()

    def progress(m: WrittenMember) -> None:
        if m.size >= PROGRESS_MIN_BYTES:
            log(f"  {m.arcname}: {m.size / 1e6:.1f} MB -> {m.compressed_size / 1e6:.1f} MB "
                f"({time.monotonic() - start:.1f} s into packing)")

    with open(tmp, "wb") as f, DeterministicZipWriter(f, time.gmtime(max(MIN_EPOCH, epoch))[:6], level=level,
                                                      workers=options.jobs) as zw:
        # JIT libraries were just hashed against their record; that digest goes into RECORD
        # unhashed again, and the read-back proves the zipped bytes have it.
        known = {a: bytes.fromhex(v.expectations.entry(n)["sha256"]) for a, n in v.jit_members.items()}
        known |= {a: bytes.fromhex(e["sha256"]) for a, e in v.rewritten.items()}
        zw.add_files(((arcname, path, mode, known.get(arcname)) for arcname, path, mode in members),
                     on_written=progress)
        return add_dist_info(zw, f"{file_name(v.project)}-{v.version}.dist-info", metadata,
                             wheel_text(f"py3-none-{s.tag}"), v.project, settings.root)


def _build_locked(settings: config.Settings, options: BuildOptions, layout: Layout | None,
                  expectations: expect.JitExpectations | None, log: Callable[[str], None]) -> BuildResult:
    t0 = time.monotonic()
    layout = layout or Layout.load()
    try:
        v = _verify(settings, options, layout, expectations, log)
        t_verify = time.monotonic()
        try:
            s = _stage(settings, options, layout, v, log)
        except OSError as e:
            raise _unwritable(e, settings.path("wheel_stage"), "set JA_BUILD_DIR to a folder on another disk") from None
    finally:  # the rewritten copies are hard-linked into the stage by now, or no longer needed
        shutil.rmtree(ship_dir(settings, options.variant), ignore_errors=True)
    t_stage = time.monotonic()
    level = options.level or int(settings.raw["wheel_compress_level"])
    wheel = options.dist_dir / f"{file_name(v.project)}-{v.version}-py3-none-{s.tag}.whl"
    options.dist_dir.mkdir(parents=True, exist_ok=True)
    tmp = wheel.with_name(f".{wheel.name}.tmp-{os.getpid()}")
    try:
        written = _pack(tmp, settings, options, layout, v, s, level, log)
        t_pack = time.monotonic()
        log(f"wheel_build: reading {tmp.name} back ({len(written) + 1} members)")
        staged = {**s.digests, **{m: e["sha256"] for m, e in v.rewritten.items()}}
        scanned = read_back(tmp, written, v.jit_members, v.expectations, options.jobs, v.native_members, staged)
        earned(replace(scanned, wheel=wheel), s.tag_source)
        os.replace(tmp, wheel)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise _unwritable(e, wheel, "build the wheel into another folder (--dist DIR)") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    t_end = time.monotonic()
    result = BuildResult(
        wheel=wheel, variant=v.variant.name, version=v.version, platform_tag=s.tag, tag_source=s.tag_source,
        bytes_in=sum(m.size for m in written), bytes_out=wheel.stat().st_size, members=len(written) + 1,
        compression=f"libdeflate (deflate {importlib.metadata.version('deflate')}) level {level}",
        seconds={"verify": t_verify - t0, "stage": t_stage - t_verify, "pack": t_pack - t_stage,
                 "read_back": t_end - t_pack, "total": t_end - t0},
        identity=v.identity, notes=v.notes, scan=replace(scanned, wheel=wheel))
    report = {k: str(x) if isinstance(x, Path) else x for k, x in asdict(replace(result, scan=None)).items()
              if k != "scan"}
    atomic_write.write_text(settings.path("reports") / f"wheel_{v.variant.name}.json",
                            json.dumps(report, indent=2, sort_keys=True) + "\n")
    return result


def _unwritable(e: OSError, where: Path, elsewhere: str) -> WheelBuildError | OSError:
    """A write that failed (a full disk: `[Errno 28]` named no path) as one line naming the path and the fix; another
    OSError as it is."""
    if e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES):
        return e
    path = e.filename or where
    free = "free some space on its disk, or " if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) else ""
    return WheelBuildError(f"cannot write {path}: {e.strerror}; {free}{elsewhere}")


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
        print(f"wheel_build: {sdist.sdist(settings.root, (args.dist or settings.root / 'dist').resolve())}", flush=True)
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
    if args.check:  # libraries of another commit; imported here: the check needs it, the wheel's bytes do not
        from jatools.native import jit_build
        if why := jit_build.stale(settings, result.identity):
            print(f"wheel_build: error: {why}", file=sys.stderr)
            code = 1
    if code:
        result.wheel.unlink(missing_ok=True)
        print(f"wheel_build: removed {result.wheel}: it failed the checks above, so it does not stay in "
              f"{result.wheel.parent} beside the good wheels", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
