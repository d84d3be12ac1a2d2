"""Requirements have one home, pyproject's dependency groups: noxfile.py spells none, and the header-only
packages (installed without their dependencies) are named once, by jatools/native/jit_packages.py."""
from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import InvalidRequirement, Requirement

from jatools.native import jit_packages
from tests.tooling.test_offline_index import offline_index

ROOT = Path(__file__).resolve().parents[2]


def _pinned_strings(path: Path) -> list[str]:
    """Every string constant of a Python file that is a requirement with a version (ruff==0.17.6, pyyaml>=6)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                req = Requirement(node.value)
            except InvalidRequirement:
                continue
            if req.specifier:
                found.append(node.value)
    return found


def test_the_noxfile_spells_no_requirement_of_its_own():
    assert _pinned_strings(ROOT / "noxfile.py") == [], \
        "noxfile.py pins packages itself: put them in a pyproject dependency group and read it with " \
        "nox.project.dependency_groups"


def test_the_check_sees_a_pinned_requirement(tmp_path):
    probe = tmp_path / "noxfile.py"
    probe.write_text('session.install("ruff==0.17.6", "-e", ".")\nnox.needs_version = ">=2024.4.15"\n')
    assert _pinned_strings(probe) == ["ruff==0.17.6"]


@pytest.mark.parametrize(("requirement", "headers_only"), [
    ("nvidia-cutlass==4.2.0", True), ("NVIDIA_Cutlass>=4", True), ("nvidia.cutlass", True),
    ("nvidia-cutlass-dsl==4.2.0", False), ("ninja>=1.11", False), ("-e", False), (".", False)])
def test_a_header_only_requirement_is_known_by_its_name(requirement, headers_only):
    assert jit_packages.is_headers_only(requirement) is headers_only


def test_the_offline_index_downloads_the_header_only_packages_without_dependencies():
    """What the sessions install --no-deps, the offline index downloads --no-deps: the build group's pins of the
    packages the JIT build reads headers from, and nothing else."""
    build = tomllib.loads((ROOT / "pyproject.toml").read_text())["dependency-groups"]["build"]
    with_deps, without = offline_index.to_download(set())
    assert without == sorted(r for r in build if jit_packages.is_headers_only(r)) != []
    assert not any(jit_packages.is_headers_only(r) for r in with_deps)
