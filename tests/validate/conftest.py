"""Fixtures for the clean-room tests: a warm wheelhouse (filled once, then reused), good wheels, a runner.

The wheelhouse is the checkout's own (build/wheelhouse, or JA_WHEELHOUSE), so a
developer's warm one serves the tests too; when it is cold it is filled once
from the package index. The good wheels are the wheel tests' own (a real CPU
build in build/tests-cpu, packed by jatools.wheel.wheel_build); the lite wheel's
release is this build's JIT libraries staged by jatools.jitlibs.publish. Validation runs
engine-free here (no container engine).
"""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from jatools import config
from jatools.jitlibs import publish
from jatools.validate import (
    cleanroom,
    cleanroom_env,
    cleanroom_inputs,
    cleanroom_report,
    wheelhouse,
)
from tests.wheel.conftest import layout, native_build, wheels  # noqa: F401  (fixtures: the real wheels)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def python312() -> Path:
    return cleanroom_env.find_python(config.python_version(REPO))


@pytest.fixture(scope="session")
def warm_wheelhouse(python312) -> Path:
    path = wheelhouse.location(REPO)
    wanted = wheelhouse.requirements(REPO)
    try:
        wheelhouse.ensure(path, wanted, python312, allow_fill=True, log=lambda m: print(m, file=sys.stderr))
    except wheelhouse.WheelhouseError as e:
        pytest.skip(f"the wheelhouse is cold and cannot be filled here (no package index?): {e}")
    uv = cleanroom_env.find_uv()
    print(f"\nclean-room tests: wheelhouse {path}; installer "
          f"{'uv ' + str(uv) if uv else 'venv + pip (uv not installed: slower)'}", file=sys.stderr)
    return path


@pytest.fixture(scope="session")
def host_python(warm_wheelhouse, python312, tmp_path_factory) -> Path:
    """A stand-in for an offline GPU host's interpreter: a venv outside the checkout with the wheelhouse's
    dependencies (JAX and the fetch extra) installed, for `--deps-from`."""
    venv = tmp_path_factory.mktemp("host") / "venv"
    installer = cleanroom_env.choose_installer("auto", warm_wheelhouse / ".uv-cache")
    env = {**os.environ, **installer.env()}
    for argv in (installer.create(str(python312), str(venv)),
                 installer.install(str(venv), str(warm_wheelhouse), wheelhouse.requirements(REPO))):
        subprocess.run(argv, check=True, env=env, capture_output=True, text=True)
    return venv / "bin" / "python"


@pytest.fixture(scope="session")
def good_wheels(wheels) -> dict[str, Path]:  # noqa: F811  (the wheel tests' fixture)
    return {v: r.wheel for v, r in wheels.items()}


@pytest.fixture(scope="session")
def release(native_build) -> Path:  # noqa: F811  (the wheel tests' fixture)
    """This build's JIT libraries staged as a release (what `invoke jit.publish --stage-only` makes)."""
    summary = publish.publish(native_build, "unused", stage_only=True, log=lambda m: None)
    return Path(summary["staged"]).parent


@pytest.fixture
def validate_wheels(warm_wheelhouse, request):
    """Validate wheels engine-free against the warm wheelhouse; returns the Report."""

    def run(*wheels: Path, **kw) -> cleanroom_report.Report:  # noqa: F811
        kw.setdefault("release", request.getfixturevalue("release") if any(
            cleanroom_inputs.wheel_variant(w) == "lite" for w in wheels) else None)
        opts = cleanroom.Options(root=REPO, wheels=list(wheels), engine="none", wheelhouse=warm_wheelhouse,
                                 fill=False, log=lambda m: None, **kw)
        report = cleanroom.validate(opts)
        print(report.summary())
        return report

    return run


def failures(result) -> str:
    """Every failed check of one wheel, as one text to match against."""
    return "\n".join(f"{c.name}: {c.message}" for c in result.checks if not c.ok)


def member(wheel: Path, name: str) -> bytes:
    with zipfile.ZipFile(wheel) as zf:
        return zf.read(name)
