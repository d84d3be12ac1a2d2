"""The JAX range jax-aiter declares (pyproject.toml) and tests (jatools/testing/jax_versions.py, docs/ci.md "JAX
versions"): it has a floor and an upper bound, the `test` group's pin lies in it, the docs state it, a range
without a bound is refused, and a CI build runs the export round trip on both of its ends (issue 84: an unbounded
`jax>=0.11.0` let a plain install take JAX 0.12.1, on which exported sharded programs failed to reload)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from jatools.ci import act_local
from jatools.testing import jax_versions
from jatools.validate import wheelhouse

ROOT = Path(__file__).resolve().parents[2]


def _project(tmp: Path, deps: list[str], pin: str = "0.11.2") -> Path:
    (tmp / "pyproject.toml").write_text("[project]\nname='x'\nversion='1'\ndependencies=" + json.dumps(deps) + "\n"
                                        f"[dependency-groups]\ntest=['jax=={pin}', 'pytest>=8']\n")
    return tmp


def test_the_declared_range_is_bounded_and_holds_what_the_tiers_and_the_clean_room_run():
    jr = jax_versions.declared(ROOT)
    assert jr.bound and Version(jr.bound) > Version(jr.floor)
    assert Version(wheelhouse.test_jax_version(ROOT)) in jr.specifier  # every tier
    assert f"jax=={jr.floor}" in wheelhouse.requirements(ROOT)  # the clean room installs the same floor


def test_the_docs_state_the_declared_range():
    section = (ROOT / "docs" / "ci.md").read_text().split("### JAX versions", 1)[1]
    stated = re.search(r"requirements, `([^`]+)` today", section)
    assert stated, "docs/ci.md's JAX versions section no longer states the range as `SPEC` today"
    assert SpecifierSet(stated.group(1)) == jax_versions.declared(ROOT).specifier, (
        f"docs/ci.md states jax {stated.group(1)}; pyproject.toml declares {jax_versions.declared(ROOT).specifier}")


def test_each_end_of_the_range_as_pip_requirements(tmp_path):
    jr = jax_versions.declared(_project(tmp_path, ["jax>=0.11.0,<0.13", "jaxlib>=0.11.0,<0.13", "numpy"]))
    assert (jr.floor, jr.bound) == ("0.11.0", "0.13")
    assert jr.requirements("floor") == ["jax==0.11.0", "jaxlib==0.11.0"]
    assert [SpecifierSet(r.removeprefix("jaxlib").removeprefix("jax")) for r in jr.requirements("newest")] == \
        [SpecifierSet(">=0.11.0,<0.13")] * 2
    with pytest.raises(jax_versions.JaxRangeError, match=r"unknown end 'oldest'; one of floor, newest"):
        jr.requirements("oldest")


@pytest.mark.parametrize("deps,pin,msg", [
    (["jax>=0.11.0", "jaxlib>=0.11.0"], "0.11.2",
     (r"jax is required as >=0\.11\.0, without an upper bound: .*private JAX APIs .* "
      r"write `\"jax>=X,<Y\", \"jaxlib>=X,<Y\"`")),
    (["jax<0.13", "jaxlib<0.13"], "0.11.2", r"without a floor"),
    (["jax>=0.11.0,<0.13", "jaxlib>=0.11.0"], "0.11.2",
     r"jax is required as .* and jaxlib as >=0\.11\.0; JAX releases them together"),
    (["jax>=0.11.0,<0.13"], "0.11.2", r"name \['jax'\], not both of \['jax', 'jaxlib'\]"),
    (["jax>=0.11.0,<0.12", "jaxlib>=0.11.0,<0.12"], "0.12.1",
     r"the `test` group pins jax==0\.12\.1, outside the declared range"),
], ids=["no-bound", "no-floor", "jaxlib-differs", "no-jaxlib", "pin-outside"])
def test_a_range_that_cannot_be_tested_is_refused_naming_the_fix(tmp_path, deps, pin, msg):
    with pytest.raises(jax_versions.JaxRangeError, match=msg):
        jax_versions.declared(_project(tmp_path, deps, pin))


def test_ci_runs_the_export_round_trip_on_both_ends():
    """A nightly build runs `nox -s jax_range` (both ends: the session is parametrized over them) after the
    native build it needs; the session's ends are the module's."""
    cb = act_local.load_ci_build(ROOT)
    runs = [name for name, b in cb.Build.all_builds().items()
            if any(getattr(step, "session", None) == "jax_range" for step in b.steps)]
    assert runs == ["nightly_cpu_jax_range"], runs
    sessions = [getattr(step, "session", None) for step in cb.Build.all_builds()["nightly_cpu_jax_range"].steps]
    assert sessions.index("jit") < sessions.index("ja_mods") < sessions.index("jax_range"), sessions
    noxfile = (ROOT / "noxfile.py").read_text()
    assert '@nox.parametrize("end", list(JAX_ENDS))\ndef jax_range(' in noxfile
    assert jax_versions.ENDS == ("floor", "newest")
