"""The stage rules (jatools/stages.py): no import of a later stage, no import cycle, and the docs show the table."""
from __future__ import annotations

from pathlib import Path

import pytest

from jatools import stages

REPO = Path(__file__).resolve().parents[2]


def test_every_module_is_in_a_stage_and_imports_only_its_own_or_earlier_stages():
    graph = stages.import_graph(REPO)
    assert {"jatools.jitlibs.record", "jax_aiter._loader", "ci.build", "benchmarks.gpu.bench_gpu"} <= set(graph)
    assert "ci.perf.parse_perf_log" in graph["ci.perf.bench_gate"]  # ci/ and benchmarks/ import by package
    assert "benchmarks.gpu.llama" in graph["benchmarks.gpu.model_bench"]
    assert {m: stages.STAGES[stages.stage_of(m)][0] for m in graph}  # stage_of raises on a module in no stage
    assert stages.violations(graph) == []


def test_no_module_edits_the_import_path():
    """ci/ and benchmarks/ are packages run from the checkout root: none of their modules (nor the runtime's or the
    tooling's) puts a folder on sys.path to reach another."""
    assert stages.path_edits(REPO) == []


def test_an_import_path_edit_is_named(tmp_path):
    root = _tree(tmp_path, {"ci/__init__.py": "", "jatools/__init__.py": "",
                            "ci/perf/gate.py": "import sys\nsys.path.insert(0, '..')\nsys.path[:0] = ['x']\n",
                            "benchmarks/gpu/b.py": "import sys\n\ndef f():\n    sys.path.append('.')\n",
                            "jatools/ok.py": "import sys\nprint('x' in sys.path, sys.path.index('x'))\n"})
    assert stages.path_edits(root) == ["benchmarks/gpu/b.py:4: sys.path.append('.')",
                                       "ci/perf/gate.py:2: sys.path.insert(0, '..')",
                                       "ci/perf/gate.py:3: sys.path[:0] = ['x']"]


def test_there_is_no_import_cycle():
    assert stages.cycles(stages.import_graph(REPO)) == []


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_an_import_of_a_later_stage_is_named(tmp_path):
    root = _tree(tmp_path, {"jax_aiter/__init__.py": "", "jatools/__init__.py": "",
                            "jax_aiter/info.py": "def f():\n    from jatools import config\n",  # lazy counts too
                            "jatools/config.py": "from jax_aiter import info\n",
                            "jatools/wheel/__init__.py": "", "jatools/wheel/wheel_build.py": "",
                            "jatools/native/jit_build.py": "from ..wheel import wheel_build\n"})
    graph = stages.import_graph(root)
    assert graph["jatools.native.jit_build"] == {"jatools.wheel.wheel_build"}  # a relative import resolved
    assert stages.violations(graph) == [
        "jatools.native.jit_build (native-tools) imports jatools.wheel.wheel_build (wheel), a later stage",
        "jax_aiter.info (runtime) imports jatools.config (base), a later stage"]


def test_a_cycle_is_named(tmp_path):
    root = _tree(tmp_path, {"jatools/__init__.py": "", "jatools/jitlibs/__init__.py": "",
                            "jatools/jitlibs/record.py": "from jatools.jitlibs.publish import PublishError\n",
                            "jatools/jitlibs/publish.py": "import jatools.jitlibs.record\n"})
    graph = stages.import_graph(root)
    assert stages.violations(graph) == []  # one stage: the table allows it, the cycle check does not
    (cycle,) = stages.cycles(graph)
    assert set(cycle.split(" -> ")) == {"jatools.jitlibs.record", "jatools.jitlibs.publish"}


def test_a_module_in_no_stage_is_refused():
    with pytest.raises(KeyError, match="in no stage of jatools/stages.py"):
        stages.stage_of("jatoolsx.thing")


def test_the_architecture_page_shows_the_table():
    assert stages.markdown() in (REPO / "docs/architecture.md").read_text()
