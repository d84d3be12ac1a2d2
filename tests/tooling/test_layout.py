"""The layout's rules: the runtime stands alone (nothing under jax_aiter/ names the build tooling), and every
setting has one home (jax_aiter/settings.py's table, docs/settings.md generated from it)."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

from jatools import config
from jatools.testing import tag_filters
from jax_aiter import settings

ROOT = Path(__file__).resolve().parents[2]


def test_the_runtime_package_never_names_the_tooling() -> None:
    """jax_aiter/ ships in the wheels and the tooling does not: an import (or a mention that invites one) of
    jatools there would break an installed wheel."""
    hits = [f"{p.relative_to(ROOT)}:{n}" for p in sorted((ROOT / "jax_aiter").rglob("*"))
            if p.is_file() and p.suffix in (".py", ".json", ".toml")
            for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1) if "jatools" in line]
    assert not hits, f"jax_aiter/ names jatools at {hits}"


# --- one home per setting: jax_aiter/settings.py's table ----------------------------------------------------

SETTINGS_DOC = ROOT / "docs" / "settings.md"
# Where settings are read: the runtime, the tooling, CI scripts, the session and task files, make.
READERS = ("jax_aiter", "jatools", "ci", "scripts", "noxfile.py", "tasks.py", "Makefile")
SETTING_NAME = re.compile(r"\b(JA_[A-Z0-9_]*[A-Z0-9]|JAX_AITER_[A-Z0-9_]*[A-Z0-9]|AITER_[A-Z_]*[A-Z]|GPU_ARCHS)\b")
# What the native libraries read: every string literal of a variable's shape (getenv's argument, or a name
# passed on to it, as dispatch_entries.inc does with JA_MHA_SM90_OFF).
NATIVE_READ = re.compile(r'"((?:JA_|JAX_AITER_|AITER_)[A-Z0-9_]+)"')
# Names of that shape that are no environment variable.
NOT_SETTINGS = {"JA_BACKEND_RESOLVED": "the make variable jatools/native/toolchain.py writes into build/config.mk",
                "JA_INSTANCE": "the macro jatools/native/jit_modules.py writes into generated instance sources",
                **{m: "a C macro of the kernels' ABI the Python op mirrors (tests/build/test_abi_constants.py)" for m in
                   ("JA_MHA_MAX_HEAD_DIM", "JA_MHA_SYNC_TILE_ROWS", "JA_MHA_DECODE_MAX_ROWS", "JA_MHA_DECODE_WARPS",
                    "JA_MHA_DECODE_MIN_TILES")}}


def _tracked(*paths: str) -> list[Path]:
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "--", *paths], capture_output=True, text=True,
                         check=True).stdout.split()
    return [ROOT / p for p in out if (ROOT / p).is_file()]


def _names_in_tree() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in _tracked(*READERS):
        for m in SETTING_NAME.finditer(path.read_text(errors="replace")):
            found.setdefault(m.group(1), set()).add(str(path.relative_to(ROOT)))
    for path in _tracked("csrc"):
        for m in NATIVE_READ.finditer(path.read_text(errors="replace")):
            found.setdefault(m.group(1), set()).add(str(path.relative_to(ROOT)))
    return found


def test_the_settings_doc_is_current() -> None:
    assert SETTINGS_DOC.read_text() == config.settings_doc(ROOT), (
        "docs/settings.md is stale; regenerate it with `python3 -m jatools.config --settings-doc > docs/settings.md`")


def test_every_setting_read_in_the_tree_is_in_the_table_and_every_entry_is_read() -> None:
    found = _names_in_tree()
    missing = {n: sorted(w) for n, w in found.items() if n not in settings.BY_NAME and n not in NOT_SETTINGS}
    assert not missing, (f"read but not in jax_aiter/settings.py's SETTINGS: {missing}; add each (meaning, default, "
                         "pyproject key) or, if nobody should set it, remove it")
    text = "\n".join(p.read_text(errors="replace") for p in _tracked(*READERS, "csrc"))
    stale = sorted(n for n in settings.BY_NAME if not re.search(rf"\b{n}\b", text))
    assert not stale, f"in jax_aiter/settings.py but read nowhere: {stale}; remove them"
    assert not [n for n in NOT_SETTINGS if n not in found or n in settings.BY_NAME], NOT_SETTINGS


def test_every_pyproject_default_is_in_the_table() -> None:
    keys = set(config.defaults(ROOT))
    assert keys == set(settings.BY_KEY), (
        "pyproject [tool.jax-aiter] keys without an entry in jax_aiter/settings.py: "
        f"{sorted(keys - set(settings.BY_KEY))}; "
        f"entries naming a key pyproject lacks: {sorted(set(settings.BY_KEY) - keys)}")
    assert not [s for s in settings.SETTINGS if s.key and s.default is not None], "a default lives in pyproject or here"


def test_the_settings_other_modules_choose_from_are_the_tables() -> None:
    assert tuple(tag_filters.TIERS) == settings.BY_NAME[tag_filters.TIER_ENV].choices
    assert config.VALID_BACKENDS == ("auto", "cpu", *tag_filters.PLATFORMS[1:])


def test_the_ci_builds_run_tiers_of_the_table() -> None:
    """ci/build.py names tiers by their string (JA_TEST_TIER in a build's or a step's environment): each is one of
    jatools/testing/tag_filters.py's TIERS, the one home the setting's choices and the nox sessions come from."""
    from tests.tooling.test_ci_build import ci_build

    used = {value for b in ci_build.Build.all_builds().values() for env in (b.env, *(s.env for s in b.steps))
            for name, value in env if name == tag_filters.TIER_ENV}
    assert used and used <= set(tag_filters.TIERS), \
        f"ci/build.py runs tiers the table lacks: {used - set(tag_filters.TIERS)}"
