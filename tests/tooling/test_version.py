"""The version has one home, pyproject.toml's [project].version; jax_aiter.__version__ is derived from it."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from jatools import config

REPO = Path(__file__).resolve().parents[2]
HOME = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
PROBE = "import jax_aiter, sys; sys.stdout.write(jax_aiter.__version__)"


def _version_of(package_parent: Path) -> subprocess.CompletedProcess:
    """jax_aiter.__version__ as a fresh interpreter sees it, importing jax_aiter from `package_parent`."""
    return subprocess.run([sys.executable, "-c", PROBE], cwd=package_parent, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(package_parent)}, check=False)


def _copy(tmp_path: Path, pyproject: str | None) -> Path:
    root = tmp_path / "tree"
    shutil.copytree(REPO / "jax_aiter", root / "jax_aiter", ignore=shutil.ignore_patterns("__pycache__", "*.so",
                                                                                        "_build_identity.json"))
    if pyproject is not None:
        (root / "pyproject.toml").write_text(pyproject)
    return root


def test_the_checkout_version_is_pyprojects():
    import jax_aiter

    assert jax_aiter.__version__ == HOME
    assert "__version__ =" not in (REPO / "jax_aiter/__init__.py").read_text(), "a second home of the version"


def test_a_checkout_reads_its_own_pyproject(tmp_path):
    root = _copy(tmp_path, '[project]\nname = "jax-aiter"\nversion = "9.8.7"\n')
    assert _version_of(root).stdout == "9.8.7"


def test_a_wheel_reads_its_baked_identity(tmp_path):
    root = _copy(tmp_path, '[project]\nname = "jax-aiter"\nversion = "9.8.7"\n')
    (root / "jax_aiter/_build_identity.json").write_text(json.dumps({"version": "9.8.7+full", "variant": "full"}))
    assert _version_of(root).stdout == "9.8.7+full"


def test_with_neither_it_says_what_is_missing(tmp_path):
    root = _copy(tmp_path, '[project]\nname = "another-project"\nversion = "1"\n')  # not this package's
    out = _version_of(root)
    if out.returncode == 0:  # the interpreter has jax-aiter installed: its metadata, written from the same home
        assert out.stdout == HOME
    else:
        assert "has no version: no _build_identity.json (a wheel), no jax-aiter pyproject.toml" in out.stderr


def test_python_version_is_the_requires_python_floor(tmp_path):
    """The one home of the Python version is pyproject's requires-python floor; any other form is refused."""
    assert config.python_version(REPO) == "3.12"
    (tmp_path / "pyproject.toml").write_text('[project]\nrequires-python = ">=3.13"\n')
    assert config.python_version(tmp_path) == "3.13"
    (tmp_path / "pyproject.toml").write_text('[project]\nrequires-python = "~=3.12"\n')
    with pytest.raises(config.SettingError, match="requires-python '~=3.12' is not of the form"):
        config.python_version(tmp_path)


def test_the_sessions_run_the_python_floor():
    """noxfile.py takes the sessions' Python from config.python_version(): every session with a virtualenv runs it
    (a session without one, venv_backend none, runs make and has no Python of its own)."""
    from tests.tooling.test_ci_build import nox_sessions

    sessions = nox_sessions()
    pythons = {name: f.python for name, f in sessions.items() if f.venv_backend != "none"}
    assert pythons and set(pythons.values()) == {config.python_version(REPO)}, pythons
    assert all(f.python is None for f in sessions.values() if f.venv_backend == "none")


def test_run_sh_takes_its_python_from_requires_python(tmp_path):
    """scripts/run.sh runs before any Python: it reads requires-python itself (the same floor as the home), and
    a checkout that asks for another Python makes it look for that one."""
    line = next(x for x in (REPO / "scripts/run.sh").read_text().splitlines() if x.startswith("pyv="))
    here = subprocess.run(["bash", "-c", f'{line}; printf %s "$pyv"'], cwd=REPO, capture_output=True, text=True,
                          check=True)
    assert here.stdout == config.python_version(REPO)
    (tmp_path / "scripts").mkdir()
    shutil.copy2(REPO / "scripts/run.sh", tmp_path / "scripts/run.sh")
    (tmp_path / "pyproject.toml").write_text('[project]\nrequires-python = ">=3.99"\n')
    out = subprocess.run(["bash", str(tmp_path / "scripts/run.sh"), "true"], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}, check=False)
    assert out.returncode == 2 and "Python 3.99 is required" in out.stderr, out.stderr
