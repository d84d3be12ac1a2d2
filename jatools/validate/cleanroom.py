"""Clean-room validation: prove each wheel works on a machine that has never seen the source tree.

For every wheel: its bytes are checked against its RECORD and its pins; a fresh environment
is made (jatools/validate/cleanroom_env.py: a container of the validation image
when an engine answers, else a venv outside the checkout); the wheel and its
dependencies are installed from the local wheelhouse with no package index
reachable; then the shipped smoke tests (jatools/validate/cleanroom_smoke.py)
run from outside the checkout in isolated mode. A lite wheel fetches its
attention libraries from a release of this checkout's JIT libraries served on
127.0.0.1 (cleanroom_inputs.py finds the wheels and that release).

The steps of one wheel are data (cleanroom_steps.py), run in the room; each
becomes a check of the report (cleanroom_report.py: one screen of text, and
JSON, default build/validate/report.json). `invoke validate` and
scripts/validate_wheel.sh call `run`.
"""
from __future__ import annotations

import argparse
import dataclasses
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from packaging.utils import parse_wheel_filename

from jatools import config
from jatools.validate import cleanroom_env as cenv
from jatools.validate import wheelhouse
from jatools.validate.cleanroom_inputs import (
    HostDeps,
    ValidationError,
    host_dependencies,
    release_folder,
    select_wheels,
    wheel_identity,
    wheel_variant,
)
from jatools.validate.cleanroom_report import Check, Report, WheelResult, report_path
from jatools.validate.cleanroom_steps import (
    RECORD_COPY,
    REFERENCE_SOURCE,
    SMOKE_SCRIPT,
    SMOKE_SOURCE,
    Layout,
    plan,
    run_plan,
)
from jatools.wheel import wheel_scan
from jax_aiter.integrity import sha256_file

Log = Callable[[str], None]


@dataclass
class Options:
    root: Path
    wheels: list[Path]
    engine: str = "auto"              # auto | none | docker | podman
    installer: str = "auto"           # auto | uv | pip
    wheelhouse: Path | None = None
    fill: bool = True                 # fill a cold wheelhouse (needs the package index) instead of failing
    release: Path | None = None       # folder holding jit-libs-<cache-id>/ (default: stage this checkout's)
    keep: bool = False                # keep each room for inspection
    deps_from: Path | None = None     # an interpreter whose installed packages are the dependencies (engine-free)
    log: Log = field(default=lambda m: print(m, file=sys.stderr, flush=True))


def _timed(result: WheelResult, name: str, phase: str, fn: Callable[[], tuple[str, object]]):
    """Run fn as one check; its (message, value) on success, None (a failed check recorded) on a known error."""
    start = time.perf_counter()
    try:
        (msg, value), ok = fn(), True
    except (wheel_scan.RecordError, cenv.CleanRoomError, ValidationError, wheelhouse.WheelhouseError) as e:
        msg, value, ok = str(e), None, False
    result.checks.append(Check(name, phase, ok, round(time.perf_counter() - start, 3), msg))
    return value


def names_inside(wheel: Path) -> tuple[str, bool]:
    """Every member name of `wheel` stays inside the folder it is installed into, or ValidationError naming those
    that would not (absolute, a `..` part, a backslash or a drive letter: a zip-slip wheel). Read from the zip's
    directory, before anything is installed: an installer met them halfway through an install."""
    import zipfile

    try:
        with zipfile.ZipFile(wheel) as zf:
            names = zf.namelist()
    except (OSError, zipfile.BadZipFile) as e:
        raise ValidationError(f"{wheel}: not a readable zip ({e})") from None
    bad = [n for n in names if n.startswith("/") or "\\" in n or (len(n) > 1 and n[1] == ":")
           or ".." in n.split("/")]
    if bad:
        raise ValidationError(f"{wheel.name} has member(s) that would be written outside the install folder: "
                              f"{', '.join(map(repr, bad[:5]))}{' ...' if len(bad) > 5 else ''} (a zip-slip "
                              "wheel); it is refused before anything is installed. Rebuild it with the project's "
                              "wheel builder (`nox -s wheel_lite` / `nox -s wheel_full`)")
    return f"{len(names)} member names, each inside the install folder", True  # (message, value) as _timed takes


def validate_wheel(wheel: Path, opts: Options, engine: cenv.Probe | None, wh: Path, python: Path,
                   pins: list[str], host: HostDeps | None = None) -> WheelResult:
    variant, ident = wheel_variant(wheel), wheel_identity(wheel)
    backend = ident.get("backend", "cpu")
    result = WheelResult(wheel.name, sha256_file(wheel), variant, str(parse_wheel_filename(wheel.name)[1]), backend,
                         "")
    opts.log(f"cleanroom: {variant}: {wheel.name}")

    def check_record() -> tuple[str, wheel_scan.WheelScan]:  # one scan of the wheel serves both checks
        names_inside(wheel)  # a zip-slip wheel: refused before any member is read
        scanned = wheel_scan.scan_or_refuse(wheel)
        return f"{wheel_scan.verify_record(wheel, scanned)} files match the wheel's RECORD", scanned

    scanned = _timed(result, "wheel-record", "wheel", check_record)
    if scanned is None:
        return result
    if not _timed(result, "wheel-pins", "wheel",  # RECORD can be regenerated; the pins are what the loader trusts
                  lambda: ((f"{wheel_scan.verify_pins(wheel, scanned)} libraries match their pins (the bytes the "
                            "wheel was built with; provenance: docs/security.md)"), True)):
        return result
    release: Path | None = None
    if variant == "lite":
        def find_release() -> tuple[str, Path]:
            folder = release_folder(opts.root, ident.get("cache_id", "?"), opts.release, opts.log)
            return f"jit-libs-{ident.get('cache_id')} in {folder}", folder

        release = _timed(result, "release", "wheel", find_release)
        if release is None:
            return result
    room = cenv.Room.create(opts.root, reusable=not opts.keep)
    try:  # the files the smoke step reads: the script, the references, the wheel's RECORD
        shutil.copy2(SMOKE_SOURCE, room.smoke / SMOKE_SCRIPT)
        shutil.copy2(opts.root / REFERENCE_SOURCE, room.smoke / "reference.py")
        (room.smoke / RECORD_COPY).write_text(wheel_scan.read_record_text(wheel))
        if engine is None:
            _engine_free(result, room, opts, wheel, wh, python, pins, release, host)
        else:
            _in_container(result, room, opts, engine.engine, wheel, backend, pins, release)
    finally:
        if opts.keep:
            result.kept = str(room.root)
            result.notes.append(f"room kept for inspection: {room.root}")
        else:
            cenv.remove(room)
    return result


def _engine_free(result: WheelResult, room: cenv.Room, opts: Options, wheel: Path, wh: Path, python: Path,
                 pins: list[str], release: Path | None, host: HostDeps | None) -> None:
    if host is not None:
        # pip, not uv: it resolves against everything on the venv's sys.path, the host's folders included.
        installer = cenv.choose_installer("pip", None)
        result.notes.append(f"dependencies: the packages installed for {host.python} ({host.have}); the "
                            "wheelhouse's floor pins did not run here")
    else:
        installer = cenv.choose_installer(opts.installer, wh / ".uv-cache")
    result.route = f"engine-free, {installer.describe()}" + (f", dependencies of {host.python}" if host else "")
    gpu = cenv.host_gpu(result.backend)
    result.notes.append(f"GPU: {gpu} present, the smoke tests also run on the GPU" if gpu else
                        f"GPU: none of backend {result.backend} on this host; CPU only")
    # pip compiles bytecode while it installs; with uv, the dependencies' bytecode is kept between rooms.
    pycache = cenv.bytecode_cache(wh / ".pycache", room) if installer.kind == "uv" and room.lock else None
    layout = Layout(python=str(python), venv=str(room.venv), work=str(room.work), smoke=str(room.smoke),
                    out=str(room.tmp), wheel=str(wheel.resolve()), wheelhouse=str(wh),
                    release=str(release) if release else None, checkout=str(opts.root),
                    pycache=str(pycache) if pycache else None, gpu=result.backend if gpu else None,
                    host_deps=host.paths if host else ())
    env = cenv.clean_env(room, installer)
    todo = [dataclasses.replace(s, cwd=room.work, env=env) for s in plan(layout, installer, result.variant, pins)]
    run_plan(todo, result.variant, room, result, opts.log)


def _in_container(result: WheelResult, room: cenv.Room, opts: Options, engine: str, wheel: Path, backend: str,
                  pins: list[str], release: Path | None) -> None:
    variant = cenv.image_variant(backend)
    run = lambda c: subprocess.run(list(c), check=False, capture_output=True, text=True)

    def image() -> tuple[str, str]:
        try:
            ref, build = cenv.image_ref(variant, opts.root), cenv.build_command(variant, opts.root)
        except cenv.CleanRoomError as e:
            raise cenv.CleanRoomError(f"{e}; or validate engine-free (--engine none)") from None
        how = cenv.acquire_image(engine, ref, build[1:], run, opts.log)  # [1:]: docker or podman runs it
        return f"{ref} ({how})", ref

    ref = _timed(result, "image", "environment", image)
    if ref is None:
        return
    result.route = f"container, {engine} {ref}"
    flags, note = cenv.gpu_flags(backend)
    result.notes.append(note)
    room.tmp.chmod(0o777)  # the container's non-root user writes its results here
    mounts = cenv.Mounts(wheel=wheel, smoke=room.smoke, out=room.tmp, release=release)
    name = f"ja-validate-{uuid.uuid4().hex[:12]}"
    home, mount = cenv.HOME, cenv.MOUNT
    layout = Layout(python=cenv.image_python(opts.root), venv=f"{home}/venv", work=home, smoke=f"{mount}/smoke",
                    out=f"{mount}/out", wheel=f"{mount}/wheel/{wheel.name}", wheelhouse="/opt/wheelhouse",
                    release=f"{mount}/release" if release else None, checkout=str(opts.root),
                    gpu=backend if flags else None)
    todo = [dataclasses.replace(s, argv=cenv.exec_command(engine, name, s.argv, home))
            for s in plan(layout, cenv.Installer("pip"), result.variant, pins)]
    start = cenv.start_command(engine, ref, name, mounts, flags)
    if _timed(result, "container", "environment", lambda: _checked(run(start), start)) is None:
        return
    try:
        run_plan(todo, result.variant, room, result, opts.log)
    finally:
        run(cenv.stop_command(engine, name))


def _checked(cp: subprocess.CompletedProcess, cmd: list[str]) -> tuple[str, bool]:
    if cp.returncode != 0:
        why = " | ".join(f"{cp.stderr or ''}\n{cp.stdout or ''}".strip().splitlines()[-12:])
        raise cenv.CleanRoomError(f"`{' '.join(cmd)}` failed (exit {cp.returncode}): {why}")
    return f"started {cp.stdout.strip()[:12]}", True


def validate(opts: Options) -> Report:
    start = time.perf_counter()
    engine, why = cenv.choose("none" if opts.deps_from is not None and opts.engine == "auto" else opts.engine)
    if engine is not None and opts.deps_from is not None:
        raise ValidationError("--deps-from uses this host's installed packages, which a container cannot see; "
                              "use it with --engine none (or auto)")
    opts.log(f"cleanroom: {why}")
    wh = opts.wheelhouse or wheelhouse.location(opts.root)
    report = Report(why, str(wh))
    # A wheel built for a GPU backend this host has gets that backend's JAX plugin, so the smoke tests
    # also run on the GPU (the image's wheelhouse holds it; the local one is filled with it).
    backends = sorted({wheel_identity(w).get("backend", "cpu") for w in opts.wheels} & {"cuda", "rocm"})
    wanted = wheelhouse.requirements(opts.root, tuple(b for b in backends if cenv.host_gpu(b)))
    pins = [r for r in wanted if "==" in r]
    python = Path(cenv.image_python(opts.root))
    host = None
    if opts.deps_from is not None:
        # Its packages are the dependencies (the floor pins do not apply); the wheelhouse only adds what it
        # lacks. An interpreter without JAX is refused here, before any room is made.
        host = host_dependencies(opts.deps_from)
        python, pins = opts.deps_from, []
    elif engine is None:
        python = cenv.find_python(config.python_version(opts.root))
        wheelhouse.ensure(wh, wanted, python, allow_fill=opts.fill, log=opts.log)
    for wheel in opts.wheels:
        report.results.append(validate_wheel(wheel, opts, engine, wh, python, pins, host))
    report.seconds = time.perf_counter() - start
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m jatools.validate.cleanroom", description=__doc__.splitlines()[0])
    p.add_argument("--wheel", type=Path, action="append", help="a wheel to validate (repeatable; default: dist/)")
    p.add_argument("--variant", choices=("lite", "full"), help="only wheels of this variant")
    p.add_argument("--dist", type=Path, help="where the wheels are (default: dist/)")
    p.add_argument("--engine", default="auto", help="auto (container when an engine answers), none, docker, podman")
    p.add_argument("--installer", default="auto", help="auto (uv when installed), uv, or pip (plain venv + pip)")
    p.add_argument("--wheelhouse", type=Path, help="offline wheelhouse (default: JA_WHEELHOUSE or build/wheelhouse)")
    p.add_argument("--no-fill", action="store_true", help="fail instead of filling a cold wheelhouse")
    p.add_argument("--release", type=Path, help="folder holding jit-libs-<cache-id>/ for the lite wheel's fetch")
    p.add_argument("--report", type=Path, help="JSON report (default: build/validate/report.json)")
    p.add_argument("--keep", action="store_true", help="keep each clean room for inspection")
    p.add_argument("--deps-from", type=Path, metavar="PYTHON",
                   help="use the packages installed for PYTHON as the dependencies (an offline GPU host's JAX and "
                        "plugin) instead of the wheelhouse's floor pins; engine-free only")
    args = p.parse_args(argv)
    return run(args.wheel, variant=args.variant, dist=args.dist, engine=args.engine, installer=args.installer,
               wheelhouse_dir=args.wheelhouse, fill=not args.no_fill, release=args.release, report=args.report,
               keep=args.keep, deps_from=args.deps_from)


def run(wheels: list[Path] | None = None, *, variant: str | None = None, dist: Path | None = None,
        engine: str = "auto", installer: str = "auto", wheelhouse_dir: Path | None = None, fill: bool = True,
        release: Path | None = None, report: Path | None = None, keep: bool = False,
        deps_from: Path | None = None) -> int:
    """`invoke validate`: validate the wheels (default: every wheel in dist/, or one variant's), print the
    summary, write the JSON report; the exit status (2: could not validate, 1: a wheel failed)."""
    root = config.repo_root()
    try:
        opts = Options(root=root, wheels=select_wheels(wheels, dist or root / "dist", variant), engine=engine,
                       installer=installer, wheelhouse=wheelhouse_dir, fill=fill, release=release, keep=keep,
                       deps_from=deps_from)
        result = validate(opts)
    except (ValidationError, cenv.CleanRoomError, wheelhouse.WheelhouseError) as e:
        print(f"validate: error: {e}", file=sys.stderr)
        return 2
    path = report or report_path(root)
    result.write(path)
    print(result.summary())
    print(f"report: {path}")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
