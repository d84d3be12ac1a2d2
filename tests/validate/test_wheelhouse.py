"""The offline wheelhouse: what goes in (derived from pyproject), when it is warm, and a real fill with pip."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from jatools.validate import wheelhouse
from tests.validate.conftest import REPO


def _project(tmp: Path, deps: list[str], extra: str = "") -> Path:
    (tmp / "pyproject.toml").write_text(
        "[project]\nname='x'\nversion='1'\ndependencies=" + json.dumps(deps) + "\n"
        "[project.optional-dependencies]\nfetch=['zstandard>=0.22']\n"
        "[tool.jax-aiter]\nvalidation_floor=['jax','jaxlib']\nwheelhouse='wh'\n"
        "validation_plugins_cuda=['jax-cuda13-plugin', 'jax-cuda13-pjrt']\n" + extra)
    return tmp


def test_requirements_pin_the_floor_and_add_the_fetch_extra(tmp_path):
    root = _project(tmp_path, ["jax>=0.11.0", "jaxlib>=0.11.0,<0.13", "numpy>=1.26"])
    assert wheelhouse.requirements(root) == ["jax==0.11.0", "jaxlib==0.11.0", "numpy>=1.26", "zstandard>=0.22"]
    assert wheelhouse.requirements(root, ("cuda",))[:2] == ["jax-cuda13-pjrt==0.11.0", "jax-cuda13-plugin==0.11.0"]
    with pytest.raises(wheelhouse.WheelhouseError, match="no JAX plugin is configured for backend 'rocm'"):
        wheelhouse.requirements(root, ("rocm",))


def test_a_floor_package_without_a_lower_bound_is_refused(tmp_path):
    root = _project(tmp_path, ["jax", "jaxlib>=0.11"])
    with pytest.raises(wheelhouse.WheelhouseError, match="dependency jax has no lower bound"):
        wheelhouse.requirements(root)


def test_this_projects_requirements():
    reqs = wheelhouse.requirements(REPO)
    assert any(r.startswith("jax==") for r in reqs) and any(r.startswith("jaxlib==") for r in reqs)
    assert any(r.startswith("zstandard") for r in reqs), "the fetch extra (jax-aiter-fetch-mha) must be in"


def test_location_precedence(tmp_path):
    root = _project(tmp_path, ["jax>=0.11"])
    assert wheelhouse.location(root, env={}) == root / "wh"
    assert wheelhouse.location(root, env={"JA_WHEELHOUSE": "/x"}) == Path("/x")
    assert wheelhouse.location(root, flag="rel", env={"JA_WHEELHOUSE": "/x"}) == root / "rel"


def test_warm_cold_and_damaged(warm_wheelhouse, python312, tmp_path):
    wanted = wheelhouse.requirements(REPO)
    tag = wheelhouse.python_tag(python312)
    assert wheelhouse.status(warm_wheelhouse, wanted, tag).warm
    assert "no wheelhouse.json" in wheelhouse.status(tmp_path, wanted, tag).reason
    assert "lacks other-pkg" in wheelhouse.status(warm_wheelhouse, wanted + ["other-pkg"], tag).reason
    assert "for Python" in wheelhouse.status(warm_wheelhouse, wanted, "3.99").reason
    copy = tmp_path / "copy"
    shutil.copytree(warm_wheelhouse, copy, ignore=shutil.ignore_patterns(".uv-cache"))
    victim = min(copy.glob("*.whl"))
    victim.write_bytes(b"truncated")
    assert "another size" in wheelhouse.status(copy, wanted, tag).reason
    with pytest.raises(wheelhouse.WheelhouseError, match="invoke wheelhouse"):
        wheelhouse.ensure(copy, wanted, python312, allow_fill=False)


def test_fill_resolves_with_real_pip_and_keeps_exactly_the_resolution(warm_wheelhouse, python312, tmp_path):
    """pip download, offline: the warm wheelhouse stands in for the index."""
    target = tmp_path / "wh"
    target.mkdir()
    (target / "stale-1.0-py3-none-any.whl").write_bytes(b"old")

    def offline(cmd):
        return subprocess.run([*cmd[:4], "--no-index", "--find-links", str(warm_wheelhouse), *cmd[4:]],
                              check=False, capture_output=True, text=True)

    st = wheelhouse.fill(target, ["opt_einsum"], python312, log=lambda m: None, run=offline)
    assert st.warm and [f["name"] for f in st.stamp["files"]] == [p.name for p in sorted(target.glob("*.whl"))]
    assert not (target / "stale-1.0-py3-none-any.whl").exists()
    assert wheelhouse.status(target, ["opt_einsum"], wheelhouse.python_tag(python312)).warm
    with pytest.raises(wheelhouse.WheelhouseError, match="the package index must be reachable"):
        wheelhouse.fill(target, ["no-such-package-xyz"], python312, log=lambda m: None, run=offline)
    assert not (target / wheelhouse.STAMP).exists(), "a failed fill must not leave a warm stamp"
