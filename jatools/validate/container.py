"""The container path of the clean room: find an engine that answers, get the image, run the plan in it.

An engine counts only when its daemon answers (`docker info`), not when its
client is installed: a client without a daemon (this project's build machine)
is reported, and validation takes the engine-free path. The image is the one
ci/validation_image_id.sh names (tag = hash of docker/validation/Dockerfile.lite,
jatools/validate/validation_image.py): used when present, else pulled, else built
locally, and the log says which and why. The wheel, the smoke files and the
release are mounted read-only; the container runs with no network (the release
server listens on the container's own 127.0.0.1), as the image's non-root user
with HOME and XDG_CACHE_HOME under /tmp, and with the GPU flags of the wheel's
backend when this host has such a GPU.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from jatools.validate import validation_image
from jatools.validate.cleanroom_env import host_gpu

ENGINES = ("docker", "podman")
INFO_FORMAT = {"docker": "{{.ServerVersion}}", "podman": "{{.Version.Version}}"}
USER = "1500:1500"              # the image's `validator` user
HOME = "/tmp/validator"
SHM_SIZE = "16g"
MOUNT = "/validate"             # wheel/, smoke/, release/ (read-only) and out/ (written by the smoke steps)

Run = Callable[[Sequence[str]], subprocess.CompletedProcess]


class ContainerError(RuntimeError):
    """The container path cannot run; the message names the cause and the fix."""


def _run(cmd: Sequence[str], timeout: float | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), check=False, capture_output=True, text=True, timeout=timeout)


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
    try:
        out = (run or (lambda c: _run(c, timeout=20)))([path, "info", "--format", INFO_FORMAT[engine]])
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
        raise ContainerError(f"unknown engine {mode!r}; use auto, none, {' or '.join(ENGINES)}")
    found = [probes(e) for e in (ENGINES if mode == "auto" else (mode,))]
    for p in found:
        if p.answers:
            return p, f"container path: {p.engine} {p.detail} answers"
    reasons = "; ".join(p.detail for p in found)
    if mode != "auto":
        raise ContainerError(f"--engine {mode} was asked for, but {reasons}; start the engine or use --engine auto")
    return None, f"engine-free path: {reasons}"


def image_ref(variant: str, root: Path | None = None) -> tuple[str, list[str]]:
    """(image reference, the `build` arguments that make it locally) for one Dockerfile variant."""
    try:
        ref = validation_image.image_ref(variant, root)
        build = validation_image.build_command(variant, root)
    except validation_image.ImageError as e:
        raise ContainerError(f"{e}; or validate engine-free (--engine none)") from None
    return ref, build[1:]  # without the engine's name: docker or podman runs it


def image_variant(backend: str) -> str:
    """The Dockerfile stage (base-<variant>) for a wheel's backend."""
    return backend if backend in ("cpu", "rocm", "cuda") else "cpu"


def gpu_flags(backend: str, dev: Path = Path("/dev")) -> tuple[list[str], str]:
    """`run` flags that give the container this host's GPUs of `backend`, and a note on what was found."""
    node = host_gpu(backend, dev)
    if node is None:
        return [], ("CPU wheel: no GPU flags" if backend not in ("rocm", "cuda") else
                    f"no {backend} device on this host: the wheel is validated on the CPU only")
    if backend == "rocm":
        gids = sorted({os.stat(n).st_gid for n in [node, *sorted((dev / "dri").glob("*"))]})
        flags = ["--device", "/dev/kfd", "--device", "/dev/dri"]
        for gid in gids:
            flags += ["--group-add", str(gid)]
        return flags + ["--ipc=host", f"--shm-size={SHM_SIZE}", "--security-opt", "seccomp=unconfined"], \
            f"ROCm devices {node} and {dev / 'dri'} (groups {', '.join(map(str, gids))})"
    return ["--gpus", "all", "--ipc=host", f"--shm-size={SHM_SIZE}"], "NVIDIA GPUs (--gpus all)"


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
    log(f"cleanroom: pull of {ref} failed ({why[0]}); building it locally from {validation_image.DOCKERFILE}")
    built = run([engine, *build_args])
    if built.returncode != 0:
        tail = "\n".join((built.stderr or "").strip().splitlines()[-10:])
        raise ContainerError(f"`{' '.join([engine, *build_args])}` failed (exit {built.returncode}):\n{tail}")
    return "built"


@dataclass(frozen=True)
class Mounts:
    wheel: Path
    smoke: Path
    out: Path
    release: Path | None

    def flags(self) -> list[str]:
        pairs = [(self.wheel, f"{MOUNT}/wheel/{self.wheel.name}", "ro"), (self.smoke, f"{MOUNT}/smoke", "ro"),
                 (self.out, f"{MOUNT}/out", "rw")]
        if self.release is not None:
            pairs.append((self.release, f"{MOUNT}/release", "ro"))
        out = []
        for host, inside, mode in pairs:
            out += ["--volume", f"{host.resolve()}:{inside}:{mode}"]
        return out


def start_command(engine: str, ref: str, name: str, mounts: Mounts, gpu: list[str]) -> list[str]:
    """The `run` that starts the long-lived validation container the steps are executed in."""
    return [engine, "run", "--detach", "--rm", "--name", name, "--network", "none", "--user", USER,
            "--env", f"HOME={HOME}", "--env", f"XDG_CACHE_HOME={HOME}/.cache", "--workdir", HOME,
            *gpu, *mounts.flags(), ref, "sleep", "infinity"]


def exec_command(engine: str, name: str, argv: Sequence[str], workdir: str,
                 env: dict[str, str] | None = None) -> list[str]:
    """One plan step inside the running container (a background step ends with the container)."""
    cmd = [engine, "exec", "--workdir", workdir]
    for k, v in sorted((env or {}).items()):
        cmd += ["--env", f"{k}={v}"]
    return [*cmd, name, *argv]


def stop_command(engine: str, name: str) -> list[str]:
    return [engine, "rm", "--force", name]
