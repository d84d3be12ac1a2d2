"""invoke wiring: the contract's names exist, tasks raise Exit with a message and a code, and `floor` /
`contents` take no wheel (every wheel in dist/), one, or several, through invoke's real Program."""
from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from conftest import ROOT
from invoke import Context, Exit, Program

import tasks


def test_namespace_has_the_contract_names():
    names = set(tasks.ns.task_names)
    assert {"floor", "contents"} <= names
    assert not {"wheel.floor", "wheel.contents", "wheel.build"} & names, "one name per door: no alias pairs"


def test_tasks_pass_good_wheels_and_fail_missing_ones(wheels, capsys):
    lite = str(wheels["lite"].wheel)
    tasks.floor(Context(), wheel=[lite])
    assert "floor: ok" in capsys.readouterr().out
    with pytest.raises(Exit) as e:
        tasks.contents(Context(), wheel=[str(ROOT / "no-such.whl")])
    assert e.value.code == 2 and "no wheel at" in e.value.message and "nox -s wheel_lite" in e.value.message


@pytest.fixture
def dist_root(wheels, tmp_path, monkeypatch):
    """A checkout root (JA_ROOT_DIR: its pyproject.toml) whose dist/ holds both wheels."""
    (tmp_path / "dist").mkdir()
    shutil.copy2(ROOT / "pyproject.toml", tmp_path)
    for result in wheels.values():
        shutil.copy2(result.wheel, tmp_path / "dist")
    monkeypatch.setenv("JA_ROOT_DIR", str(tmp_path))
    return tmp_path


def invoke(*argv: str) -> int:
    """invoke's own Program on the project's collection, as the `invoke` command runs it."""
    try:
        Program(namespace=tasks.ns).run(["invoke", *argv])  # exits only on a failure
    except SystemExit as e:  # Program turns Exit into sys.exit
        return int(e.code or 0)
    return 0


@pytest.mark.parametrize("name", ["floor", "contents"])
def test_no_argument_checks_every_wheel_in_dist(name, dist_root, wheels, capsys):
    assert invoke(name) == 0
    out = capsys.readouterr().out
    for result in wheels.values():
        assert result.wheel.name in out, out


def test_several_wheels_with_w_globs_commas_and_after_double_dash(dist_root, wheels, capsys):
    lite, full = (str(dist_root / "dist" / wheels[v].wheel.name) for v in ("lite", "full"))
    for argv in (["floor", "-w", lite, "-w", full], ["floor", "-w", str(dist_root / "dist/*.whl")],
                 ["contents", "-w", f"{lite},{full}"], ["floor", "--", lite, full]):
        assert invoke(*argv) == 0, argv
        out = capsys.readouterr().out
        assert out.count(": ok ") >= 2 and wheels["full"].wheel.name in out and wheels["lite"].wheel.name in out


def test_empty_dist_fails_with_the_build_command(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("JA_ROOT_DIR", str(tmp_path))
    assert invoke("floor") == 2
    err = capsys.readouterr().err
    assert f"no wheel at {tmp_path}/dist/*.whl" in err and "nox -s wheel_lite" in err


def test_invoke_command_line_checks_several_wheels(wheels):
    """The `invoke` console program itself (a subprocess), with the shell's expansion of dist/*.whl after --."""
    paths = [str(r.wheel) for r in wheels.values()]
    out = subprocess.run([sys.executable, "-m", "invoke", "floor", "--", *paths], cwd=ROOT, capture_output=True,
                         text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert all(r.wheel.name in out.stdout for r in wheels.values())
