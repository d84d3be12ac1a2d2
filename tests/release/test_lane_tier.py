"""jatools.lane_tier's choice of wheel, before any venv is made (the venv, the install and the tier against the
installed wheel run end to end in tests/wheel/test_h200_ci_job.py)."""
from __future__ import annotations

import json
from pathlib import Path

from jatools import lane_tier, release
from jax_aiter.integrity import sha256_file


def test_a_relative_dist_gives_the_installer_the_wheels_absolute_path(tmp_path, monkeypatch):
    """`nox -s tests_lane` passes dist/ relative to the checkout, but pip runs in the venv's folder: the wheel it is
    given must be the report's, by an absolute path (a relative one made pip look in the temporary folder)."""
    dist = tmp_path / "dist"
    dist.mkdir()
    wheel = dist / "jax_aiter-0.1.0+cpu.full-py3-none-any.whl"
    wheel.write_bytes(b"the full wheel")
    (dist / Path(release.REPORT).name).write_text(json.dumps({
        "schema": release.SCHEMA, "kind": "jax-aiter-release", "ok": True, "commit": "0" * 40, "dirty": False,
        "lane": "cpu", "stages": [{"name": "wheel_full", "result": "ok", "artifacts": [
            {"path": f"dist/{wheel.name}", "sha256": sha256_file(wheel)}]}]}))
    given = []

    def make_env(wheel, platform, folder, root):
        given.append((wheel, folder))
        raise lane_tier.LaneTierError("stopped here")

    monkeypatch.setattr(lane_tier, "make_env", make_env)
    monkeypatch.chdir(tmp_path)
    assert lane_tier.run("cpu", Path("dist"), [], platform="cpu", root=tmp_path) == 2
    (got, folder), = given
    assert got.is_absolute() and got == wheel and not got.is_relative_to(folder)


def test_the_venv_takes_jax_at_the_test_pins_with_the_plugin_at_the_same_version():
    """The lane's venv gets JAX at the `test` group's jax==/jaxlib== (unpinned, pip took the newest JAX, 0.12, which
    the 0.11 GPU plugin does not match), the CUDA plugin at that version, and the `tier` group."""
    from jatools import config
    from jatools.validate import wheelhouse

    root = config.repo_root()
    pin = wheelhouse.test_jax_version(root)
    wheel = Path("/dist/jax_aiter-0.1.0+cuda13.full-py3-none-any.whl")
    reqs = lane_tier.requirements(wheel, "cuda", root)
    assert reqs[:3] == [str(wheel), f"jax=={pin}", f"jaxlib=={pin}"], reqs
    assert any(r.startswith("jax-cuda13-plugin") and r.endswith(f"=={pin}") for r in reqs), reqs
    assert set(config.dependency_group("tier", root)) <= set(reqs)
    assert set(config.dependency_group("wheel", root)) <= set(reqs)  # a group the tier group includes
    assert lane_tier.requirements(wheel, "cpu", root)[:3] == reqs[:3]
