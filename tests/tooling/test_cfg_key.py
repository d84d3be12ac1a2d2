"""The Makefile regenerates build/config.mk when a setting it depends on changes: CFG_KEY_NOW names exactly the
settings marked config_key in the settings table (jax_aiter/settings.py), so a new one cannot be forgotten."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from jax_aiter import settings

REPO = Path(__file__).resolve().parents[2]
MAKEFILE = (REPO / "Makefile").read_text()
MAKE_OWN = {"CXX"}  # make's compiler variable: part of the key, not a setting of ours


def key_variables(makefile: str) -> set[str]:
    line = next(ln for ln in makefile.splitlines() if ln.startswith("CFG_KEY_NOW :="))
    return set(re.findall(r"\$\(([A-Z_][A-Z0-9_]*)\)", line))


def key_differences(makefile: str) -> dict[str, set[str]]:
    """How CFG_KEY_NOW differs from the settings marked config_key: the marked ones it leaves out, and the
    variables it names that are neither marked nor make's own."""
    marked, named = {s.name for s in settings.SETTINGS if s.config_key}, key_variables(makefile) - MAKE_OWN
    return {k: v for k, v in {"left out": marked - named, "not marked": named - marked}.items() if v}


MARKED = sorted(s.name for s in settings.SETTINGS if s.config_key)


def test_cfg_key_names_the_config_key_settings():
    assert MARKED and all(MARKED)  # environment variables, every one
    assert key_differences(MAKEFILE) == {}


@pytest.mark.parametrize("name", MARKED)
def test_a_setting_left_out_of_the_key_is_named(name):
    """The real Makefile with one marked setting taken out of CFG_KEY_NOW: the check names exactly that one."""
    line = next(ln for ln in MAKEFILE.splitlines() if ln.startswith("CFG_KEY_NOW :="))
    assert f"$({name})" in line, f"{name} is not spelled $({name}) in CFG_KEY_NOW"
    assert key_differences(MAKEFILE.replace(line, line.replace(f"$({name})", ""))) == {"left out": {name}}


def test_a_variable_in_the_key_that_is_no_setting_is_named():
    line = next(ln for ln in MAKEFILE.splitlines() if ln.startswith("CFG_KEY_NOW :="))
    assert key_differences(MAKEFILE.replace(line, line + "$(JA_NOT_A_SETTING)")) == {"not marked": {"JA_NOT_A_SETTING"}}
