"""Pinned header-only packages the JIT build compiles against (nvidia-cutlass's CUTLASS/CuTe headers for the
sm_90a instances): an extra flag names one as {placeholder}; the build takes the installed one, which must be
the version pinned in pyproject's [dependency-groups] build, copied once to a stable path per checkout and pin;
the recipe hash names the pin, never the install path.
"""
from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import sys
import tomllib
from pathlib import Path

from jatools import config
from jatools.native.jit_modules import BuildError

# Header-only packages an extra flag names as {placeholder}: (distribution, include dir inside it). The build
# takes the installed one, which must be the version pinned in pyproject's [dependency-groups] build; the
# recipe hash names that pin, never the install path.
PACKAGE_INCLUDES = {"cutlass_include": ("nvidia-cutlass", "cutlass_library/source/include")}
# They are installed without their dependencies (nox's sessions, ci/gpu/offline_index.py): the build reads their
# headers and never imports them (nvidia-cutlass's Python side pulls cuda-python, scipy, networkx ...: some 60 MB
# an offline GPU host would have to carry).
HEADERS_ONLY = frozenset(dist for dist, _ in PACKAGE_INCLUDES.values())


def canonical_name(name: str) -> str:
    """A distribution name as PEP 503 compares them (NVIDIA_Cutlass, nvidia.cutlass: nvidia-cutlass)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def is_headers_only(requirement: str) -> bool:
    """Whether a requirement (nvidia-cutlass==4.2.0, or a wheel's distribution name) names one of HEADERS_ONLY.
    Standard library only: ci/gpu/offline_index.py asks it on a bare GPU host."""
    return canonical_name(re.match(r"\s*([A-Za-z0-9._-]*)", requirement).group(1)) in HEADERS_ONLY


def package_pin(root: Path, dist: str) -> str:
    """The exact version of `dist` pinned in pyproject's [dependency-groups] build (dist==X)."""
    with open(root / "pyproject.toml", "rb") as f:
        group = tomllib.load(f).get("dependency-groups", {}).get("build", [])
    for req in group:
        m = re.fullmatch(rf"\s*{re.escape(dist)}\s*==\s*([\w.]+)\s*", req) if isinstance(req, str) else None
        if m:
            return m.group(1)
    raise BuildError(f"pyproject.toml's [dependency-groups] build pins no {dist}==VERSION (the JIT build needs an "
                     "exact pin: it names the version in the cache identity)")


def _release(version: str) -> tuple[int, ...]:
    parts = [int(p) for p in re.findall(r"\d+", version.split("+")[0])]
    while parts and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def package_include(root: Path, placeholder: str) -> str:
    """The include dir of an installed header-only package, checked against its pin; a clear error if absent."""
    dist, sub = PACKAGE_INCLUDES[placeholder]
    pin = package_pin(root, dist)
    fix = f"install it with `python3 -m pip install {dist}=={pin}` (or `pip install --group build`)"
    try:
        found = importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        raise BuildError(f"{dist} is not installed in {sys.executable}'s environment; the sm_90a instances of the "
                         f"JIT build compile against its CUTLASS/CuTe headers: {fix}") from None
    if _release(found.version) != _release(pin):
        raise BuildError(f"{dist} {found.version} is installed but pyproject.toml pins {dist}=={pin}: {fix}")
    inc = Path(str(found.locate_file(sub)))
    if not inc.is_dir():
        raise BuildError(f"{dist} {found.version} has no {sub} (looked in {inc}): reinstall it ({fix})")
    return str(stable_copy(inc.resolve(), config.load(root=root).path("pkg_include") / f"{dist}-{pin}"))


def stable_copy(src: Path, dest: Path) -> Path:
    """`src` copied once to `dest`, one path per checkout and pin: every session's venv installs its own copy of
    the headers, so naming the venv's path would change ninja's command lines (and rebuild every instance) per
    session. An existing `dest` is kept (its files' times too, so ninja sees no newer header); the copy is
    made beside it and renamed into place, so an interrupted copy is never taken for a finished one."""
    if dest.is_dir():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp, symlinks=True)
    try:
        os.rename(tmp, dest)
    except OSError:  # another build renamed its copy first: keep that one
        shutil.rmtree(tmp, ignore_errors=True)
        if not dest.is_dir():
            raise
    return dest


def package_includes(root: Path, modules: dict[str, dict], kinds: dict[str, list[str]], resolve: bool
                     ) -> dict[str, str]:
    """{placeholder: value} for the placeholders the compiled kinds' flags name.

    resolve=True: the installed package's include dir (the build); False: a token naming the pinned
    version (the recipe, so the cache id changes with the pin and never with where it is installed).
    """
    used = {ph for name, m in modules.items() for kind in kinds[name]
            for f in m.get("extra_flags", {}).get(kind, []) for ph in re.findall(r"\{(\w+)\}", f)}
    unknown = used - PACKAGE_INCLUDES.keys()
    if unknown:
        raise BuildError(f"unknown placeholder(s) {', '.join(sorted(unknown))} in extra_flags; known: "
                         f"{', '.join(PACKAGE_INCLUDES)}")
    pinned = lambda ph: f"$PKG({PACKAGE_INCLUDES[ph][0]}=={package_pin(root, PACKAGE_INCLUDES[ph][0])})"
    return {ph: package_include(root, ph) if resolve else pinned(ph) for ph in sorted(used)}
