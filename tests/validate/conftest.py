"""Fixtures for the clean-room tests: a warm wheelhouse (filled once, then reused), good wheels, a runner.

The wheelhouse is the checkout's own (build/wheelhouse, or JA_WHEELHOUSE), so a
developer's warm one serves the tests too; when it is cold it is filled once
from the package index. Validation runs engine-free here (no container engine).
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from jatools import cleanroom, cleanroom_env, config, wheelhouse
from tests.validate import wheel_factory

REPO = Path(__file__).resolve().parents[2]
NEEDED = ["build/jax_aiter_build/libjax_aiter.so", "build/jax_aiter_build/rmsnorm_fwd_ja.so",
          "build/jax_aiter_build/silu_and_mul_ja.so", "build/aiter_build/librmsnorm_fwd.so"]


@pytest.fixture(scope="session")
def python312() -> Path:
    return cleanroom_env.find_python(str(config.defaults(REPO)["validation_python"]))


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
def built() -> None:
    missing = [p for p in NEEDED if not (REPO / p).is_file()]
    if missing:
        pytest.fail(f"the native build is missing {', '.join(missing)}; run `JA_BACKEND=cpu make && "
                    "JA_BACKEND=cpu python3 jax_aiter/jit/build_jit.py && JA_BACKEND=cpu make ja_mods`")


@pytest.fixture(scope="session")
def good_wheels(tmp_path_factory, built) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("good-wheels")
    return {v: wheel_factory.build(out, v, wheel_factory.checkout_libs(v)) for v in ("lite", "full")}


@pytest.fixture
def validate_wheels(warm_wheelhouse):
    """Validate wheels engine-free against the warm wheelhouse; returns the Report."""

    def run(*wheels: Path, **kw) -> cleanroom.Report:
        opts = cleanroom.Options(root=REPO, wheels=list(wheels), engine="none", wheelhouse=warm_wheelhouse,
                                 fill=False, log=lambda m: None, **kw)
        report = cleanroom.validate(opts)
        print(report.summary())
        return report

    return run


def failures(result) -> str:
    """Every failed check of one wheel, as one text to match against."""
    return "\n".join(f"{c.name}: {c.message}" for c in result.checks if not c.ok)


def lib_copy(tmp: Path, names: list[str] | None = None) -> list[Path]:
    """Copies of the checkout's full set of libraries (to plant defects in without touching the build)."""
    tmp.mkdir(parents=True, exist_ok=True)
    out = []
    for lib in wheel_factory.checkout_libs("full"):
        if names is None or lib.name in names:
            out.append(Path(shutil.copy2(lib, tmp / lib.name)))
    return out
