"""The commands error messages name to build or fetch the JIT libraries come from one table, jax_aiter/remedies.py."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from jax_aiter import remedies

REPO = Path(__file__).resolve().parents[2]
# How a message could spell a door of the table by hand (the JIT build's alias too).
SPELLINGS = ("python3 jax_aiter/jit/build_jit.py", "build_jit.py --module", "nox -s jit", "make jit",
             "invoke jit.fetch", "invoke wheelhouse", "invoke validate.wheelhouse")


def _hand_spelled(path: Path) -> list[str]:
    """The string literals of `path` (docstrings aside) that spell a JIT door."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [f"{path.name}:{n.lineno}: {n.value[:80]!r}" for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
            and any(s in n.value for s in SPELLINGS)]


def test_no_message_spells_a_jit_door_by_hand():
    files = [p for top in ("jax_aiter", "jatools") for p in sorted((REPO / top).rglob("*.py"))
             if p != REPO / "jax_aiter/remedies.py" and "__pycache__" not in p.parts]
    found = [f"{p.parent.relative_to(REPO)}/{hit}" for p in files for hit in _hand_spelled(p)]
    assert not found, "word these through jax_aiter.remedies.door():\n" + "\n".join(found)


def test_the_scan_finds_a_hand_spelled_door(tmp_path):
    bad = tmp_path / "m.py"
    bad.write_text('"""Docs may say nox -s jit."""\nX = f"run `python3 jax_aiter/jit/build_jit.py --module {1}`"\n')
    assert [h.split(":")[1] for h in _hand_spelled(bad)] == ["2"]


def test_the_table_names_the_doors():
    assert (remedies.door("jit") == "nox -s jit"
            and remedies.door("jit", ["mha_fwd"]) == "nox -s jit -- --module mha_fwd")
    assert remedies.build_or_fetch(["a", "b"]) == ("build the JIT libraries with `nox -s jit -- --module a,b` or fetch "
                                                   "published ones with `invoke jit.fetch`")
    with pytest.raises(KeyError, match="no door for 'jit_build'; the actions are jit, jit_fetch"):
        remedies.door("jit_build")
