"""The engine-free clean room: a temporary folder outside the checkout, a fresh venv, a scrubbed environment.

Nothing of the developer's setup may leak in, or validation would prove the
developer's machine rather than the wheel. So processes in the room get an
environment built from an allow-list (never a copy of os.environ minus a few
names): PATH of the venv and the system, HOME/XDG_CACHE_HOME/TMPDIR inside the
room, pip and uv told to ignore every config file and index, and proxies that
refuse every connection except to 127.0.0.1 (the release server), so a stray
download fails at once instead of quietly reaching PyPI. Only the variables that
select GPUs pass through.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path

GPU_PASSTHROUGH = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
                   "ROCR_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL")
DEAD_PROXY = "http://127.0.0.1:9"
SLOTS = 16  # reusable rooms per user: concurrent validations each take a free one  # the discard port: nothing listens, connections are refused


class CleanRoomError(RuntimeError):
    """The clean room cannot be set up; the message names the fix."""


def find_python(version: str, env: dict[str, str] | None = None) -> Path:
    """An interpreter of `version` for the clean room: JA_VALIDATE_PYTHON, this one, python<version>, pyenv's."""
    env = os.environ if env is None else env
    if env.get("JA_VALIDATE_PYTHON"):
        return Path(env["JA_VALIDATE_PYTHON"])
    if f"{sys.version_info[0]}.{sys.version_info[1]}" == version:
        return Path(getattr(sys, "_base_executable", sys.executable)).resolve()
    candidates = [shutil.which(f"python{version}")]
    pyenv_root = Path(env.get("PYENV_ROOT") or Path.home() / ".pyenv")
    candidates += sorted(str(p) for p in pyenv_root.glob(f"versions/{version}*/bin/python{version}"))
    for cand in filter(None, candidates):
        out = subprocess.run([cand, "-c", "import sys; print(sys.executable)"], check=False, capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.strip():
            return Path(out.stdout.strip())
    raise CleanRoomError(f"no Python {version} found for the clean room (JAX needs it); install it "
                         f"(`pyenv install {version}` or `apt-get install python{version} python{version}-venv`) "
                         "or point JA_VALIDATE_PYTHON at one")


def find_uv() -> Path | None:
    """uv on PATH, else the one the `uv` Python package ships, else None."""
    found = shutil.which("uv")
    if found:
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
    try:
        path.resolve().relative_to(root.resolve())
        return True
    except ValueError:
        return False


@dataclass(frozen=True)
class Room:
    """The folders of one clean room, all under one temporary folder outside the checkout.

    A reusable room sits at a fixed path (`<tmp>/ja-cleanroom-<uid>/slot<N>`, held
    by a lock), so the bytecode of the dependencies can be kept between rooms (see
    `bytecode_cache`). It stays after use and is moved aside when the slot is next
    claimed, then deleted in the background (a non-daemon thread, so it finishes
    before the process exits). A kept room (--keep) gets a unique path.
    """

    root: Path
    lock: object | None = field(default=None, compare=False, repr=False)

    @property
    def venv(self) -> Path:
        return self.root / "venv"

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def cache(self) -> Path:
        return self.root / "home" / ".cache"

    @property
    def work(self) -> Path:
        return self.root / "work"

    @property
    def smoke(self) -> Path:
        return self.root / "smoke"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

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

    A fresh venv compiles every module JAX imports on first use (seconds). With a
    fixed room path, the bytecode of the dependencies (files hard-linked from
    uv's cache, checked by CPython against their size and mtime) is reused; the
    wheel under test (jax_aiter) and everything outside site-packages are always
    compiled afresh.
    """
    mirror = prefix / room.root.relative_to(room.root.anchor)
    if mirror.is_dir():
        for child in mirror.iterdir():
            if child.name != "venv":
                shutil.rmtree(child, ignore_errors=True)
        for site in mirror.glob("venv/lib/python*/site-packages"):
            for ours in site.glob("jax_aiter*"):
                shutil.rmtree(ours, ignore_errors=True)
    prefix.mkdir(parents=True, exist_ok=True)
    return prefix


def clean_env(room: Room, installer: Installer, source: dict[str, str] | None = None) -> dict[str, str]:
    """The whole environment of every process in the room (an allow-list, see the module docstring)."""
    source = os.environ if source is None else source
    env = {
        "PATH": f"{room.venv}/bin:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(room.home),
        "XDG_CACHE_HOME": str(room.cache),
        "TMPDIR": str(room.tmp),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_NO_INDEX": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PYTHONNOUSERSITE": "1",
        "http_proxy": DEAD_PROXY, "https_proxy": DEAD_PROXY, "HTTP_PROXY": DEAD_PROXY, "HTTPS_PROXY": DEAD_PROXY,
        "no_proxy": "127.0.0.1,localhost", "NO_PROXY": "127.0.0.1,localhost",
        "CI": source.get("CI", ""),  # progress output: plain lines in CI logs
    }
    env.update(installer.env())
    env.update({k: source[k] for k in GPU_PASSTHROUGH if k in source})
    return {k: v for k, v in env.items() if v != ""}


def remove(room: Room) -> None:
    """Release a reusable room (its files go when the slot is next claimed); delete any other."""
    if room.lock is not None:
        room.lock.release()
    else:
        shutil.rmtree(room.root, ignore_errors=True)
