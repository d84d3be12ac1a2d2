"""pytest plugin: the xdist workers of one run share one JAX compilation cache.

Without it every worker compiles the programs the others have compiled already
(eager ops in references and gradients compile one small program per operation,
shape and dtype, and most of those recur across tests), so N workers repeat the
one-worker run's compilations N times between them. The controller process
creates a fresh cache folder for the run, before the workers start, and they
inherit it through the environment (JAX reads JAX_COMPILATION_CACHE_DIR when it
is imported); every compilation is cached (minimum compile time 0). The folder
is removed when the run ends.

Only runs with more than one xdist worker get it: a single process already
keeps its compilations in memory. A cache folder the user set is used as it is
and kept. JA_SHARED_COMPILE_CACHE=0 switches it off.
"""
from __future__ import annotations

import os
import shutil
import tempfile

import pytest

CACHE_ENV = "JAX_COMPILATION_CACHE_DIR"
MIN_TIME_ENV = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"
SWITCH_ENV = "JA_SHARED_COMPILE_CACHE"

_made: str | None = None


def _workers(config: pytest.Config) -> int:
    n = getattr(config.option, "numprocesses", None)
    return n if isinstance(n, int) else 0


def wanted(env: dict[str, str], workers: int) -> bool:
    """Whether this (controller) process should make a shared cache for its workers."""
    return (workers > 1 and not env.get("PYTEST_XDIST_WORKER") and env.get(SWITCH_ENV, "1") != "0"
            and not env.get(CACHE_ENV))


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    global _made
    if not wanted(dict(os.environ), _workers(config)):
        return
    _made = tempfile.mkdtemp(prefix="ja-jax-compile-cache-")
    os.environ[CACHE_ENV] = _made
    os.environ.setdefault(MIN_TIME_ENV, "0")


def pytest_unconfigure(config: pytest.Config) -> None:
    global _made
    if _made is not None:
        shutil.rmtree(_made, ignore_errors=True)
        os.environ.pop(CACHE_ENV, None)
        _made = None


def pytest_report_header(config: pytest.Config) -> str | None:
    if _made is not None:
        return f"jax compilation cache shared by the xdist workers: {_made}"
    return None
