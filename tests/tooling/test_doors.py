"""The doors (docs/architecture.md, "From a command to its code") against `nox -l` and invoke's collection:
every session and task is a row, every door the table names exists, each task is one name (no alias pairs),
and every file the code column names is in the repository."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import tasks

REPO = Path(__file__).resolve().parents[2]
HEADER = "| door | code | aliases |"


def _rows() -> list[list[str]]:
    text = (REPO / "docs/architecture.md").read_text()
    table = text[text.index(HEADER):].split("\n\n", 1)[0].splitlines()[2:]
    return [[c.strip() for c in row.strip("|").split(" | ")] for row in table]


def _named(cells: list[str], tool: str) -> set[str]:
    """The `nox -s NAME` / `invoke NAME` commands the cells spell (first word after the tool's verb)."""
    verb = {"nox": r"nox -s ", "invoke": r"invoke "}[tool]
    return {m for c in cells for m in re.findall(rf"`{verb}([\w.-]+)", c)}


def nox_sessions() -> set[str]:
    out = subprocess.run([sys.executable, "-m", "nox", "-l"], cwd=REPO, capture_output=True, text=True, check=True)
    return {line.split()[1] for line in out.stdout.splitlines() if line[:2] in ("* ", "- ")}


def invoke_doors() -> set[str]:
    """What `invoke --list` offers, a collection's default task under the collection's name."""
    defaults = {f"{name}.{c.default}": name for name, c in tasks.ns.collections.items() if c.default}
    return {defaults.get(name, name) for name in tasks.ns.task_names}


def test_every_nox_session_is_in_the_table_and_every_session_there_exists():
    rows = _rows()
    assert _named([r[0] for r in rows], "nox") | _named([r[2] for r in rows], "nox") == nox_sessions()


def test_every_invoke_task_is_a_door_of_the_table_and_every_task_there_exists():
    assert _named([r[0] for r in _rows()], "invoke") == invoke_doors()


def test_a_door_has_one_row_and_no_task_has_two_names():
    doors = [r[0] for r in _rows()]
    assert len(doors) == len(set(doors)), "a door listed twice"
    bodies = []
    for collection in [tasks.ns, *tasks.ns.collections.values()]:
        bodies += [t.body for t in collection.tasks.values()]
    assert len(bodies) == len(set(bodies)), "a task function registered under two names (an alias pair)"


def test_the_code_column_names_files_that_exist():
    paths = {m for r in _rows() for m in re.findall(r"`((?:jatools|jax_aiter|ci|benchmarks|scripts)/[\w/.]+\.\w+)`",
                                                    r[1] + r[2])}
    assert paths and not [p for p in sorted(paths) if not (REPO / p).is_file()]


def test_the_check_sees_a_missing_session():
    """The comparison can fail: a table without a session differs from `nox -l`."""
    rows = [r for r in _rows() if r[0] != "`nox -s lint`"]
    assert _named([r[0] for r in rows], "nox") | _named([r[2] for r in rows], "nox") != nox_sessions()
