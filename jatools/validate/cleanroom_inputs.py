"""What a clean-room validation takes in: the wheels (which ones, their variant and baked identity), the release
of JIT libraries a lite wheel fetches from, and with --deps-from the packages an interpreter already holds.
"""
from __future__ import annotations

import functools
import json
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from jatools import config
from jatools.jitlibs import publish
from jatools.wheel import wheel_scan
from jatools.wheel.wheel_layout import Layout, LayoutError
from jax_aiter.download import manifest as mf
from jax_aiter.download import reuse_gate

Log = Callable[[str], None]


class ValidationError(RuntimeError):
    """Validation could not run at all (bad arguments, no wheels); the message names the fix."""


def wheel_variant(wheel: Path) -> str:
    """The wheel's variant (wheel_scan.wheel_variant: the layout's labels, the identity's name); an error for a
    wheel whose version label no variant uses."""
    try:
        return wheel_scan.wheel_variant(wheel, _layout())
    except LayoutError as e:
        raise ValidationError(f"{wheel.name}: {e}; pass a wheel that scripts/build_wheel.sh built") from None


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
    return wheel_scan.read_identity(wheel, _layout()) or {}


@functools.cache
def _layout() -> Layout:
    return Layout.load()


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
    staged = settings.path("jit_publish")  # where jatools.jitlibs.publish stages a release
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
