"""What goes into a wheel, made ready in the build tree: each library checked against the record written when
it was made (the JIT libraries against their build record, the umbrella and shims against make's), the build
identity the wheel carries (with the pins of every library it loads), and the staged tree
(build/wheel_stage/<variant>/, written atomically) the wheel is packed from.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

from jatools import config
from jatools.jitlibs import expect
from jatools.wheel import runpath
from jatools.wheel.dist_metadata import (
    FILE_MODE,
    LIB_MODE,
    WheelBuildError,
    license_files,
)
from jatools.wheel.wheel_layout import (
    Lane,
    Layout,
    Variant,
    python_files,
    python_packages,
)
from jax_aiter import remedies
from jax_aiter.fetch_mha import BASE_URL_KEY
from jax_aiter.integrity import (
    RECORD_NAME,
    IntegrityError,
    read_record,
    sha256_file,
    verify_entries,
)

IDENTITY_SCHEMA = 1


def library_sources(settings: config.Settings, layout: Layout, variant: Variant) -> dict[str, Path]:
    """{library name: path in the build tree}; WheelBuildError lists every missing one and its command."""
    paths = {name: settings.build_dir / layout.libraries[name].dir / name for name in variant.libraries}
    if missing := [f"{p} (produce it with: {layout.libraries[n].fix_command()})" for n, p in paths.items()
                   if not p.is_file()]:
        raise WheelBuildError(f"the {variant.name} wheel needs libraries that are not built: {'; '.join(missing)}. "
                              "The wheel build never runs build_jit.py itself.")
    return paths


def check_python_part(root: Path, layout: Layout) -> list[str]:
    """The wheel's Python files (every module of the packages pyproject's [tool.jax-aiter] `packages` lists);
    WheelBuildError when that list is empty, names a folder that is no package, or leaves out a module every
    wheel holds (jatools/wheel/wheel_layout.toml [files] required), instead of a wheel with no Python package."""
    packages = python_packages(root)
    not_packages = [p for p in packages if not (root / p.replace(".", "/") / "__init__.py").is_file()]
    files = python_files(root)
    missing = [f for f in layout.required_files if f.endswith(".py") and f not in files]
    missing += [f"{sub} (a subpackage: it has an __init__.py)" for sub in _unlisted_subpackages(root, packages)]
    if not packages or not_packages or missing:
        why = ("lists no package" if not packages else
               f"names {', '.join(not_packages)}, which {'is' if len(not_packages) == 1 else 'are'} no package (no "
               "__init__.py)" if not_packages else f"leaves out {', '.join(missing)}")
        raise WheelBuildError(f"pyproject.toml [tool.jax-aiter] packages = {json.dumps(packages)} {why}: the wheel "
                              f"would lack the Python package every wheel holds ({', '.join(layout.required_files[:2])}"
                              ", ...). List jax_aiter and its subpackages there "
                              "(as the checkout's pyproject.toml does)")
    return files


def _unlisted_subpackages(root: Path, packages: list[str]) -> list[str]:
    """The packages below a listed one (folders with an __init__.py) that the list leaves out: a wheel without
    them fails at its first import of one (checkout-only folders such as jax_aiter/jit have no __init__.py)."""
    found = {".".join(init.parent.relative_to(root).parts)
             for p in packages for init in (root / p.replace(".", "/")).rglob("__init__.py")}
    return sorted(found - set(packages))


def lane_of(layout: Layout, expectations: expect.JitExpectations) -> Lane:
    """The lane of the JIT libraries' backend; WheelBuildError when they were compiled by a GPU toolkit of another
    major version than the lane is named for (a CUDA 12 build is no cuda13 wheel)."""
    ident = expectations.identity
    lane = layout.lane(ident.get("backend") or "cpu")
    tc = ident.get("toolchain") or {}
    found = tc.get("platform_version") or tc.get("gpu_compiler_version") or ""
    major = re.match(r"\D*(\d+)", str(found))
    if lane.toolkit is not None and major and int(major.group(1)) != lane.toolkit:
        raise WheelBuildError(f"the JIT libraries ({expectations.source}) were compiled by {tc.get('gpu_compiler')} "
                              f"{found}, but the {lane.backend} lane is {lane.name} (toolkit {lane.toolkit}, "
                              f"jatools/wheel/wheel_layout.toml): build them with that toolkit, or add a lane")
    return lane


def ship(libs: dict[str, Path], recorded: dict[str, dict], work: Path) -> tuple[dict[str, Path], dict[str, dict]]:
    """The bytes each library ships with: as built (and recorded), or, where its RUNPATH names build-tree folders
    the wheel does not have, a copy in `work` with those entries made `$ORIGIN` (jatools/wheel/runpath.py), made
    from bytes that hash to their record. Returns ({name: the file to stage}, {name: {name, size, sha256} of each
    rewritten copy}); the read-back holds the wheel to those digests."""
    paths, rewritten = dict(libs), {}
    for name, src in sorted(libs.items()):
        try:
            if not runpath.needs_rewrite(src):
                continue
            with open(src, "rb") as f:  # read once into a buffer rewritten in place: a large library is held once
                data = bytearray(os.fstat(f.fileno()).st_size)
                f.readinto(data)
            if hashlib.sha256(data).hexdigest() != recorded[name]["sha256"]:
                raise IntegrityError(f"{src} changed after it was verified (sha256 no longer "
                                     f"{recorded[name]['sha256']}, its record's): another process is writing the "
                                     "build tree; build again")
            runpath.for_wheel(data, str(src))
        except (runpath.RunpathError, ValueError) as e:
            raise WheelBuildError(str(e)) from None
        work.mkdir(parents=True, exist_ok=True)
        (work / name).write_bytes(data)
        paths[name] = work / name
        rewritten[name] = {"name": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    return paths, rewritten


def build_identity(expectations: expect.JitExpectations, version: str, variant: Variant,
                   wheel_arch: str | None, native: dict[str, dict], base_url: str | None,
                   source_build: bool = False, lane: Lane | None = None, lanes: dict[str, str] | None = None,
                   shipped: dict[str, dict] | None = None) -> dict:
    """The identity baked into the wheel: the JIT libraries' identity plus what this wheel is, the pins
    ({name, size, sha256} of every JIT library of its cache id and of the `native` libraries it ships, `shipped`
    where the wheel's bytes are a rewritten copy (`ship`): the loader and jax-aiter-fetch-mha accept only those
    bytes) and the base URL jax-aiter-fetch-mha fetches from."""
    ident = dict(expectations.identity)
    archs = list(ident.get("gpu_archs") or [])
    if wheel_arch and any(a not in archs for a in config.split_archs(wheel_arch)):
        raise WheelBuildError(
            f"JA_WHEEL_ARCH={wheel_arch} but the JIT libraries were built for "
            f"{', '.join(archs) or 'no GPU arch'} (backend {ident.get('backend')}, {expectations.source}); "
            f"rebuild them with GPU_ARCHS={wheel_arch} {remedies.door('jit')}, or unset JA_WHEEL_ARCH")
    # lanes: {backend: lane} of the release, so the runtime can name the lane to install on another backend
    ident.update(schema=IDENTITY_SCHEMA, version=version, variant=variant.name, lane=lane.name if lane else None,
                 lanes=dict(lanes or {}),
                 wheel_arch=";".join(config.split_archs(wheel_arch)) if wheel_arch else (";".join(archs) or None),
                 pins=sorted({e["name"]: e for e in [*expectations.entries.values(), *native.values(),
                                                     *(shipped or {}).values()]}.values(), key=lambda e: e["name"]))
    if base_url:
        ident[BASE_URL_KEY] = base_url
    if source_build:  # built from the sdist on the installing machine, not a release build (docs/wheels.md)
        ident["source_build"] = True
    return ident


def verify_native(libs: dict[str, Path], names: list[str]) -> dict[str, dict]:
    """The umbrella library and shims against the record `make` wrote when it linked them; {name: entry}."""
    entries: dict[str, dict] = {}
    for folder in sorted({libs[n].parent for n in names}):
        here = [n for n in names if libs[n].parent == folder]
        fix = f"; run `make && make ja_mods` (each link records its library in {folder / RECORD_NAME})"
        record = read_record(folder / RECORD_NAME, fix) if (folder / RECORD_NAME).is_file() else {}
        if absent := [n for n in here if n not in record]:
            raise WheelBuildError(f"{', '.join(absent)} ha{'s' if len(absent) == 1 else 've'} no record of what "
                                  f"was linked{fix}")
        try:
            verify_entries(folder, [record[n] for n in here])
        except IntegrityError as e:
            raise IntegrityError(f"{e} ({folder / RECORD_NAME}): the library changed after make linked it; "
                                 "relink it (`make -B` for the umbrella, `make -B ja_mods` for shims)") from None
        entries.update({n: record[n] for n in here})
    return entries


def _toml_value(v) -> str:
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items()) + " }"
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return json.dumps(v)  # strings, numbers, true/false are written as TOML writes them


def anchor_pyproject(project: dict, version: str, packages: list[str], layout: Layout) -> str:
    """pyproject.toml for the staged tree: the repo's [project] at this version, libraries and the identity and
    data files as package data."""
    proj = {k: v for k, v in project.items() if k not in ("version", "readme", "dynamic")} | {"version": version}
    tables = {k: proj.pop(k) for k in list(proj) if isinstance(proj[k], dict) and k not in ("license",)}
    pkg_root = layout.lib_dir.split("/")[0]
    data_globs = [m[len(pkg_root) + 1:] for m in (f"{layout.lib_dir}/*.so", layout.identity_file, *layout.data_files)]
    lines = ["# Generated by jatools.wheel.wheel_build: this staged tree as a setuptools project, so that",
             "# `pip wheel <this folder> --no-deps --no-build-isolation` builds the equivalent wheel.",
             "[build-system]", 'requires = ["setuptools>=69", "wheel"]', 'build-backend = "setuptools.build_meta"',
             "", "[project]"]
    lines += [f"{k} = {_toml_value(v)}" for k, v in proj.items()]
    for name, table in tables.items():
        lines += ["", f"[project.{name}]"] + [f"{json.dumps(k)} = {_toml_value(v)}" for k, v in table.items()]
    lines += ["", "[tool.setuptools]", f"packages = {_toml_value(packages)}", "include-package-data = false",
              "", "[tool.setuptools.package-data]", f"{pkg_root} = {_toml_value(data_globs)}", ""]
    return "\n".join(lines)


def stage(settings: config.Settings, layout: Layout, variant: Variant, project: dict, version: str,
          libs: dict[str, Path], identity: dict,
          plat_tag: str | None = None) -> tuple[Path, dict[str, str], dict[str, str]]:
    """Write build/wheel_stage/<variant>/ atomically; return it, {member: how it was staged} and {member: sha256}
    of every file it copied or generated (the libraries are held to their records instead)."""
    stage_root = settings.path("wheel_stage")
    final = stage_root / variant.name
    tmp = stage_root / f".{variant.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        copied = [*python_files(settings.root), *layout.data_files]
        for rel in copied + license_files(project, settings.root):  # the licenses: the anchor project's
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(settings.root / rel, tmp / rel)
        how: dict[str, str] = dict.fromkeys(copied, "copy")
        # what each copied file holds now: the read-back holds the wheel to it, so a file changed in the stage
        # after staging (Python code or data, not only the libraries) does not ship
        digests = {rel: sha256_file(tmp / rel) for rel in copied}
        (tmp / layout.lib_dir).mkdir(parents=True, exist_ok=True)
        for name, src in sorted(libs.items()):
            try:
                os.link(src, tmp / layout.lib_member(name))
                how[layout.lib_member(name)] = "link"
            except OSError:
                shutil.copyfile(src, tmp / layout.lib_member(name))
                how[layout.lib_member(name)] = "copy"
        (tmp / layout.identity_file).write_text(json.dumps(identity, indent=2, sort_keys=True) + "\n")
        how[layout.identity_file] = "generated"
        digests[layout.identity_file] = sha256_file(tmp / layout.identity_file)
        (tmp / "pyproject.toml").write_text(anchor_pyproject(project, version, python_packages(settings.root), layout))
        if plat_tag:
            (tmp / "setup.cfg").write_text(f"[bdist_wheel]\npython_tag = py3\nplat_name = {plat_tag}\n")
        old = stage_root / f".{variant.name}.old-{os.getpid()}"
        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final, how, digests


def staged_members(stage_dir: Path, layout: Layout) -> list[tuple[str, Path, int]]:
    """(member, file, mode) of the package part of the wheel, in the order they are written."""
    tops = {m.split("/")[0] for m in (layout.lib_dir, layout.identity_file)}
    files = [(p.relative_to(stage_dir).as_posix(), p) for top in tops for p in (stage_dir / top).rglob("*")
             if p.is_file()]
    return sorted((rel, p, LIB_MODE if rel.startswith(layout.lib_dir + "/") else FILE_MODE) for rel, p in files)


def verify_libraries(settings: config.Settings, variant: Variant, version: str, libs: dict[str, Path],
                      jit_names: list[str], native_names: list[str], expectations: expect.JitExpectations | None,
                      log: Callable[[str], None]) -> tuple[expect.JitExpectations, dict[str, dict]]:
    """Every library the wheel will hold checked before staging: the JIT libraries against their record (the
    expectations), the native ones against theirs; (the expectations, {native library: its entry})."""
    try:
        expectations = expectations or expect.expectations(settings)
        log(f"wheel_build: {variant.name} {version}: verifying {len(jit_names)} JIT libraries "
            f"({sum(libs[n].stat().st_size for n in jit_names) / 1e6:.1f} MB) against {expectations.source}")
        expectations.verify_folder(settings.jit_dir, jit_names)
    except expect.JitExpectationError as e:
        raise WheelBuildError(str(e)) from e
    return expectations, verify_native(libs, native_names)
