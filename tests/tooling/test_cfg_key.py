"""The Makefile regenerates build/config.mk when a setting it depends on changes: CFG_KEY_NOW names exactly the
settings marked config_key in the settings table (jax_aiter/settings.py), so a new one cannot be forgotten."""
from __future__ import annotations

import re
from pathlib import Path

from jax_aiter import settings

REPO = Path(__file__).resolve().parents[2]
MAKE_OWN = {"CXX"}  # make's compiler variable: part of the key, not a setting of ours


def key_variables(makefile: str) -> set[str]:
    line = next(ln for ln in makefile.splitlines() if ln.startswith("CFG_KEY_NOW :="))
    return set(re.findall(r"\$\(([A-Z_][A-Z0-9_]*)\)", line))


def test_cfg_key_names_the_config_key_settings():
    marked = {s.name for s in settings.SETTINGS if s.config_key}
    assert marked and all(marked)  # environment variables, every one
    assert key_variables((REPO / "Makefile").read_text()) - MAKE_OWN == marked


def test_a_setting_left_out_of_the_key_is_seen():
    line = "CFG_KEY_NOW := $(strip $(JA_BACKEND)|$(CXX))"
    assert key_variables(line) - MAKE_OWN != {s.name for s in settings.SETTINGS if s.config_key}
