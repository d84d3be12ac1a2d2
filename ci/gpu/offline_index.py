#!/usr/bin/env python3
"""A local package index for an offline GPU host, so CI's own install passes run there unchanged.

    python3 -m ci.gpu.offline_index download DEST [--on-host NAME ...]   # here, online: the wheels the host may lack
    python3 -m ci.gpu.offline_index index DEST --carried DIR                # there: DEST = carried + repacked

`download` fetches (pip download, CPython at the project's Python version, manylinux x86_64) every package of
pyproject's test, build, run, bench
and wheel groups with its dependencies, but not the JAX stack, numpy or scipy (the GPU host has them installed)
nor nvidia-cutlass's Python dependencies (the sessions install it --no-deps). `--on-host` names more packages
the GPU host has installed (its image's list: the device's KINDS.md), left out to keep what travels small.
`index` copies the carried wheels to DEST and repacks as wheels, from their RECORD, every distribution installed
on the host that something needs and no carried wheel provides: the GPU plugin and PJRT, the groups'
requirements and the carried wheels' own (what they require in turn too). Then it checks that every group
requirement has a wheel in DEST whose version satisfies it, naming each that has none. Point pip and uv at DEST
(PIP_NO_INDEX=1 PIP_FIND_LINKS=DEST UV_OFFLINE=1 UV_NO_INDEX=1 UV_FIND_LINKS=DEST). Standard library and
jatools only (plus the host's packaging, or pip's vendored copy).
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import importlib.metadata as md
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from jatools.config import dependency_group, python_version
from jatools.native.jit_packages import canonical_name, is_headers_only

ROOT = Path(__file__).resolve().parents[2]

GROUPS = ("test", "build", "run", "bench", "wheel")
ON_THE_HOST = {"jax", "jaxlib", "numpy", "scipy"}  # present on the GPU host, large: never carried
# HEADERS_ONLY (nvidia-cutlass): downloaded without their dependencies, as nox's sessions install them.
SEEDS = ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda13-pjrt")

try:
    from packaging.requirements import Requirement
except ImportError:  # a bare host: pip's vendored copy
    from pip._vendor.packaging.requirements import Requirement


def group_requirements(names: tuple[str, ...] = GROUPS) -> list[str]:
    return sorted({r for g in names for r in dependency_group(g, ROOT)})


def to_download(on_host: set[str], names: tuple[str, ...] = GROUPS) -> tuple[list[str], list[str]]:
    """The group requirements to download with their dependencies, and the header-only ones (without)."""
    reqs = group_requirements(names)
    return ([r for r in reqs if not is_headers_only(r) and canonical_name(Requirement(r).name) not in on_host],
            [r for r in reqs if is_headers_only(r)])


def download(dest: Path, on_host: set[str] = frozenset(), names: tuple[str, ...] = GROUPS) -> int:
    on_host = ON_THE_HOST | {canonical_name(n) for n in on_host}
    reqs, headers = to_download(on_host, names)
    common = [sys.executable, "-m", "pip", "download", "-q", "-d", str(dest), "--only-binary=:all:",
              "--python-version", python_version(), "--implementation", "cp", "--platform", "manylinux_2_28_x86_64",
              "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64"]
    for argv in ([*common, *reqs], [*common, "--no-deps", *headers] if headers else []):
        if not argv:
            continue
        if subprocess.run(argv, check=False).returncode:
            return 1
    for whl in dest.glob("*.whl"):  # a dependency of a carried package that the host has
        if canonical_name(whl.name.split("-")[0]) in on_host:
            whl.unlink()
    print(f"offline_index: {len(list(dest.glob('*.whl')))} wheels, "
          f"{sum(p.stat().st_size for p in dest.glob('*.whl')) / 2**20:.1f} MiB in {dest}")
    return 0


def closure(seeds: tuple[str, ...] | list[str], have: set[str] = frozenset()) -> list[md.Distribution]:
    """The installed distributions the seeds need (Requires-Dist without extras, markers evaluated), those
    named in `have` (carried) and what only they need left out."""
    found, todo = dict.fromkeys(have), list(seeds)
    while todo:
        name = canonical_name(todo.pop())
        if name in found:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            print(f"offline_index: {name} is not installed here; it must be among the carried wheels")
            found[name] = None
            continue
        found[name] = dist
        for raw in dist.requires or []:
            req = Requirement(raw)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return [d for d in found.values() if d is not None]


def repack(dist: md.Distribution, dest: Path) -> Path:
    """A wheel of an installed distribution: its RECORD's files (scripts outside site-packages left out)."""
    base = Path(dist.locate_file(""))
    info = next(f for f in dist.files if f.parts[0].endswith(".dist-info")).parts[0]
    tags = [line.split(":", 1)[1].strip() for line in (dist.read_text("WHEEL") or "").splitlines()
            if line.startswith("Tag:")] or ["py3-none-any"]
    name = re.sub(r"[-.]+", "_", dist.metadata["Name"])
    parts = [t.split("-") for t in tags]  # every tag in the name's compressed tag set (py2.py3-none-any)
    tag = "-".join(".".join(dict.fromkeys(p[i] for p in parts)) for i in range(3))
    out = dest / f"{name}-{dist.version}-{tag}.whl"
    records = []
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        for f in dist.files:
            path = base / f
            if ".." in f.parts or f.name == "RECORD" or "__pycache__" in f.parts or not path.is_file():
                continue
            data = path.read_bytes()
            z.writestr(f.as_posix(), data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            records.append(f"{f.as_posix()},sha256={digest},{len(data)}")
        z.writestr(f"{info}/RECORD", "\n".join([*records, f"{info}/RECORD,,"]) + "\n")
    return out


def wheel_requires(whl: Path) -> list[str]:
    """The names a wheel requires (Requires-Dist without extras, markers evaluated here)."""
    with zipfile.ZipFile(whl) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    reqs = [Requirement(line.split(":", 1)[1]) for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    return [r.name for r in reqs if r.marker is None or r.marker.evaluate({"extra": ""})]


def unmet(dest: Path, names: tuple[str, ...] = GROUPS) -> list[str]:
    """The group requirements no wheel in `dest` satisfies (by name and version)."""
    versions = {}
    for whl in dest.glob("*.whl"):
        versions.setdefault(canonical_name(whl.name.split("-")[0]), []).append(whl.name.split("-")[1])
    return [r for r in group_requirements(names) if not any(Requirement(r).specifier.contains(v, prereleases=True)
                                                      for v in versions.get(canonical_name(Requirement(r).name), []))]


def index(dest: Path, carried: Path | None, names: tuple[str, ...] = GROUPS) -> int:
    dest.mkdir(parents=True, exist_ok=True)
    have, needed = set(), [*SEEDS, *(Requirement(r).name for r in group_requirements(names))]
    for whl in sorted(carried.glob("*.whl")) if carried else []:
        shutil.copy2(whl, dest / whl.name)
        have.add(canonical_name(whl.name.split("-")[0]))
        needed += [] if is_headers_only(whl.name.split("-")[0]) else wheel_requires(whl)  # installed --no-deps
    made = [repack(d, dest) for d in closure(needed, have)]
    print(f"offline_index: {len(have)} carried wheel(s), {len(made)} repacked from {sys.prefix}: "
          f"{', '.join(p.name for p in made)}")
    if missing := unmet(dest, names):
        print(f"offline_index: nothing in {dest} satisfies {', '.join(missing)}: carry a wheel of each "
              "(`download` without --on-host for it) or install it on this host")
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m ci.gpu.offline_index", description=__doc__.splitlines()[0])
    p.add_argument("action", choices=("download", "index"))
    p.add_argument("dest", type=Path)
    p.add_argument("--carried", type=Path, help="with index: the carried wheels")
    p.add_argument("--on-host", nargs="*", default=[], metavar="NAME",
                   help="with download: packages the GPU host has installed, not downloaded")
    p.add_argument("--groups", nargs="*", default=list(GROUPS), metavar="GROUP",
                   help=f"the dependency groups (default: {' '.join(GROUPS)}; `tier`: only what a GPU tier run "
                        "against an installed lane wheel needs)")
    a = p.parse_args(argv)
    names = tuple(a.groups)
    return download(a.dest, set(a.on_host), names) if a.action == "download" else index(a.dest, a.carried, names)


if __name__ == "__main__":
    sys.exit(main())
