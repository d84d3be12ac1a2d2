"""Where a clean room runs: a folder with a fresh venv and a scrubbed environment, or a container of the
validation image.

The engine-free room is a temporary folder outside the checkout. Nothing of the
developer's setup may leak in, or validation would prove the developer's machine
rather than the wheel. So processes in the room get an environment built from an
allow-list (never a copy of os.environ minus a few names): PATH of the venv and
the system, HOME/XDG_CACHE_HOME/TMPDIR inside the room, pip and uv told to ignore
every config file and index, and proxies that refuse every connection except to
127.0.0.1 (the release server), so a stray download fails at once instead of
quietly reaching PyPI. Only the variables that select GPUs pass through.

The container path: an engine counts only when its daemon answers (`docker
info`); a client without a daemon takes the engine-free path, and says so. The
image is used when present, else pulled, else built locally (the log says which).
The container gets the wheel, smoke files and release read-only, no network (the
release server listens on its own 127.0.0.1), the image's non-root user with
HOME and XDG_CACHE_HOME under /tmp, and the GPU flags of the wheel's backend
when this host has such a GPU.

The validation image's tag is derived from the recipe, never typed: ``v`` + the
first 12 hex of the sha256 of ``docker/validation/Dockerfile.lite``, plus
``-<variant>`` for a variant, so editing the Dockerfile names a new image (the
validation-image workflow publishes it on the next push). Variants are the
Dockerfile's ``base-<variant>`` stages, read from the file itself so the list
cannot drift from the recipe. ``ci/validation_image_id.sh`` prints the tag (this module's `main`).
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from jatools import config, steps
from jax_aiter.integrity import sha256_file

GPU_PASSTHROUGH = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
                   "ROCR_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL")
DEAD_PROXY = "http://127.0.0.1:9"  # the discard port: nothing listens, connections are refused
SLOTS = 16  # reusable rooms per user: concurrent validations each take a free one

ENGINES = ("docker", "podman")
INFO_FORMAT = {"docker": "{{.ServerVersion}}", "podman": "{{.Version.Version}}"}
USER = "1500:1500"              # the image's `validator` user
HOME = "/tmp/validator"
SHM_SIZE = "16g"
MOUNT = "/validate"             # wheel/, smoke/, release/ (read-only) and out/ (written by the smoke steps)

DOCKERFILE = Path("docker/validation/Dockerfile.lite")
TAG_HEX = 12
DEFAULT_REPOSITORY = "ghcr.io/rocm/jax-aiter-validate"

Run = Callable[[Sequence[str]], subprocess.CompletedProcess]


class CleanRoomError(RuntimeError):
    """A clean room (venv, container or image) cannot be set up; the message names the fix."""


# --- the engine-free room -------------------------------------------------------------

def find_python(version: str, env: dict[str, str] | None = None) -> Path:
    """An interpreter of `version` for the clean room: JA_VALIDATE_PYTHON, this one, python<version>, pyenv's."""
    env = os.environ if env is None else env
    if env.get("JA_VALIDATE_PYTHON"):
        return Path(env["JA_VALIDATE_PYTHON"])
    if f"{sys.version_info[0]}.{sys.version_info[1]}" == version:
        return Path(getattr(sys, "_base_executable", sys.executable)).resolve()
    pyenv_root = Path(env.get("PYENV_ROOT") or Path.home() / ".pyenv")
    candidates = [shutil.which(f"python{version}"),
                  *sorted(str(p) for p in pyenv_root.glob(f"versions/{version}*/bin/python{version}"))]
    for cand in filter(None, candidates):
        out = subprocess.run([cand, "-c", "import sys; print(sys.executable)"], check=False, capture_output=True,
                             text=True)
        if out.returncode == 0 and out.stdout.strip():
            return Path(out.stdout.strip())
    raise CleanRoomError(f"no Python {version} found for the clean room (JAX needs it); install it "
                         f"(`pyenv install {version}` or `apt-get install python{version} python{version}-venv`) "
                         "or point JA_VALIDATE_PYTHON at one")


def find_uv() -> Path | None:
    """uv on PATH, else the one the `uv` Python package ships, else None."""
    if found := shutil.which("uv"):
        return Path(found)
    try:
        import uv  # type: ignore[import-not-found]

        return Path(uv.find_uv_bin())
    except (ImportError, FileNotFoundError):
        return None


@dataclass(frozen=True)
class Installer:
    """How the room's venv is made and filled: uv (fast, the default when installed) or venv + pip."""

    kind: str                 # "uv" or "pip"
    uv: Path | None = None
    cache: Path | None = None  # uv's cache: unpacked wheelhouse wheels are hard-linked from it

    def create(self, python: str, venv: str) -> list[str]:
        if self.kind == "uv":
            return [str(self.uv), "venv", "--quiet", "--no-config", "--python", python, venv]
        return [python, "-m", "venv", venv]

    def install(self, venv: str, wheelhouse: str, targets: list[str]) -> list[str]:
        py = f"{venv}/bin/python"
        if self.kind == "uv":
            return [str(self.uv), "pip", "install", "--quiet", "--no-config", "--offline", "--no-index",
                    "--find-links", wheelhouse, "--python", py, *targets]
        return [py, "-m", "pip", "install", "--quiet", "--no-index", "--no-cache-dir", "--disable-pip-version-check",
                "--find-links", wheelhouse, *targets]

    def env(self) -> dict[str, str]:
        if self.kind == "uv" and self.cache is not None:
            return {"UV_CACHE_DIR": str(self.cache), "UV_NO_CONFIG": "1", "UV_OFFLINE": "1",
                    "UV_PYTHON_DOWNLOADS": "never"}
        return {}

    def describe(self) -> str:
        return f"uv ({self.uv})" if self.kind == "uv" else "python -m venv + pip"


def choose_installer(wanted: str, cache: Path | None) -> Installer:
    """`auto`: uv when installed, else venv + pip; `uv` insists on uv; `pip` forces the plain route."""
    if wanted not in ("auto", "uv", "pip"):
        raise CleanRoomError(f"unknown installer {wanted!r}; use auto, uv or pip")
    uv = find_uv() if wanted != "pip" else None
    if wanted == "uv" and uv is None:
        raise CleanRoomError("--installer uv was asked for, but uv is not installed; `pip install uv` "
                             "(or use --installer pip)")
    return Installer("uv", uv, cache) if uv is not None else Installer("pip")


def host_gpu(backend: str, dev: Path = Path("/dev")) -> Path | None:
    """The device node that shows this host has a GPU of `backend` (None: no such GPU, or a CPU backend)."""
    node = {"rocm": dev / "kfd", "cuda": dev / "nvidiactl"}.get(backend)
    return node if node is not None and node.exists() else None


def inside(path: Path, root: Path) -> bool:
    return path.resolve().is_relative_to(root.resolve())


@dataclass(frozen=True)
class Room:
    """The folders of one clean room, all under one temporary folder outside the checkout.

    A reusable room sits at a fixed path (`<tmp>/ja-cleanroom-<uid>/slot<N>`, held by a lock), so the
    dependencies' bytecode can be kept (`bytecode_cache`); it is moved aside when the slot is next claimed
    and deleted by a non-daemon thread. A kept room (--keep) gets a unique path.
    """

    root: Path
    lock: object | None = field(default=None, compare=False, repr=False)
    venv = property(lambda self: self.root / "venv")
    home = property(lambda self: self.root / "home")
    cache = property(lambda self: self.root / "home" / ".cache")
    work = property(lambda self: self.root / "work")
    smoke = property(lambda self: self.root / "smoke")
    tmp = property(lambda self: self.root / "tmp")

    @classmethod
    def create(cls, checkout: Path, base: Path | None = None, reusable: bool = False) -> Room:
        """A new, empty room under `base` (default: the system temp folder); refuses a place inside the checkout."""
        base = Path(base or tempfile.gettempdir())
        if inside(base, checkout):
            raise CleanRoomError(f"the temporary folder {base} is inside the checkout {checkout}, so the room would "
                                 "not be clean; set TMPDIR to a folder outside it")
        room = cls._claim_slot(base) if reusable else None
        room = room or cls(Path(tempfile.mkdtemp(prefix="ja-cleanroom-", dir=base)))
        for d in (room.home, room.cache, room.work, room.smoke, room.tmp):
            d.mkdir(parents=True)
        return room

    @classmethod
    def _claim_slot(cls, base: Path) -> Room | None:
        from filelock import FileLock, Timeout

        parent = base / f"ja-cleanroom-{os.getuid()}"
        parent.mkdir(exist_ok=True)
        for i in range(SLOTS):
            lock = FileLock(str(parent / f"slot{i}.lock"))
            try:
                lock.acquire(timeout=0)
            except Timeout:
                continue  # another validation holds this one
            root = parent / f"slot{i}"
            if root.exists():  # the previous room of this slot: moved aside now, deleted while we work
                os.rename(root, parent / f".trash-{uuid.uuid4().hex}")
            threading.Thread(target=_empty_trash, args=(parent,), name="ja-cleanroom-trash").start()
            root.mkdir()
            return cls(root, lock)
        return None


def _empty_trash(parent: Path) -> None:
    for trash in parent.glob(".trash-*"):
        shutil.rmtree(trash, ignore_errors=True)


def bytecode_cache(prefix: Path, room: Room) -> Path:
    """The `-X pycache_prefix` folder for `room`, with everything but the dependencies' bytecode removed.

    A fresh venv compiles every module JAX imports on first use (seconds); with a fixed room path the
    dependencies' bytecode (their files hard-linked from uv's cache, so size and mtime match) is reused.
    """
    mirror = prefix / room.root.relative_to(room.root.anchor)
    stale = [c for c in mirror.iterdir() if c.name != "venv"] if mirror.is_dir() else []
    stale += mirror.glob("venv/lib/python*/site-packages/jax_aiter*")
    for child in stale:
        shutil.rmtree(child, ignore_errors=True)
    prefix.mkdir(parents=True, exist_ok=True)
    return prefix


def clean_env(room: Room, installer: Installer, source: dict[str, str] | None = None) -> dict[str, str]:
    """The whole environment of every process in the room (an allow-list, see the module docstring)."""
    source = os.environ if source is None else source
    env = {"PATH": f"{room.venv}/bin:/usr/local/bin:/usr/bin:/bin", "HOME": str(room.home),
           "XDG_CACHE_HOME": str(room.cache), "TMPDIR": str(room.tmp), "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
           "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
           "PYTHONNOUSERSITE": "1", **dict.fromkeys(("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"),
                                                     DEAD_PROXY),
           **dict.fromkeys(("no_proxy", "NO_PROXY"), "127.0.0.1,localhost"),
           "CI": source.get("CI", ""),  # progress output: plain lines in CI logs
           **installer.env(), **{k: source[k] for k in GPU_PASSTHROUGH if k in source}}
    return {k: v for k, v in env.items() if v != ""}


def remove(room: Room) -> None:
    """Release a reusable room (its files go when the slot is next claimed); delete any other."""
    if room.lock is not None:
        room.lock.release()
    else:
        shutil.rmtree(room.root, ignore_errors=True)


# --- the container path -------------------------------------------------------------

@dataclass(frozen=True)
class Probe:
    engine: str
    path: str | None
    answers: bool
    detail: str      # server version when it answers, else why not


def probe(engine: str, run: Run | None = None, which: Callable[[str], str | None] = shutil.which) -> Probe:
    """Whether `engine`'s daemon answers; a missing client or a silent daemon is a clean `answers=False`."""
    path = which(engine)
    if path is None:
        return Probe(engine, None, False, f"{engine} is not installed")
    run = run or (lambda c: subprocess.run(list(c), check=False, capture_output=True, text=True, timeout=20))
    try:
        out = run([path, "info", "--format", INFO_FORMAT[engine]])
    except subprocess.TimeoutExpired:
        return Probe(engine, path, False, f"`{engine} info` did not answer within 20 s")
    if out.returncode == 0 and out.stdout.strip():
        return Probe(engine, path, True, out.stdout.strip())
    lines = [ln.strip() for ln in (out.stderr or out.stdout or "").splitlines() if ln.strip()]
    why = lines[-1] if lines else f"exit {out.returncode}"
    return Probe(engine, path, False, f"{engine} client at {path}, but no engine answers ({why})")


def choose(mode: str, probes: Callable[[str], Probe] = probe) -> tuple[Probe | None, str]:
    """(engine to use or None, the sentence that says why). mode: auto | none | docker | podman."""
    if mode == "none":
        return None, "engine-free (asked for with --engine none)"
    if mode not in ("auto", *ENGINES):
        raise CleanRoomError(f"unknown engine {mode!r}; use auto, none, {' or '.join(ENGINES)}")
    found = [probes(e) for e in (ENGINES if mode == "auto" else (mode,))]
    for p in found:
        if p.answers:
            return p, f"container path: {p.engine} {p.detail} answers"
    reasons = "; ".join(p.detail for p in found)
    if mode != "auto":
        raise CleanRoomError(f"--engine {mode} was asked for, but {reasons}; start the engine or use --engine auto")
    return None, f"engine-free path: {reasons}"


def image_variant(backend: str) -> str:
    """The Dockerfile stage (base-<variant>) for a wheel's backend."""
    return backend if backend in ("cpu", "rocm", "cuda") else "cpu"


def gpu_flags(backend: str, dev: Path = Path("/dev")) -> tuple[list[str], str]:
    """`run` flags that give the container this host's GPUs of `backend`, and a note on what was found."""
    node = host_gpu(backend, dev)
    if node is None:
        return [], ("CPU wheel: no GPU flags" if backend not in ("rocm", "cuda") else
                    f"no {backend} device on this host: the wheel is validated on the CPU only")
    shared = ["--ipc=host", f"--shm-size={SHM_SIZE}"]
    if backend == "cuda":
        return ["--gpus", "all", *shared], "NVIDIA GPUs (--gpus all)"
    gids = sorted({os.stat(n).st_gid for n in [node, *sorted((dev / "dri").glob("*"))]})
    groups = [a for gid in gids for a in ("--group-add", str(gid))]
    return (["--device", "/dev/kfd", "--device", "/dev/dri", *groups, *shared, "--security-opt", "seccomp=unconfined"],
            f"ROCm devices {node} and {dev / 'dri'} (groups {', '.join(map(str, gids))})")


def acquire_image(engine: str, ref: str, build_args: list[str], run: Run, log: Callable[[str], None]) -> str:
    """Use the image if present, else pull it, else build it locally; return how it was got."""
    if run([engine, "image", "inspect", ref]).returncode == 0:
        log(f"cleanroom: image {ref} is present locally")
        return "present"
    pulled = run([engine, "pull", ref])
    if pulled.returncode == 0:
        log(f"cleanroom: pulled {ref}")
        return "pulled"
    why = (pulled.stderr or "").strip().splitlines()[-1:] or [f"exit {pulled.returncode}"]
    log(f"cleanroom: pull of {ref} failed ({why[0]}); building it locally from {DOCKERFILE}")
    built = run([engine, *build_args])
    if built.returncode != 0:
        tail = "\n".join((built.stderr or "").strip().splitlines()[-10:])
        raise CleanRoomError(f"`{' '.join([engine, *build_args])}` failed (exit {built.returncode}):\n{tail}")
    return "built"


@dataclass(frozen=True)
class Mounts:
    wheel: Path
    smoke: Path
    out: Path
    release: Path | None

    def flags(self) -> list[str]:
        pairs = [(self.wheel, f"wheel/{self.wheel.name}", "ro"), (self.smoke, "smoke", "ro"), (self.out, "out", "rw"),
                 *([(self.release, "release", "ro")] if self.release is not None else [])]
        return [a for host, at, mode in pairs for a in ("--volume", f"{host.resolve()}:{MOUNT}/{at}:{mode}")]


def start_command(engine: str, ref: str, name: str, mounts: Mounts, gpu: list[str]) -> list[str]:
    """The `run` that starts the long-lived validation container the steps are executed in."""
    return [engine, "run", "--detach", "--rm", "--name", name, "--network", "none", "--user", USER,
            "--env", f"HOME={HOME}", "--env", f"XDG_CACHE_HOME={HOME}/.cache", "--workdir", HOME,
            *gpu, *mounts.flags(), ref, "sleep", "infinity"]


def exec_command(engine: str, name: str, argv: Sequence[str], workdir: str) -> list[str]:
    """One step inside the running container."""
    return [engine, "exec", "--workdir", workdir, name, *argv]


def stop_command(engine: str, name: str) -> list[str]:
    return [engine, "rm", "--force", name]


# --- the validation image -----------------------------------------------------------

def dockerfile(root: Path | None = None) -> Path:
    path = (root or config.repo_root()) / DOCKERFILE
    if not path.is_file():
        raise CleanRoomError(f"{path} is missing; restore it with `git checkout -- {DOCKERFILE}`")
    return path


def image_python(root: Path | None = None) -> str:
    """The interpreter of the validation image: the project's Python (the Dockerfile installs it, and
    tests/validate/test_container.py holds the Dockerfile to it)."""
    return f"python{config.python_version(root)}"


def variants(root: Path | None = None) -> tuple[str, ...]:
    """The variants the Dockerfile defines, as its ``FROM ... AS base-<variant>`` stages."""
    text = dockerfile(root).read_text()
    found = tuple(re.findall(r"^FROM\s+\S+\s+AS\s+base-([a-z0-9]+)\s*$", text, re.MULTILINE | re.IGNORECASE))
    if not found:
        raise CleanRoomError(f"{DOCKERFILE} defines no `FROM <image> AS base-<variant>` stage")
    return found


def image_tag(variant: str | None = None, root: Path | None = None) -> str:
    """``v<hash12>`` (the recipe: the Dockerfile's sha256) or ``v<hash12>-<variant>`` (one built image)."""
    if variant is not None and variant not in (known := variants(root)):
        raise CleanRoomError(f"unknown validation image variant {variant!r}; {DOCKERFILE} defines {', '.join(known)}")
    tag = f"v{sha256_file(dockerfile(root))[:TAG_HEX]}"
    return tag if variant is None else f"{tag}-{variant}"


def repository(root: Path | None = None, env: dict[str, str] | None = None) -> str:
    """Image repository: JA_VALIDATION_IMAGE, else pyproject's ``validation_image``."""
    env = os.environ if env is None else env
    return env.get("JA_VALIDATION_IMAGE") or config.defaults(root).get("validation_image", DEFAULT_REPOSITORY)


def image_ref(variant: str, root: Path | None = None, env: dict[str, str] | None = None) -> str:
    return f"{repository(root, env)}:{image_tag(variant, root)}"


def build_command(variant: str, root: Path | None = None, env: dict[str, str] | None = None) -> list[str]:
    """The `docker build` that makes one variant locally (also the validation tooling's fallback)."""
    path = dockerfile(root)
    return ["docker", "build", "--build-arg", f"VARIANT={variant}", "--tag", image_ref(variant, root, env),
            "--file", str(path), str(path.parent)]


def publish(variant: str, push: bool, dry_run: bool = False, root: Path | None = None,
            log: Callable[[str], None] = print) -> str:
    """Build (and push) one variant unless the registry already holds its tag; return what happened."""
    ref = image_ref(variant, root)
    todo = [steps.Step("build", build_command(variant, root))]
    if push:  # docker retries each layer's upload itself: one retry layer
        todo.append(steps.Step("push", ["docker", "push", ref]))
    if push and not dry_run and subprocess.run(["docker", "manifest", "inspect", ref], check=False).returncode == 0:
        log(f"{ref} is already published; nothing to do (the tag is the recipe hash)")
        return "present"
    try:
        steps.run(todo, "image.publish", dry_run=dry_run)
    except steps.StepFailed as e:
        raise CleanRoomError(f"{e}" + ("\n  check `docker login ghcr.io` and the job's packages: write permission"
                                       if e.record.name == "push" else "")) from None
    if dry_run:
        return "dry-run"
    log(f"{'published' if push else 'built'} {ref}")
    return "published" if push else "built"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="ci/validation_image_id.sh",
                                description=f"The clean-room validation image's tag: the hash of {DOCKERFILE}.")
    p.add_argument("--variant", help="print the tag of this variant (default: the recipe tag v<hash12>)")
    p.add_argument("--ref", action="store_true", help="print the full image reference (needs --variant)")
    p.add_argument("--list-variants", action="store_true", help="print the variants the Dockerfile defines")
    args = p.parse_args(argv)
    try:
        if args.list_variants:
            print("\n".join(variants()))
        elif args.ref:
            if not args.variant:
                p.error("--ref needs --variant (one of: " + ", ".join(variants()) + ")")
            print(image_ref(args.variant))
        else:
            print(image_tag(args.variant))
    except CleanRoomError as e:
        print(f"validation_image: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
