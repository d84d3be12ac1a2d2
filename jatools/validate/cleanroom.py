"""Clean-room validation: prove each wheel works on a machine that has never seen the source tree.

For every wheel: its bytes are checked against its RECORD; a fresh environment
is made (jatools/validate/cleanroom_env.py: a container of the validation image
when an engine answers, else a venv outside the checkout); the wheel and its
dependencies are installed from the local wheelhouse with no package index
reachable; then the shipped smoke tests (jatools/validate/cleanroom_smoke.py)
run from outside the checkout in isolated mode. A lite wheel fetches its
attention libraries from a release of this checkout's JIT libraries served on
127.0.0.1.

The steps of one wheel are data (`plan`), with paths as the room's processes
see them (a `Layout`), so one plan runs both locally, in the room's scrubbed
environment, and through `<engine> exec`. jatools/steps.py runs and times them,
a log per step in the room; each becomes a check of the report (one screen of
text, and JSON, default build/validate/report.json). The JSON names each wheel
by file name and sha256, so a wheel changed after validation no longer matches
its report (`covers`, which the release job reads). `invoke validate` and
scripts/validate_wheel.sh call `main`.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import uuid
import zipfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from packaging.utils import parse_wheel_filename

from jatools import atomic_write, config, steps
from jatools.jitlibs import publish
from jatools.validate import cleanroom_env as cenv
from jatools.validate import wheelhouse
from jatools.wheel import wheel_scan
from jax_aiter import manifest as mf
from jax_aiter import reuse_gate
from jax_aiter.integrity import sha256_file, sha256_files

Log = Callable[[str], None]
SMOKE_SCRIPT = "cleanroom_smoke.py"
SMOKE_SOURCE = Path(__file__).with_name(SMOKE_SCRIPT)
SMOKE_RESULTS = "smoke.json"
REFERENCE_SOURCE = Path("tests/ops/reference.py")
RECORD_COPY = "wheel-RECORD"
IDENTITY_MEMBER = "jax_aiter/_build_identity.json"
STEP_TIMEOUT_S = 900
HOST_DEPS_PTH = "ja-host-deps.pth"  # cleanroom_smoke.py names it too (it imports no jatools)
# Appends the given folders to the venv's sys.path (after its own site-packages, so the wheel's
# jax_aiter still comes first) through a .pth file in its site-packages.
_HOST_DEPS_CODE = ("import sys, sysconfig, pathlib; pathlib.Path(sysconfig.get_paths()['purelib'], "
                   f"{HOST_DEPS_PTH!r}).write_text(''.join(p + chr(10) for p in sys.argv[1:]))")
SCHEMA = 1
PHASES = ("wheel", "environment", "install", "smoke")
STEP_PHASES = {"venv": "environment", "host-deps": "environment", "install": "install", "smoke": "smoke"}


class ValidationError(RuntimeError):
    """Validation could not run at all (bad arguments, no wheels); the message names the fix."""


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


# --- what a validation found ----------------------------------------------------------

@dataclass
class Check:
    name: str
    phase: str          # one of PHASES
    ok: bool
    seconds: float
    message: str = ""


@dataclass
class WheelResult:
    wheel: str
    sha256: str
    variant: str
    version: str
    backend: str
    route: str                                  # "engine-free (uv)", "container docker (pulled)", ...
    checks: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    kept: str | None = None                     # the room, when kept for inspection

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    def phase_seconds(self) -> dict[str, float]:
        out = {p: sum(c.seconds for c in self.checks if c.phase == p) for p in PHASES}
        return {k: round(v, 2) for k, v in {**out, "total": sum(out.values())}.items()}


@dataclass
class Report:
    route_note: str
    wheelhouse: str
    results: list[WheelResult] = field(default_factory=list)
    started: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return bool(self.results) and all(r.ok for r in self.results)

    def to_json(self) -> dict:
        return {
            "schema": SCHEMA, "kind": "jax-aiter-validation", "ok": self.ok, "started": self.started,
            "seconds": round(self.seconds, 2), "route": self.route_note, "wheelhouse": self.wheelhouse,
            "host": {"machine": platform.machine(), "python": platform.python_version(),
                     "cpus": os.cpu_count(), "system": platform.platform()},
            "wheels": [{**{k: v for k, v in asdict(r).items() if k != "checks"}, "ok": r.ok,
                        "phases": r.phase_seconds(), "checks": [asdict(c) for c in r.checks]}
                       for r in self.results],
        }

    def write(self, path: Path) -> None:
        atomic_write.write_text(path, json.dumps(self.to_json(), indent=2) + "\n")

    def summary(self, width: int = 100) -> str:
        """The closing screen: one line per check, phase times per wheel, the verdict."""
        lines = [f"clean-room validation ({self.route_note})"]
        for r in self.results:
            ph = r.phase_seconds()
            lines += ["", f"{r.variant:<5} {r.wheel}  [{r.route}]"]
            for c in r.checks:
                text = f"  {'pass' if c.ok else 'FAIL'}  {c.name:<24} {c.seconds:7.2f} s  {c.message}"
                lines.append(text[:width] if c.ok else text)  # a failure is shown whole
            lines += [f"  note  {n}"[:width] for n in r.notes]
            lines.append(f"  {'PASS' if r.ok else 'FAIL'}  {r.variant}: environment {ph['environment']:.1f} s, "
                         f"install {ph['install']:.1f} s, smoke {ph['smoke']:.1f} s, total {ph['total']:.1f} s")
        lines += ["", (f"{'PASS' if self.ok else 'FAIL'}: {sum(r.ok for r in self.results)} of "
                       f"{len(self.results)} wheel(s) validated in {self.seconds:.1f} s")]
        return "\n".join(lines)


def covers(path: Path, wheels: list[Path]) -> bool:
    """Whether the report at `path` shows every one of `wheels` (same name and sha256) validated and passing:
    the release job skips an up-to-date validation, and a wheel changed since has another sha256."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return False
    if data.get("kind") != "jax-aiter-validation" or data.get("schema") != SCHEMA:
        return False
    passed = {(w["wheel"], w["sha256"]) for w in data.get("wheels", []) if w.get("ok")}
    digests = sha256_files(wheels)
    return bool(wheels) and all((w.name, digests[str(w)]) in passed for w in wheels)


def report_path(root: Path) -> Path:
    """Where the report goes: pyproject's `validation_report` (default build/validate/report.json)."""
    return root / str(config.defaults(root).get("validation_report", "build/validate/report.json"))


# --- which wheels ---------------------------------------------------------------------

def wheel_variant(wheel: Path) -> str:
    """'full' for a +full local version, else 'lite' (the public wheel)."""
    _, version, _, _ = parse_wheel_filename(wheel.name)
    return "full" if version.local and "full" in version.local.split(".") else "lite"


def find_wheels(dist: Path, variant: str | None = None) -> list[Path]:
    """The jax_aiter wheels in `dist`, optionally of one variant; an error naming the build command if none."""
    found = sorted(dist.glob("jax_aiter-*.whl"))
    if variant:
        found = [w for w in found if wheel_variant(w) == variant]
    if not found:
        what = f"{variant} wheel" if variant else "jax_aiter wheel"
        raise ValidationError(f"no {what} in {dist}; build one with "
                              f"`bash scripts/build_wheel.sh --variant {variant or 'lite'}` (or pass --wheel PATH)")
    return found


def select_wheels(given: list[Path] | None, dist: Path, variant: str | None) -> list[Path]:
    """--wheel paths (checked to exist), else the wheels in dist/; either way only `variant` when given."""
    if not given:
        return find_wheels(dist, variant)
    wheels = [w.resolve() for w in given]
    missing = [str(w) for w in wheels if not w.is_file()]
    if missing:
        raise ValidationError(f"no such wheel: {', '.join(missing)}")
    chosen = [w for w in wheels if variant is None or wheel_variant(w) == variant]
    if not chosen:
        raise ValidationError(f"none of the given wheels is a {variant} wheel: {', '.join(w.name for w in wheels)}")
    return chosen


def wheel_identity(wheel: Path) -> dict:
    """The build identity baked into the wheel ({} when it has none; the smoke test reports that)."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            return json.loads(zf.read(IDENTITY_MEMBER))
    except (KeyError, ValueError, OSError, zipfile.BadZipFile):
        return {}


# --- the release a lite wheel fetches from ---------------------------------------------

def release_folder(root: Path, cache_id: str, given: Path | None, log: Log) -> Path:
    """A folder holding jit-libs-<cache_id>/ with its manifest: --release, else this checkout's staged publish
    (`invoke jit.publish --stage-only`, run here when this checkout has not staged that release yet)."""
    tag = reuse_gate.release_tag(cache_id)
    holds = lambda folder: (folder / tag / mf.MANIFEST_NAME).is_file()
    if given is not None:
        if not holds(given):
            raise ValidationError(f"{given} holds no {tag}/{mf.MANIFEST_NAME}; pass the folder that `invoke "
                                  f"jit.publish --to DIR` wrote, for the lite wheel's cache id {cache_id}")
        return given
    settings = config.load(root=root)
    staged = settings.build_dir / "jit-libs-publish"  # where jatools.jitlibs.publish stages a release
    if not holds(staged):
        log(f"cleanroom: staging this checkout's JIT libraries as {tag} (the lite wheel fetches them)")
        try:
            publish.publish(settings, "stage-only", stage_only=True, log=log)
        except publish.PublishError as e:
            raise ValidationError(f"cannot stage this checkout's JIT libraries for the lite wheel's fetch: {e}") \
                from None
    if not holds(staged):
        have = sorted(p.name for p in staged.glob(f"{reuse_gate.TAG_PREFIX}*") if p.is_dir())
        raise ValidationError(
            f"the lite wheel needs the JIT libraries of cache id {cache_id}, but this checkout's build/aiter_build "
            f"publishes {', '.join(have) or 'nothing'}; build the wheel from this checkout's libraries, or pass "
            "--release DIR holding its release")
    return staged


# --- the steps of one wheel -------------------------------------------------------------

@dataclass(frozen=True)
class Layout:
    """Where things are, as seen from inside the clean room."""

    python: str       # the base interpreter the venv is made from
    venv: str
    work: str         # working directory of every step (outside the checkout)
    smoke: str        # folder with the smoke script, reference.py and the wheel's RECORD
    out: str          # folder the smoke step writes its results to
    wheel: str
    wheelhouse: str
    release: str | None  # folder the lite wheel's smoke step serves and fetches from
    checkout: str     # the source tree that must stay unreachable
    pycache: str | None = None  # -X pycache_prefix for the smoke step (dependencies' bytecode kept between rooms)
    gpu: str | None = None      # cuda | rocm: the host has such a GPU and the wheel is built for it
    host_deps: tuple[str, ...] = ()  # site-packages folders whose installed packages serve as the dependencies


def plan(layout: Layout, installer: cenv.Installer, variant: str, pins: list[str]) -> list[steps.Step]:
    """Every step for one wheel. `pins` (e.g. jax==0.11.0) keep the resolver at the versions under test.
    With `layout.host_deps` the venv sees those folders' installed packages (an offline GPU host's JAX and
    plugin), and the installer adds only the wheel and what they lack."""
    py = f"{layout.venv}/bin/python"
    todo = [("venv", installer.create(layout.python, layout.venv))]
    if layout.host_deps:
        todo.append(("host-deps", [py, "-I", "-c", _HOST_DEPS_CODE, *layout.host_deps]))
    todo.append(("install", installer.install(layout.venv, layout.wheelhouse, [f"{layout.wheel}[fetch]", *pins])))
    extra: list[str] = []
    if variant == "lite":
        if layout.release is None:
            raise ValueError("a lite wheel needs a release folder to fetch the attention libraries from")
        extra = ["--release", layout.release]
    prefix = ["-X", f"pycache_prefix={layout.pycache}"] if layout.pycache else []
    extra += ["--expect-gpu", layout.gpu] if layout.gpu else []
    todo.append(("smoke", [py, "-I", *prefix, f"{layout.smoke}/{SMOKE_SCRIPT}", "--variant", variant, "--checkout",
                           layout.checkout, "--record", f"{layout.smoke}/{RECORD_COPY}", *extra,
                           "--out", f"{layout.out}/{SMOKE_RESULTS}"]))
    return [steps.Step(name, argv, timeout=STEP_TIMEOUT_S) for name, argv in todo]


def _tail(rec: steps.Record, n: int = 12) -> str:
    return " | ".join(rec.tail[-n:])


def _step_failure(rec: steps.Record) -> str:
    why = f"{rec.note}: {_tail(rec) or rec.command}"
    if rec.name == "install":
        return (f"offline install failed ({why}). If a dependency is missing from the wheelhouse, refill it with "
                "`invoke validate.wheelhouse`")
    if rec.name == "venv":
        return f"could not create the environment ({why})"
    return why


def _smoke_checks(rec: steps.Record, results: Path) -> list[Check]:
    try:
        rows = json.loads(results.read_text())
    except (OSError, ValueError):
        return [Check(rec.name, "smoke", False, rec.seconds,
                      f"the smoke script wrote no results ({rec.note or 'exit 0'}): {_tail(rec)}")]
    checks = [Check(r["check"], "smoke", bool(r["ok"]), float(r["seconds"]), r["message"]) for r in rows]
    # Time outside the checks themselves (interpreter start, importing JAX) is the step's own.
    overhead = max(0.0, rec.seconds - sum(c.seconds for c in checks))
    checks.insert(0, Check("smoke-start", "smoke", True, round(overhead, 3), "interpreter start, importing JAX"))
    if rec.result != "ok" and all(c.ok for c in checks):
        checks.append(Check(rec.name, "smoke", False, 0.0, f"{rec.note}: {_tail(rec)}"))
    return checks


def run_plan(todo: list[steps.Step], variant: str, room: cenv.Room, result: WheelResult, log: Log) -> None:
    """Run the steps in order, a log each in the room; the first failing one stops the rest. Each is a check."""
    todo = [dataclasses.replace(s, log=room.root / "logs" / f"{s.name}.log") for s in todo]
    try:
        records = steps.run(todo, f"cleanroom {variant}", echo=False, progress=log)
    except steps.StepFailed as e:
        records = e.records
    for rec in records:
        if rec.result == "not run":
            break
        if rec.name == "smoke":
            result.checks += _smoke_checks(rec, room.tmp / SMOKE_RESULTS)
        else:
            ok = rec.result == "ok"
            result.checks.append(Check(rec.name, STEP_PHASES[rec.name], ok, rec.seconds,
                                       _tail(rec, 2) if ok else _step_failure(rec)))


# --- one wheel ------------------------------------------------------------------------

def _timed(result: WheelResult, name: str, phase: str, fn: Callable[[], tuple[str, object]]):
    """Run fn as one check; its (message, value) on success, None (a failed check recorded) on a known error."""
    start = time.perf_counter()
    try:
        (msg, value), ok = fn(), True
    except (wheel_scan.RecordError, cenv.CleanRoomError, ValidationError, wheelhouse.WheelhouseError) as e:
        msg, value, ok = str(e), None, False
    result.checks.append(Check(name, phase, ok, round(time.perf_counter() - start, 3), msg))
    return value


def validate_wheel(wheel: Path, opts: Options, engine: cenv.Probe | None, wh: Path, python: Path,
                   pins: list[str], host: HostDeps | None = None) -> WheelResult:
    variant, ident = wheel_variant(wheel), wheel_identity(wheel)
    backend = ident.get("backend", "cpu")
    result = WheelResult(wheel.name, sha256_file(wheel), variant, str(parse_wheel_filename(wheel.name)[1]), backend,
                         "")
    opts.log(f"cleanroom: {variant}: {wheel.name}")
    if not _timed(result, "wheel-record", "wheel",
                  lambda: (f"{wheel_scan.verify_record(wheel)} files match the wheel's RECORD", True)):
        return result
    if not _timed(result, "wheel-pins", "wheel",  # RECORD can be regenerated; the pins are what the loader trusts
                  lambda: ((f"{wheel_scan.verify_pins(wheel)} libraries match their pins (the bytes the wheel "
                            "was built with; provenance: docs/security.md)"), True)):
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


@dataclass(frozen=True)
class HostDeps:
    """An interpreter whose installed packages are the clean room's dependencies (`--deps-from`)."""

    python: Path
    paths: tuple[str, ...]  # its site-packages folders
    have: str               # the JAX, jaxlib and GPU plugin versions it holds, for the report


def host_dependencies(python: Path) -> HostDeps:
    """What `python` holds, or an error when it has no JAX. For `--deps-from`: an offline GPU host (where no
    wheelhouse can be filled) whose installed JAX and plugin replace the wheelhouse's floor pins."""
    code = ("import json, site, importlib.metadata as m\n"
            "def v(n):\n try: return m.version(n)\n except m.PackageNotFoundError: return None\n"
            "names = ['jax', 'jaxlib'] + sorted({d.metadata['Name'] for d in m.distributions() "
            "if (d.metadata['Name'] or '').lower().startswith(('jax-cuda', 'jax-rocm'))})\n"
            "print(json.dumps({'paths': site.getsitepackages(), 'versions': {n: v(n) for n in names}}))")
    try:
        cp = subprocess.run([str(python), "-I", "-c", code], capture_output=True, text=True, timeout=120, check=False)
    except OSError as e:
        raise ValidationError(f"--deps-from {python}: cannot run it ({e}); pass a Python interpreter") from None
    if cp.returncode != 0:
        raise ValidationError(f"--deps-from {python}: it failed to describe its packages (exit {cp.returncode}): "
                              f"{cp.stderr.strip()[-400:]}")
    info = json.loads(cp.stdout)
    versions = info["versions"]
    if not versions.get("jax") or not versions.get("jaxlib"):
        raise ValidationError(f"--deps-from {python}: it has no jax/jaxlib installed (found {versions}); pass the "
                              "interpreter that has JAX and its GPU plugin, or leave --deps-from out")
    have = ", ".join(f"{n} {v}" for n, v in versions.items() if v)
    return HostDeps(python, tuple(info["paths"]), have)


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
    layout = Layout(python="python3.12", venv=f"{home}/venv", work=home, smoke=f"{mount}/smoke", out=f"{mount}/out",
                    wheel=f"{mount}/wheel/{wheel.name}", wheelhouse="/opt/wheelhouse",
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


# --- all wheels -----------------------------------------------------------------------

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
    python = Path("python3.12")  # the image's
    host = None
    if opts.deps_from is not None:
        # Its packages are the dependencies (the floor pins do not apply); the wheelhouse only adds what it
        # lacks. An interpreter without JAX is refused here, before any room is made.
        host = host_dependencies(opts.deps_from)
        python, pins = opts.deps_from, []
    elif engine is None:
        python = cenv.find_python(str(config.defaults(opts.root).get("validation_python", "3.12")))
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
