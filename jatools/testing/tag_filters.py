"""The tag filters and the tiers: which tests a machine runs, as one table of pytest marker expressions.

Composed as XLA composes its ROCm ones: a platform's base list plus each CI configuration's requirements;
the tiers use the same ``Filter``, so this is the one source of every ``pytest -m`` expression CI uses,
printed by python3 -m ci.tag_filters (docs/testing.md). Stdlib only.
"""
from __future__ import annotations

from dataclasses import dataclass

from jax_aiter import settings

MARKERS = ("gpu", "multigpu", "gpu_memory", "slow", "packaging", "cuda_only", "rocm_only")
PLATFORMS = ("cpu", "cuda", "rocm")
CONFIGS = ("cpu", "single_gpu", "multi_gpu")


class TagFilterError(ValueError):
    """An unknown platform, configuration or tier; the message lists the valid ones."""


@dataclass(frozen=True)
class Filter:
    """A marker selection: a test must carry every ``require`` marker and no ``exclude`` marker."""

    require: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        unknown = [m for m in (*self.require, *self.exclude) if m not in MARKERS]
        if unknown:
            raise TagFilterError(f"unknown marker(s) {', '.join(unknown)}; markers are {', '.join(MARKERS)} "
                                 "(registered in pyproject.toml [tool.pytest.ini_options])")

    def __add__(self, other: Filter) -> Filter:
        return Filter(tuple(dict.fromkeys((*self.require, *other.require))),
                      tuple(dict.fromkeys((*self.exclude, *other.exclude))))

    def contradiction(self) -> str | None:
        """Why this filter can select no test, or None when it can select some."""
        both = [m for m in self.require if m in self.exclude]
        return f"requires and excludes {', '.join(both)}" if both else None

    def expression(self) -> str:
        """The ``pytest -m`` expression ('' selects everything)."""
        return " and ".join([*self.require, *(f"not {m}" for m in self.exclude)])


# What each platform must never attempt (XLA: rocm_tag_filters.sh's base list).
PLATFORM_BASE: dict[str, Filter] = {
    "cpu": Filter(exclude=("gpu", "cuda_only", "rocm_only")),
    "cuda": Filter(exclude=("rocm_only",)),
    "rocm": Filter(exclude=("cuda_only",)),
}

# Per-configuration additions (XLA: ci_rocm_cpu / ci_single_gpu / ci_multi_gpu).
CONFIG_ADDS: dict[str, Filter] = {
    "cpu": Filter(exclude=("gpu", "multigpu")),
    "single_gpu": Filter(require=("gpu",), exclude=("multigpu",)),
    "multi_gpu": Filter(require=("multigpu",)),
}


# Run kinds and their configuration: "single", the platform's single-device tests (config cpu on the CPU
# platform); "host", the CPU-device tests on a GPU host (on a CPU host they are the single run, so it is
# dropped); "multi", the multi-device tests.
RUN_CONFIGS = {"single": "single_gpu", "host": "cpu", "multi": "multi_gpu"}
RUN_KINDS = tuple(RUN_CONFIGS)


@dataclass(frozen=True)
class Tier:
    """A test tier: one or more pytest runs, each a device kind plus the tier's own selection;
    ``timeout_s`` is pytest-timeout's limit per test (a hung test fails instead of holding the job)."""

    name: str
    doc: str
    runs: tuple[tuple[str, Filter], ...]  # (kind: one of RUN_KINDS, tier selection)
    timeout_s: int

    def __post_init__(self) -> None:
        bad = [kind for kind, _ in self.runs if kind not in RUN_KINDS]
        if bad or self.timeout_s <= 0:
            raise TagFilterError(f"tier {self.name}: run kinds must be {', '.join(RUN_KINDS)} (got {bad}) and "
                                 f"timeout_s positive (got {self.timeout_s})")


TIERS: dict[str, Tier] = {t.name: t for t in (
        Tier("pr", "every pull request: fast single-device tests",
             (("single", Filter(exclude=("slow", "packaging", "multigpu"))),),
             timeout_s=300),
        Tier("nightly", "the full suite: single-device run, the CPU-device tests on a GPU host, the multi-device run",
             (("single", Filter()), ("host", Filter()), ("multi", Filter(require=("multigpu",)))), timeout_s=1200),
        Tier("multigpu", "the sharded multi-device tests only", (("multi", Filter(require=("multigpu",))),),
             timeout_s=600))}
TIER_ENV = "JA_TEST_TIER"
DEFAULT_TIER = settings.BY_NAME[TIER_ENV].default


def _check(kind: str, value: str, valid) -> None:
    if value not in valid:
        raise TagFilterError(f"unknown {kind} {value!r}; valid {kind}s: {', '.join(valid)}")


def tag_filter(platform: str, config: str) -> Filter:
    """The platform's base list plus the configuration's additions."""
    _check("platform", platform, PLATFORMS)
    _check("config", config, CONFIGS)
    return PLATFORM_BASE[platform] + CONFIG_ADDS[config]


def tier_named(name: str) -> Tier:
    _check("tier", name, tuple(TIERS))
    return TIERS[name]


def tier_runs(name: str, platform: str) -> list[tuple[str, str, Filter]]:
    """[(kind, config, filter)] for a tier on a platform: tag filter plus the tier's selection (no "host" run
    on the CPU platform)."""
    configs = {**RUN_CONFIGS, "single": "cpu"} if platform == "cpu" else RUN_CONFIGS
    return [(kind, configs[kind], tag_filter(platform, configs[kind]) + sel)
            for kind, sel in tier_named(name).runs if not (kind == "host" and platform == "cpu")]


def render_table() -> str:
    """The whole table as text: the golden file's content."""
    lines = ["# pytest -m expressions by (platform, config): platform base + config additions.",
             "# Regenerate: python3 -m ci.tag_filters --update-golden", ""]
    for platform in PLATFORMS:
        for config in CONFIGS:
            f = tag_filter(platform, config)
            note = f"   # selects nothing: {f.contradiction()}" if f.contradiction() else ""
            lines.append(f"{platform:<5} {config:<10} {f.expression()!r}{note}")
    lines += ["", "# tiers: the tier's own selection, then each run as materialised per platform", ""]
    for t in TIERS.values():
        own = " | ".join(f"{kind}: {sel.expression() or '<all>'!r}" for kind, sel in t.runs)
        lines.append(f"tier {t.name:<9} {own}   # {t.doc}")
        lines.append(f"  timeout per test: {t.timeout_s} s")
        for platform in PLATFORMS:
            for kind, config, f in tier_runs(t.name, platform):
                lines.append(f"  {platform:<5} {kind:<6} {config:<10} {f.expression()!r}")
    return "\n".join(lines) + "\n"
