"""Clean-room validation: prove each wheel works on a machine that has never seen the source tree.

For every wheel: its bytes are checked against its RECORD; a fresh environment
is made (a container from the validation image when an engine answers, else a
venv in a temporary folder outside the checkout); the wheel and its
dependencies are installed from the local wheelhouse with no package index
reachable; then the shipped smoke tests run from outside the checkout in
isolated mode (jatools/validate/cleanroom_smoke.py). A lite wheel must refuse attention
naming `jax-aiter-fetch-mha`, fetch the attention libraries from a release
served on 127.0.0.1 (built from this checkout's published JIT libraries), and
then run attention; a full wheel runs everything without a fetch.

The steps are data (jatools/validate/cleanroom_plan.py); this module runs them locally
or through `<engine> exec`, times them, and collects the checks into a report
(jatools/validate/cleanroom_report.py). `invoke validate` and scripts/validate_wheel.sh
call `main`.
"""
from __future__ import annotations

import argparse
import json
import queue
import shutil
import subprocess
import sys
import threading
import time
import uuid
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from packaging.utils import parse_wheel_filename

from jatools import config
from jatools.jitlibs import publish
from jatools.validate import cleanroom_env as cenv
from jatools.validate import cleanroom_plan as cplan
from jatools.validate import container, wheelhouse
from jatools.validate.cleanroom_report import Check, Report, WheelResult
from jatools.wheel import wheel_record
from jax_aiter import manifest as mf
from jax_aiter import reuse_gate
from jax_aiter.integrity import sha256_file

Log = Callable[[str], None]
SMOKE_SOURCE = Path(__file__).with_name(cplan.SMOKE_SCRIPT)
REFERENCE_SOURCE = Path("tests/ops/reference.py")
IDENTITY_MEMBER = "jax_aiter/_build_identity.json"
STEP_TIMEOUT_S = 900
SERVER_START_TIMEOUT_S = 20


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
    report: Path | None = None
    log: Log = field(default=lambda m: print(m, file=sys.stderr, flush=True))


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
    """A folder holding jit-libs-<cache_id>/ with its manifest: --release, else this checkout's staged publish.

    Staging (`invoke jit.publish --stage-only`: compress, verify, manifest) happens
    only when this checkout has not staged that release yet.
    """
    tag = reuse_gate.release_tag(cache_id)
    if given is not None:
        if not (given / tag / mf.MANIFEST_NAME).is_file():
            raise ValidationError(f"{given} holds no {tag}/{mf.MANIFEST_NAME}; pass the folder that `invoke jit.publish "
                                  f"--to DIR` wrote, for the lite wheel's cache id {cache_id}")
        return given
    settings = config.load(root=root)
    staged = settings.build_dir / "jit-libs-publish"  # where jatools.jitlibs.publish stages a release
    if not (staged / tag / mf.MANIFEST_NAME).is_file():
        log(f"cleanroom: staging this checkout's JIT libraries as {tag} (the lite wheel fetches them)")
        try:
            publish.publish(settings, "stage-only", stage_only=True, log=log)
        except publish.PublishError as e:
            raise ValidationError(f"cannot stage this checkout's JIT libraries for the lite wheel's fetch: {e}") from None
    if not (staged / tag / mf.MANIFEST_NAME).is_file():
        have = sorted(p.name for p in staged.glob(f"{reuse_gate.TAG_PREFIX}*") if p.is_dir())
        raise ValidationError(
            f"the lite wheel needs the JIT libraries of cache id {cache_id}, but this checkout's build/aiter_build "
            f"publishes {', '.join(have) or 'nothing'}; build the wheel from this checkout's libraries, or pass "
            "--release DIR holding its release")
    return staged


# --- running steps ------------------------------------------------------------------

class LocalRunner:
    """Runs plan steps as local processes in the room, with the room's environment."""

    def __init__(self, room: cenv.Room, env: dict[str, str]):
        self.room, self.env = room, env

    def run(self, argv: Sequence[str], timeout: float = STEP_TIMEOUT_S) -> subprocess.CompletedProcess:
        return subprocess.run(list(argv), cwd=self.room.work, env=self.env, check=False, capture_output=True, text=True,
                              timeout=timeout)

    def start(self, argv: Sequence[str]) -> subprocess.Popen:
        return subprocess.Popen(list(argv), cwd=self.room.work, env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)

    def host_path(self, path: str) -> Path:
        return Path(path)


class ContainerRunner:
    """Runs plan steps inside a running validation container through `<engine> exec`."""

    def __init__(self, engine: str, name: str, out_host: Path, workdir: str):
        self.engine, self.name, self.out_host, self.workdir = engine, name, out_host, workdir

    def run(self, argv: Sequence[str], timeout: float = STEP_TIMEOUT_S) -> subprocess.CompletedProcess:
        return subprocess.run(container.exec_command(self.engine, self.name, argv, self.workdir),
                              check=False, capture_output=True, text=True, timeout=timeout)

    def start(self, argv: Sequence[str]) -> subprocess.Popen:
        return subprocess.Popen(container.exec_command(self.engine, self.name, argv, self.workdir),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def host_path(self, path: str) -> Path:
        return self.out_host / Path(path).relative_to(f"{container.MOUNT}/out")


def _server_port(proc: subprocess.Popen) -> int:
    """The port `python -m http.server 0` chose, from its first line ("Serving HTTP on ... port N ...")."""
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(ln) for ln in proc.stdout], daemon=True).start()
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    seen = []
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.2)
        except queue.Empty:
            if proc.poll() is not None:
                break
            continue
        seen.append(line.strip())
        if " port " in line:
            return int(line.split(" port ", 1)[1].split()[0])
    raise cenv.CleanRoomError(f"the release server did not start: {' | '.join(seen[-5:]) or 'no output'}")


def _tail(cp: subprocess.CompletedProcess, n: int = 12) -> str:
    text = "\n".join(x for x in ((cp.stderr or "").strip(), (cp.stdout or "").strip()) if x)
    return " | ".join(text.splitlines()[-n:])


def _step_failure(step: cplan.Step, cp: subprocess.CompletedProcess) -> str:
    why = _tail(cp)
    if step.name == "install":
        return (f"offline install failed (exit {cp.returncode}): {why}. If a dependency is missing from the "
                "wheelhouse, refill it with `invoke validate.wheelhouse`")
    if step.name == "venv":
        return f"could not create the environment (exit {cp.returncode}): {why}"
    return f"exit {cp.returncode}: {why}"


def _smoke_checks(step: cplan.Step, cp: subprocess.CompletedProcess, results: Path, seconds: float) -> list[Check]:
    try:
        rows = json.loads(results.read_text())
    except (OSError, ValueError):
        return [Check(step.name, "smoke", False, seconds,
                      f"the smoke script wrote no results (exit {cp.returncode}): {_tail(cp)}")]
    checks = [Check(r["check"], "smoke", bool(r["ok"]), float(r["seconds"]), r["message"]) for r in rows]
    # Time outside the checks themselves (interpreter start, importing JAX) is the step's own.
    overhead = max(0.0, seconds - sum(c.seconds for c in checks))
    checks.insert(0, Check("smoke-start", "smoke", True, round(overhead, 3), "interpreter start, importing JAX"))
    if cp.returncode != 0 and all(c.ok for c in checks):
        checks.append(Check(step.name, "smoke", False, 0.0, f"exit {cp.returncode}: {_tail(cp)}"))
    return checks


def run_plan(plan: cplan.Plan, runner, result: WheelResult, log: Log) -> None:
    """Run the steps in order; the first failing environment/install step stops the plan."""
    server: subprocess.Popen | None = None
    port = 0
    try:
        for step in plan.steps:
            start = time.perf_counter()
            if step.background:
                server = runner.start(step.argv)
                try:
                    port = _server_port(server)
                except cenv.CleanRoomError as e:
                    result.checks.append(Check(step.name, step.phase, False, time.perf_counter() - start, str(e)))
                    return
                result.checks.append(Check(step.name, step.phase, True, round(time.perf_counter() - start, 3),
                                           f"serving {step.argv[-1]} on http://127.0.0.1:{port}"))
                continue
            argv = [a.replace(cplan.PORT, str(port)) for a in step.argv] if step.needs_port else list(step.argv)
            log(f"cleanroom: {plan.variant}: {step.name}")
            try:
                cp = runner.run(argv)
            except subprocess.TimeoutExpired:
                result.checks.append(Check(step.name, step.phase, False, time.perf_counter() - start,
                                           f"did not finish within {STEP_TIMEOUT_S} s: {' '.join(argv)}"))
                return
            seconds = round(time.perf_counter() - start, 3)
            if step.results:
                result.checks += _smoke_checks(step, cp, runner.host_path(step.results), seconds)
                continue
            ok = cp.returncode == 0
            msg = _tail(cp, 2) if ok else _step_failure(step, cp)
            result.checks.append(Check(step.name, step.phase, ok, seconds, msg))
            if not ok:
                return
    finally:
        if server is not None:
            server.terminate()
            try:
                server.wait(timeout=5)
            except subprocess.TimeoutExpired:
                server.kill()


# --- one wheel ------------------------------------------------------------------------

def _timed(result: WheelResult, name: str, phase: str, fn: Callable[[], tuple[str, object]]):
    """Run fn as one check; its (message, value) on success, None (a failed check recorded) on a known error."""
    start = time.perf_counter()
    value = None
    try:
        msg, value = fn()
        ok = True
    except (wheel_record.RecordError, cenv.CleanRoomError, container.ContainerError, ValidationError,
            wheelhouse.WheelhouseError) as e:
        msg, ok = str(e), False
    result.checks.append(Check(name, phase, ok, round(time.perf_counter() - start, 3), msg))
    return value if ok else None


def _stock_smoke(dest: Path, wheel: Path, root: Path) -> None:
    """The files the smoke step reads: the script, the references, the wheel's RECORD."""
    shutil.copy2(SMOKE_SOURCE, dest / cplan.SMOKE_SCRIPT)
    shutil.copy2(root / REFERENCE_SOURCE, dest / "reference.py")
    (dest / cplan.RECORD_COPY).write_text(wheel_record.record_text(wheel))


def validate_wheel(wheel: Path, opts: Options, engine: container.Probe | None, wh: Path, python: Path,
                   pins: list[str], host: HostDeps | None = None) -> WheelResult:
    variant = wheel_variant(wheel)
    ident = wheel_identity(wheel)
    backend = ident.get("backend", "cpu")
    result = WheelResult(wheel.name, sha256_file(wheel), variant, str(parse_wheel_filename(wheel.name)[1]),
                         backend, "")
    opts.log(f"cleanroom: {variant}: {wheel.name}")
    if not _timed(result, "wheel-record", "wheel",
                  lambda: (f"{wheel_record.verify(wheel)} files match the wheel's RECORD", True)):
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
    try:
        _stock_smoke(room.smoke, wheel, opts.root)
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
    """What `python` holds; an error when it has no JAX.

    For `--deps-from`: an offline GPU host whose JAX and GPU plugin are installed (a wheelhouse
    cannot be filled there), so the clean room uses them instead of the wheelhouse's floor pins.
    """
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
    gpu_backend = result.backend if gpu else None
    # pip compiles bytecode while it installs; with uv, the dependencies' bytecode is kept between rooms.
    pycache = cenv.bytecode_cache(wh / ".pycache", room) if installer.kind == "uv" and room.lock else None
    layout = cplan.Layout(python=str(python), venv=str(room.venv), work=str(room.work), smoke=str(room.smoke),
                          out=str(room.tmp), wheel=str(wheel.resolve()), wheelhouse=str(wh),
                          release=str(release) if release else None, checkout=str(opts.root),
                          pycache=str(pycache) if pycache else None, gpu=gpu_backend,
                          host_deps=host.paths if host else ())
    plan = cplan.build(layout, installer, result.variant, pins)
    run_plan(plan, LocalRunner(room, cenv.clean_env(room, installer)), result, opts.log)


def _in_container(result: WheelResult, room: cenv.Room, opts: Options, engine: str, wheel: Path, backend: str,
                  pins: list[str], release: Path | None) -> None:
    variant = container.image_variant(backend)
    run = lambda c: subprocess.run(list(c), check=False, capture_output=True, text=True)

    def image() -> tuple[str, str]:
        ref, build_args = container.image_ref(variant, opts.root)
        how = container.acquire_image(engine, ref, build_args, run, opts.log)
        return f"{ref} ({how})", ref

    ref = _timed(result, "image", "environment", image)
    if ref is None:
        return
    result.route = f"container, {engine} {ref}"
    flags, note = container.gpu_flags(backend)
    result.notes.append(note)
    room.tmp.chmod(0o777)  # the container's non-root user writes its results here
    mounts = container.Mounts(wheel=wheel, smoke=room.smoke, out=room.tmp, release=release)
    name = f"ja-validate-{uuid.uuid4().hex[:12]}"
    home = container.HOME
    layout = cplan.Layout(python="python3.12", venv=f"{home}/venv", work=home, smoke=f"{container.MOUNT}/smoke",
                          out=f"{container.MOUNT}/out", wheel=f"{container.MOUNT}/wheel/{wheel.name}",
                          wheelhouse="/opt/wheelhouse", release=f"{container.MOUNT}/release" if release else None,
                          checkout=str(opts.root), gpu=backend if flags else None)
    plan = cplan.build(layout, cenv.Installer("pip"), result.variant, pins)
    start = container.start_command(engine, ref, name, mounts, flags)
    if _timed(result, "container", "environment", lambda: _checked(run(start), start)) is None:
        return
    try:
        run_plan(plan, ContainerRunner(engine, name, room.tmp, home), result, opts.log)
    finally:
        run(container.stop_command(engine, name))


def _checked(cp: subprocess.CompletedProcess, cmd: list[str]) -> tuple[str, bool]:
    if cp.returncode != 0:
        raise container.ContainerError(f"`{' '.join(cmd)}` failed (exit {cp.returncode}): {_tail(cp)}")
    return f"started {cp.stdout.strip()[:12]}", True


# --- all wheels -----------------------------------------------------------------------

def validate(opts: Options) -> Report:
    start = time.perf_counter()
    engine, why = container.choose("none" if opts.deps_from is not None and opts.engine == "auto" else opts.engine)
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
    root = config.repo_root()
    try:
        wheels = select_wheels(args.wheel, args.dist or root / "dist", args.variant)
        opts = Options(root=root, wheels=wheels, engine=args.engine, installer=args.installer,
                       wheelhouse=args.wheelhouse, fill=not args.no_fill, release=args.release, keep=args.keep,
                       deps_from=args.deps_from)
        report = validate(opts)
    except (ValidationError, cenv.CleanRoomError, container.ContainerError, wheelhouse.WheelhouseError) as e:
        print(f"validate: error: {e}", file=sys.stderr)
        return 2
    path = args.report or root / str(config.defaults(root).get("validation_report", "build/validate/report.json"))
    report.write(path)
    print(report.summary())
    print(f"report: {path}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
