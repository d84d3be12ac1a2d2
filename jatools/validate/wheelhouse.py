"""The offline wheelhouse the clean room installs from: filled once from the package index, then reused.

Every dependency wheel is downloaded once (`invoke wheelhouse`) into a
folder (default build/wheelhouse); installs then use `--no-index --find-links`,
so validation proves an offline install and stays quick.

What goes in is derived from pyproject.toml: the dependencies plus the `fetch`
extra (for `jax-aiter-fetch-mha`), with the `[tool.jax-aiter] validation_floor`
packages (jax, jaxlib) pinned to the lowest version the wheel declares: the
oldest release we support and the one the FFI shims are built against. GPU
hosts add their backend's JAX plugin (`validation_plugins_<backend>`, same pin).

A stamp (wheelhouse.json: requirements, Python, files with size and sha256) is
written last; a wheelhouse is warm when its stamp covers what is wanted and
every listed file is present with its size.
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement

from jatools import atomic_write, config
from jax_aiter import remedies
from jax_aiter.integrity import file_entry, sha256_files

STAMP = "wheelhouse.json"
SCHEMA = 1
Log = Callable[[str], None]


class WheelhouseError(RuntimeError):
    """The wheelhouse cannot serve an offline install; the message names the fix."""


def location(root: Path | None = None, flag: str | Path | None = None, env: dict[str, str] | None = None) -> Path:
    """--wheelhouse, else JA_WHEELHOUSE, else pyproject's `wheelhouse` (relative to the checkout)."""
    env = os.environ if env is None else env
    root = root or config.repo_root()
    value = flag or env.get("JA_WHEELHOUSE") or config.defaults(root)["wheelhouse"]
    path = Path(value).expanduser()
    return path if path.is_absolute() else root / path


def requirements(root: Path | None = None, backends: tuple[str, ...] = (), build: bool = False) -> list[str]:
    """What the wheelhouse must hold, as pip requirement strings (sorted, no duplicates); with `build`, also the
    build backend's [build-system].requires, so the front-ends build and install offline from it."""
    root = root or config.repo_root()
    with open(root / "pyproject.toml", "rb") as f:
        data = tomllib.load(f)
    project = data["project"]
    floor_pinned = {name.lower() for name in config.defaults(root).get("validation_floor", [])}
    reqs = [*project.get("dependencies", []), *project.get("optional-dependencies", {}).get("fetch", []),
            *(data.get("build-system", {}).get("requires", []) if build else [])]
    out: dict[str, str] = {}
    floors: dict[str, str] = {}
    for req in map(Requirement, reqs):
        name = req.name.lower()
        if name in floor_pinned:
            low = next((s.version for s in req.specifier if s.operator in (">=", "==", "~=")), None)
            if low is None:
                raise WheelhouseError(f"pyproject.toml: dependency {req} has no lower bound, so the clean room "
                                      "cannot install its floor; give it one (e.g. >=X.Y)")
            floors[name] = low
            out[name] = f"{req.name}=={low}"
        else:
            out[name] = str(req)
    for backend in backends:
        for plugin in plugin_requirements(backend, floors.get("jax"), root):
            out[Requirement(plugin).name.lower()] = plugin
    return sorted(out.values(), key=str.lower)


def plugin_requirements(backend: str, version: str | None, root: Path | None = None) -> list[str]:
    """The JAX GPU plugin of a backend (`validation_plugins_<backend>`), pinned to `version`: the jax floor
    for the clean room, the `test` group's jax pin (test_jax_version) for the test sessions."""
    raw = config.defaults(root or config.repo_root())
    key = f"validation_plugins_{backend}"
    if key not in raw:
        raise WheelhouseError(f"no JAX plugin is configured for backend {backend!r} "
                              f"([tool.jax-aiter] {key} in pyproject.toml)")
    return [f"{plugin}=={version}" if version else plugin for plugin in raw[key]]


def test_jax_version(root: Path | None = None) -> str:
    """The jax version the `test` dependency group pins (jax==X): the one the test sessions install."""
    with open((root or config.repo_root()) / "pyproject.toml", "rb") as f:
        group = tomllib.load(f).get("dependency-groups", {}).get("test", [])
    reqs = [Requirement(r) for r in group if isinstance(r, str)]  # {include-group = ...} entries pin nothing here
    pins = [s.version for req in reqs if req.name.lower() == "jax" for s in req.specifier if s.operator == "=="]
    if pins:
        return pins[0]
    raise WheelhouseError("pyproject.toml: the `test` dependency group pins no jax version (jax==X); the GPU "
                          "plugin must match it exactly, so pin it there")


@dataclass(frozen=True)
class Status:
    path: Path
    warm: bool
    reason: str          # why it is not warm ("" when warm)
    stamp: dict | None


def status(path: Path, wanted: list[str], python_tag: str) -> Status:
    """Warm when the stamp covers `wanted` for this Python and every stamped file is present at its size."""
    try:
        stamp = json.loads((path / STAMP).read_text())
    except (OSError, ValueError):
        stamp = None
    if not isinstance(stamp, dict) or stamp.get("schema") != SCHEMA:
        return Status(path, False, f"{path} has no {STAMP} (never filled, or a fill was interrupted)", None)
    missing = sorted(set(wanted) - set(stamp.get("requirements", [])))
    if missing:
        return Status(path, False, f"{path} was filled for other requirements; it lacks {', '.join(missing)}", stamp)
    if stamp.get("python") != python_tag:
        return Status(path, False, f"{path} holds wheels for Python {stamp.get('python')}, not {python_tag}", stamp)
    for f in stamp.get("files", []):
        p = path / f["name"]
        if not p.is_file() or p.stat().st_size != f["size"]:
            return Status(path, False, f"{p} is missing or has another size than when it was downloaded", stamp)
    return Status(path, True, "", stamp)


def python_tag(python: str | Path) -> str:
    """'3.12' for the interpreter the clean room uses (the wheels must match it)."""
    out = subprocess.run([str(python), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                         check=False, capture_output=True, text=True)
    if out.returncode != 0:
        raise WheelhouseError(f"cannot run {python}: {out.stderr.strip()}")
    return out.stdout.strip()


def fill(path: Path, wanted: list[str], python: str | Path, log: Log = print,
         run: Callable[[list[str]], subprocess.CompletedProcess] | None = None) -> Status:
    """Download `wanted` and their dependencies as binary wheels; afterwards `path` holds exactly that set.

    pip resolves into a temporary folder beside `path` (offered the wheels already there through
    --find-links); new wheels are moved in, stale ones removed, the stamp written last.
    """
    tag = python_tag(python)
    path.mkdir(parents=True, exist_ok=True)
    (path / STAMP).unlink(missing_ok=True)  # a fill in progress is never warm
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=".fill-", dir=path.parent) as tmp:
        cmd = [str(python), "-m", "pip", "download", "--disable-pip-version-check", "--only-binary=:all:",
               "--find-links", str(path), "--dest", tmp, *wanted]
        log(f"wheelhouse: resolving into {path}: {' '.join(wanted)}")
        out = (run or (lambda c: subprocess.run(c, check=False, capture_output=True, text=True)))(cmd)
        if out.returncode != 0:
            tail = "\n".join((out.stderr or out.stdout or "").strip().splitlines()[-15:])
            raise WheelhouseError(f"`{' '.join(cmd)}` failed (exit {out.returncode}); the package index must be "
                                  f"reachable to fill the wheelhouse once:\n{tail}")
        names = sorted(p.name for p in Path(tmp).glob("*.whl"))
        for name in names:
            os.replace(Path(tmp) / name, path / name)
    for stale in path.glob("*.whl"):
        if stale.name not in names:
            log(f"wheelhouse: removing {stale.name} (no longer part of the resolution)")
            stale.unlink()
    digests = sha256_files([path / n for n in names])
    files = [file_entry(path / n, digests[str(path / n)]) for n in names]
    stamp = {"schema": SCHEMA, "requirements": wanted, "python": tag, "files": files,
             "filled_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    atomic_write.write_text(path / STAMP, json.dumps(stamp, indent=1) + "\n")
    size = sum(f["size"] for f in files)
    log(f"wheelhouse: {len(files)} wheels, {size / 1e6:.0f} MB in {path} ({time.monotonic() - start:.1f} s)")
    return Status(path, True, "", stamp)


def ensure(path: Path, wanted: list[str], python: str | Path, allow_fill: bool, log: Log = print) -> Status:
    """A warm wheelhouse: as it is, or filled now when allowed (said in the log), else an error naming the fix."""
    st = status(path, wanted, python_tag(python))
    if st.warm:
        return st
    if not allow_fill:
        raise WheelhouseError(f"the wheelhouse is not ready: {st.reason}; fill it once with "
                              f"`{remedies.door('wheelhouse')}` (needs the package index)")
    log(f"wheelhouse: filling it now because {st.reason}")
    return fill(path, wanted, python, log)
