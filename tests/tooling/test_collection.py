"""Every test file is collected by a tier CI runs: a file no tier selects is a test nobody runs.

The tiers CI runs are read from ci/build.py (each build's test-tier step, `nox -s tests` or `nox -s tests_lane`:
its JA_TEST_TIER and the build's JA_BACKEND), their marker expressions from jatools/testing/tag_filters.py; pytest
collects every test once and reports each item's markers (a small plugin), and each expression is evaluated with
pytest's own matcher. (The
default `norecursedirs` skipped tests/build in every tier until pyproject.toml listed it without "build".)
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from _pytest.mark.expression import Expression

from jatools.testing import tag_filters
from tests.tooling.test_ci_build import ci_build

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = textwrap.dedent('''
    import json, os
    def pytest_collection_finish(session):
        with open(os.environ["JA_COLLECTED"], "w") as f:
            json.dump({i.nodeid: sorted({m.name for m in i.iter_markers()}) for i in session.items}, f)
''')


def ci_tiers() -> set[tuple[str, str]]:
    """(tier, platform) of every test-tier step (`nox -s tests`, `nox -s tests_lane`) of every CI build."""
    out = set()
    for build in ci_build.Build.all_builds().values():
        platform = dict(build.env).get("JA_BACKEND", "cpu")
        for step in build.steps:
            if isinstance(step, ci_build.Nox) and step.session.startswith("tests"):
                tier = dict(step.env).get("JA_TEST_TIER") or step.session.removeprefix("tests_") or "pr"
                out.add((tier if tier != "tests" else tag_filters.DEFAULT_TIER, platform))
    return out


def test_every_test_file_is_collected_by_a_tier_ci_runs(tmp_path):
    (tmp_path / "ja_collected.py").write_text(PLUGIN)
    env = {"PYTHONPATH": f"{tmp_path}:{ROOT}", "JA_COLLECTED": str(tmp_path / "items.json"), "JA_BACKEND": "cpu",
           "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "ja_collected",
                          "-p", "no:cacheprovider"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
                         check=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    items = json.loads((tmp_path / "items.json").read_text())
    tiers = ci_tiers()
    assert ("pr", "cpu") in tiers and ("pr", "cuda") in tiers, tiers
    expressions = [Expression.compile(f.expression() or "True") for tier, platform in sorted(tiers)
                   for _, _, f in tag_filters.tier_runs(tier, platform)]
    selected = {nodeid.split("::")[0] for nodeid, marks in items.items()
                if any(e.evaluate(lambda name, marks=marks, **kw: name in marks) for e in expressions)}
    files = {p.relative_to(ROOT).as_posix() for top in ("tests", "ci") for p in (ROOT / top).rglob("test_*.py")}
    missing = sorted(files - selected)
    assert not missing, f"test files no tier CI runs collects: {missing}"
    assert any(f.startswith("tests/build/") for f in selected), "tests/build is collected again"
