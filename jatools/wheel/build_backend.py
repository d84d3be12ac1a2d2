"""The project's PEP 517/660 build backend (pyproject [build-system]): `python -m build`, `pip wheel .`,
`pip install [-e] .` and `uv build` call these hooks in the source tree (the current folder). build_wheel calls
the same wheel_build.build() as `nox -s wheel_*`, so every front-end makes the same bytes; `-C variant=full`
picks the full wheel. A checkout's build never compiles; an unpacked sdist without libraries runs the native
build first (`source_build`), and its identity says so.
"""
from __future__ import annotations

import contextlib
import functools
import os
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from jatools import atomic_write, config
from jatools.wheel import sdist
from jatools.wheel.dist_metadata import (
    add_dist_info,
    default_epoch,
    dist_info_files,
    file_name,
    metadata_text,
    project_table,
    wheel_text,
)
from jatools.wheel.wheel_build import BUILD_ERRORS, BuildOptions, WheelBuildError, build
from jatools.wheel.wheel_layout import SOURCE_VARIANT, Layout
from jatools.wheel.zip_writer import DeterministicZipWriter

CONFIG_SETTINGS = {"variant": "lite | full | source (default lite; source from an sdist without libraries): "
                              "-C variant=full, --config-settings variant=full"}
EDITABLE_PTH = "_jax_aiter_editable.pth"
# What a source build (an unpacked sdist without libraries) needs beyond [build-system].requires: ninja runs the JIT
# build. `pip wheel <sdist>` failed after 10 s with "ninja not found" before the backend asked for it.
SOURCE_BUILD_NEEDS = ("ninja",)


def _variant(config_settings: dict | None, default: str = "lite") -> str:
    unknown = sorted(set(config_settings or {}) - set(CONFIG_SETTINGS))
    if unknown:
        raise SystemExit(f"jax-aiter build backend: unknown config setting(s) {', '.join(unknown)}; known: "
                         + "; ".join(f"{k}: {v}" for k, v in CONFIG_SETTINGS.items()))
    value = (config_settings or {}).get("variant", default)
    return value[-1] if isinstance(value, list) else value  # a setting given twice: the last one wins


@contextlib.contextmanager
def _backend_errors(hint: str = ""):
    try:
        yield
    except BUILD_ERRORS as e:
        raise SystemExit(f"jax-aiter build backend: error: {e}{hint}") from None


def get_requires_for_build_wheel(config_settings: dict | None = None) -> list[str]:
    """[build-system].requires, plus, for an unpacked sdist without libraries (a source build runs the native
    build here), ninja, which runs the JIT build, at pyproject's build group's pin. A checkout's build compiles
    nothing and needs none. (A CUDA source build also reads nvidia-cutlass's headers; the build names the pin to
    install, since its Python side pulls some 60 MB no CPU or ROCm build needs.)"""
    try:
        settings = config.load(root=Path.cwd().resolve())
        if not unbuilt_sdist(settings, _variant(config_settings, SOURCE_VARIANT)):
            return []
    except (config.SettingError, OSError, SystemExit):
        return []
    import tomllib

    build = tomllib.loads((settings.root / "pyproject.toml").read_text())["dependency-groups"]["build"]
    return [r for r in build if isinstance(r, str) and r.split("=")[0].split(">")[0].strip() in SOURCE_BUILD_NEEDS]


def get_requires_for_build_editable(config_settings: dict | None = None) -> list[str]:
    return []  # [build-system].requires is everything: an editable install builds nothing


get_requires_for_build_sdist = get_requires_for_build_editable


def prepare_metadata_for_build_wheel(metadata_directory: str, config_settings: dict | None = None) -> str:
    """PEP 517: the wheel's dist-info (METADATA, licenses, WHEEL, entry points) without building anything, so
    pip and uv resolve an sdist's dependencies before its native build."""
    layout = Layout.load()
    variant = layout.variant(_variant(config_settings))
    root = Path.cwd().resolve()
    project = project_table(root)
    version = variant.version(project["version"], _lane(layout, root))
    dist_info = Path(metadata_directory) / f"{file_name(project)}-{version}.dist-info"
    with _backend_errors():
        metadata, _ = metadata_text(project, version, root)
        # the tag is the build's to measure; WHEEL here says what is known before it (pip reads METADATA)
        for name, data in dist_info_files(project, metadata, wheel_text("py3-none-any"), root).items():
            (dist_info / name).parent.mkdir(parents=True, exist_ok=True)
            (dist_info / name).write_bytes(data)
    return dist_info.name


def _lane(layout: Layout, root: Path):
    """The lane the wheel built here will have: its JIT libraries' backend's; None for an unpacked sdist without
    libraries (its source build keeps the sdist's version) or a tree with no JIT record yet (build_wheel then
    fails, naming the command that makes them)."""
    from jatools.jitlibs import expect
    from jatools.wheel import wheel_stage

    try:
        settings = config.load(root=root)
        if unbuilt_sdist(settings):
            return None
        return wheel_stage.lane_of(layout, expect.expectations(settings))
    except (expect.JitExpectationError, config.SettingError, OSError, ValueError):
        return None


def prepare_metadata_for_build_editable(metadata_directory: str, config_settings: dict | None = None) -> str:
    """PEP 660: the editable wheel's dist-info, the same metadata."""
    return prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def unbuilt_sdist(settings: config.Settings, variant: str = SOURCE_VARIANT) -> bool:
    """An unpacked sdist (it has PKG-INFO) whose build folder lacks a library of `variant`: a source build."""
    layout = Layout.load()
    return (settings.root / "PKG-INFO").is_file() and any(
        not (settings.build_dir / layout.libraries[n].dir / n).is_file() for n in layout.variant(variant).libraries)


def source_build(settings: config.Settings, log: Callable[[str], None]) -> None:
    """The native build of an unpacked sdist, here (umbrella, JIT libraries, shims: jatools/native/build.py's
    steps), for the backend JA_BACKEND names (auto: the CPU when no GPU compiler is found)."""
    from jatools import steps
    from jatools.native import build as native

    env = {**os.environ, "JA_ROOT_DIR": str(settings.root), "JA_JIT_LIBS": "build"}
    os.environ["JA_ROOT_DIR"] = str(settings.root)  # native_steps reads the checkout from it
    log(f"jax-aiter build backend: {settings.root} is an sdist with no native build: building the libraries here "
        f"(JA_BACKEND={env.get('JA_BACKEND') or settings.raw['backend']}; a release wheel never compiles)")
    try:
        steps.run(native.native_steps(jit="build", env=env), "source build", progress=log)
    except steps.StepFailed as e:
        raise WheelBuildError(f"the source build failed at {e.record.name}: {e}; the lines above say why "
                              "(JA_BACKEND=cpu builds the CPU libraries only)") from None


def build_wheel(wheel_directory: str, config_settings: dict | None = None,
                metadata_directory: str | None = None) -> str:
    """PEP 517: the lite wheel (or -C variant=full) from this tree's build folder. A checkout's build never
    compiles (a missing library is an error naming its command); an unpacked sdist without libraries (`pip
    install <sdist>`, `pip wheel`, `uv pip install`, `python -m build`) runs the native build first, and its
    identity says source_build."""
    stderr = functools.partial(print, file=sys.stderr, flush=True)
    with _backend_errors():
        settings = config.load(root=Path.cwd().resolve())  # the tree being built, whatever JA_ROOT_DIR says
        variant = _variant(config_settings, SOURCE_VARIANT if unbuilt_sdist(settings) else "lite")
        from_source = unbuilt_sdist(settings, variant)
        if from_source:
            source_build(settings, stderr)
        options = replace(BuildOptions.from_env(variant, Path(wheel_directory).resolve()), source_build=from_source)
        result = build(settings, options, log=stderr)
    stderr(result.summary())
    return result.wheel.name


def build_editable(wheel_directory: str, config_settings: dict | None = None,
                   metadata_directory: str | None = None) -> str:
    """PEP 660: a wheel of metadata and a .pth naming this tree, so `import jax_aiter` runs the checkout's code
    and loads its libraries from the build tree (jax_aiter/_loader.py); nothing is copied or compiled."""
    _variant(config_settings)
    root = config.load(root=Path.cwd().resolve()).root
    project = project_table(root)
    version, dist_name, tag = project["version"], file_name(project), "py3-none-any"
    wheel = Path(wheel_directory).resolve() / f"{dist_name}-{version}-{tag}.whl"
    with _backend_errors():
        metadata, _ = metadata_text(project, version, root)
        with atomic_write.open_bytes(wheel) as f, DeterministicZipWriter(f, time.gmtime(default_epoch(root))[:6]) as zw:
            zw.add_bytes(EDITABLE_PTH, f"{root}\n".encode())
            add_dist_info(zw, f"{dist_name}-{version}.dist-info", metadata, wheel_text(tag, purelib=True), project,
                          root)
    return wheel.name


def build_sdist(sdist_directory: str, config_settings: dict | None = None) -> str:
    """PEP 517: the sdist of this tree (`sdist`)."""
    _variant(config_settings)
    with _backend_errors():
        return sdist.sdist(Path.cwd().resolve(), Path(sdist_directory).resolve()).name
