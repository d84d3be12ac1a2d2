"""jax_aiter.__version__, derived: the version has one home, pyproject.toml's [project].version.

An installed wheel bakes it into jax_aiter/_build_identity.json (with +full on the full wheel); a source
checkout has pyproject.toml beside the package; anything else (an sdist install, say) has the installed
distribution's metadata, which the build backend wrote from pyproject.toml too.
"""
from __future__ import annotations

from importlib import metadata

from jax_aiter import _loader

DIST = "jax-aiter"


def version() -> str:
    """This package's version: the wheel's baked identity, else the checkout's pyproject.toml, else metadata."""
    baked = (_loader.build_identity() or {}).get("version")
    if baked:
        return baked
    pyproject = _loader.PACKAGE_DIR.parent / "pyproject.toml"
    if pyproject.is_file():
        from jax_aiter.settings import load_toml

        project = load_toml(pyproject).get("project", {})  # not TOML: SettingError naming the file and the line
        if project.get("name") == DIST:
            return project["version"]
    try:
        return metadata.version(DIST)
    except metadata.PackageNotFoundError:
        raise RuntimeError(f"jax_aiter at {_loader.PACKAGE_DIR} has no version: no {_loader.IDENTITY_FILE.name} "
                           "(a wheel), no jax-aiter pyproject.toml beside it (a checkout) and no installed jax-aiter "
                           "distribution; install jax-aiter (pip install jax-aiter) or run from a checkout") from None
