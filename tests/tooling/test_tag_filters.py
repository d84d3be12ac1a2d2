"""The tag-filter table: golden file current, composition, CLI, tiers from the same table."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from jatools.testing import tag_filters as tf

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "ci" / "tag_filters_golden.txt"
CLI = ("-m", "ci.tag_filters")  # from the checkout root (cwd=ROOT)


def test_golden_file_is_current():
    assert GOLDEN.read_text() == tf.render_table(), (
        "ci/tag_filters_golden.txt is stale; regenerate it with `python3 -m ci.tag_filters --update-golden` "
        "and review the diff")


@pytest.mark.parametrize("platform", tf.PLATFORMS)
@pytest.mark.parametrize("config", tf.CONFIGS)
def test_every_expression_is_the_base_plus_the_config(platform, config):
    f = tf.tag_filter(platform, config)
    for m in tf.PLATFORM_BASE[platform].exclude + tf.CONFIG_ADDS[config].exclude:
        assert f"not {m}" in f.expression().split(" and ")
    for m in tf.CONFIG_ADDS[config].require:
        assert m in f.expression().split(" and ")


def _selected(expr: str, markers: set[str]) -> bool:
    """Evaluate a marker expression the way pytest does (the real MarkMatcher)."""
    from _pytest.mark.expression import Expression

    return Expression.compile(expr).evaluate(lambda name, **kw: name in markers) if expr else True


@pytest.mark.parametrize("platform,config,markers,expected", [
    ("cpu", "cpu", set(), True),
    ("cpu", "cpu", {"gpu"}, False),
    ("cpu", "cpu", {"multigpu"}, False),
    ("cpu", "multi_gpu", {"multigpu"}, True),
    ("cpu", "multi_gpu", {"multigpu", "cuda_only"}, False),
    ("cpu", "single_gpu", {"gpu"}, False),  # a CPU cannot run the single_gpu config
    ("cuda", "single_gpu", {"gpu"}, True),
    ("cuda", "single_gpu", {"gpu", "rocm_only"}, False),
    ("cuda", "single_gpu", {"gpu", "cuda_only"}, True),
    ("cuda", "single_gpu", set(), False),
    ("rocm", "single_gpu", {"gpu", "cuda_only"}, False),
    ("rocm", "multi_gpu", {"multigpu", "rocm_only"}, True),
    ("rocm", "multi_gpu", {"gpu"}, False),
])
def test_expressions_select_what_the_table_says(platform, config, markers, expected):
    assert _selected(tf.tag_filter(platform, config).expression(), markers) is expected


def test_tiers_are_composed_from_the_same_table():
    (kind, config, f), = tf.tier_runs("pr", "cuda")
    assert (kind, config) == ("single", "single_gpu")
    assert f == tf.tag_filter("cuda", "single_gpu") + tf.Filter(exclude=("slow", "packaging", "multigpu"))
    assert not _selected(f.expression(), {"gpu", "slow"}) and _selected(f.expression(), {"gpu"})
    assert not _selected(f.expression(), {"packaging"})
    assert [r[:2] for r in tf.tier_runs("nightly", "cpu")] == [("single", "cpu"), ("multi", "multi_gpu")]
    assert [r[:2] for r in tf.tier_runs("multigpu", "rocm")] == [("multi", "multi_gpu")]
    # the issue's definitions, as the tiers' own selections
    assert tf.TIERS["pr"].runs[0][1].expression() == "not slow and not packaging and not multigpu"
    assert tf.TIERS["multigpu"].runs[0][1].expression() == "multigpu"


def test_unknown_names_list_the_valid_ones():
    with pytest.raises(tf.TagFilterError, match="valid tiers: pr, nightly, multigpu"):
        tf.tier_named("weekly")
    with pytest.raises(tf.TagFilterError, match="valid platforms: cpu, cuda, rocm"):
        tf.tag_filter("tpu", "cpu")
    with pytest.raises(tf.TagFilterError, match="unknown marker"):
        tf.Filter(exclude=("gpus",))


def test_cli_prints_one_expression_and_rejects_bad_names():
    out = subprocess.run([sys.executable, *CLI, "--config", "single_gpu", "--platform", "rocm"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == tf.tag_filter("rocm", "single_gpu").expression()
    bad = subprocess.run([sys.executable, *CLI, "--config", "dual_gpu", "--platform", "rocm"], cwd=ROOT,
                         capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and "valid configs: cpu, single_gpu, multi_gpu" in bad.stderr


def test_markers_match_pyproject_registration():
    import tomllib

    registered = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    assert sorted(m.split(":")[0].strip() for m in registered) == sorted(tf.MARKERS)
