"""invoke wiring: the contract's names exist, tasks raise Exit with a message and a code."""
from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ROOT
from invoke import Context, Exit

import tasks


def test_namespace_has_the_contract_names():
    names = set(tasks.ns.task_names)
    assert {"floor", "contents", "wheel.floor", "wheel.contents", "wheel.build"} <= names


def test_tasks_pass_good_wheels_and_fail_missing_ones(wheels, capsys):
    lite = str(wheels["lite"].wheel)
    tasks.floor(Context(), wheel=lite)
    assert "floor: ok" in capsys.readouterr().out
    with pytest.raises(Exit) as e:
        tasks.contents(Context(), wheel=str(ROOT / "no-such.whl"))
    assert e.value.code == 2 and "no wheel at" in e.value.message and "nox -s wheel_lite" in e.value.message


def test_invoke_command_line_takes_a_positional_wheel(wheels):
    full = str(wheels["full"].wheel)
    out = subprocess.run([sys.executable, "-m", "invoke", "floor", full], cwd=ROOT, capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert "floor: ok" in out.stdout and wheels["full"].wheel.name in out.stdout
