"""The doors (docs/architecture.md, "From a command to its code") against nox's sessions and invoke's collection:
every session and task is a row, every door the table names exists, each task is one name (no alias pairs),
and every file the code column names is in the repository."""
from __future__ import annotations

import re
from pathlib import Path

import tasks
from tests.tooling.test_ci_build import nox_sessions

REPO = Path(__file__).resolve().parents[2]
HEADER = "| door | code | aliases |"


def _rows(text: str | None = None) -> list[list[str]]:
    """The door table of docs/architecture.md (or of `text`, a version of it)."""
    text = (REPO / "docs/architecture.md").read_text() if text is None else text
    table = text[text.index(HEADER):].split("\n\n", 1)[0].splitlines()[2:]
    return [[c.strip() for c in row.strip("|").split(" | ")] for row in table]


def _named(cells: list[str], tool: str) -> set[str]:
    """The `nox -s NAME` / `invoke NAME` commands the cells spell (first word after the tool's verb)."""
    verb = {"nox": r"nox -s ", "invoke": r"invoke "}[tool]
    return {m for c in cells for m in re.findall(rf"`{verb}([\w.-]+)", c)}


def session_differences(text: str | None = None) -> dict[str, set[str]]:
    """How the table (docs/architecture.md's, or `text`) and noxfile.py's sessions differ: sessions no row names,
    and sessions a row names that nox has not."""
    rows, sessions = _rows(text), set(nox_sessions())
    named = _named([r[0] for r in rows], "nox") | _named([r[2] for r in rows], "nox")
    return {k: v for k, v in {"not in the table": sessions - named, "no such session": named - sessions}.items() if v}


def invoke_doors() -> set[str]:
    """What `invoke --list` offers, a collection's default task under the collection's name."""
    defaults = {f"{name}.{c.default}": name for name, c in tasks.ns.collections.items() if c.default}
    return {defaults.get(name, name) for name in tasks.ns.task_names}


def test_every_nox_session_is_in_the_table_and_every_session_there_exists():
    assert session_differences() == {}


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


def test_the_check_sees_a_missing_row_and_a_session_that_does_not_exist():
    """The comparison names what differs: the table without the lint row (its session then unlisted), and with a
    row for a session noxfile.py does not define."""
    text = (REPO / "docs/architecture.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `nox -s lint` |"))
    assert session_differences(text.replace(row + "\n", "")) == {"not in the table": {"lint"}}
    renamed = row.replace("`nox -s lint`", "`nox -s lint_all`", 1)
    assert session_differences(text.replace(row, renamed)) == {"not in the table": {"lint"},
                                                                "no such session": {"lint_all"}}


def test_every_python_main_the_page_lists_exists():
    """docs/architecture.md lists no deleted command: each `python -m` main it names is a module that runs."""
    import importlib.util

    text = (REPO / "docs" / "architecture.md").read_text()
    listed = re.findall(r"`(jatools[\w.]*)`",
                        text[text.index("The `python -m` mains"):text.index("## Rules the layout")])
    assert len(listed) >= 10, listed
    for name in listed:
        spec = importlib.util.find_spec(name)
        assert spec is not None, f"docs/architecture.md names `python -m {name}`, which does not exist"
        source = Path(spec.origin).read_text() if not spec.submodule_search_locations else (
            Path(spec.origin).with_name("__main__.py").read_text())
        assert re.search(r"__main__|def main|main\(\)", source), f"`python -m {name}` runs nothing"
