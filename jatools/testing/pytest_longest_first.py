"""pytest plugin: with --longest-first, run the tests that took longest last time first.

With xdist the wall time is set by the worker that finishes last. Collection
order can leave a long test for the end, so one worker runs it while the
others sit idle. Started first, a long test overlaps with the other workers'
short ones, and the short tests left at the end even the workers out (the
scheduling rule called LPT, longest processing time first).

Durations come from earlier runs. Each test's setup + call + teardown seconds
are kept in pytest's cache (.pytest_cache, key jax_aiter/durations). The
process that sees every report writes them: the xdist controller, or the one
pytest process. A test with no recorded duration counts as the mean of the
recorded ones. With nothing recorded yet, the collection order stands and the
header says so.

Under --dist worksteal, xdist first hands each of its N workers one contiguous
slice of the collection (sizes len // N, ...), and an idle worker later steals
the end of a busy one's queue. So the order is N slices, one per worker, each
filled longest first with the next test going to the slice with the least
time so far (LPT again): every worker starts with about the same work, its own
long tests first, and what is left to steal at the end is short.

Every worker must collect the same order, or xdist aborts the run. So the
controller reads the cache once and hands the durations to each worker
(xdist's workerinput), instead of each worker reading a file another run may
be rewriting. --ff/--nf (failed or new first) win: with either, the order is
left to them.
"""
from __future__ import annotations

import pytest

OPTION = "--longest-first"
CACHE_KEY = "jax_aiter/durations"
SLICES_KEY = "jax_aiter/longest_first_slices"


def slice_sizes(n: int, parts: int) -> list[int]:
    """How xdist's worksteal scheduler first splits n tests over `parts` workers: n // parts, ..., in order."""
    sizes = []
    for i in range(parts):
        sizes.append(n // (parts - i))
        n -= sizes[-1]
    return sizes


def longest_first(nodeids: list[str], seconds: dict[str, float], parts: int = 1) -> list[int]:
    """Indices of nodeids, longest recorded duration first (ties and unknowns keep collection order).

    parts > 1: `parts` consecutive slices (slice_sizes), each longest first, with about equal time.
    """
    known = [seconds[n] for n in nodeids if n in seconds]
    if not known:
        return list(range(len(nodeids)))
    guess = sum(known) / len(known)
    est = [seconds.get(n, guess) for n in nodeids]
    order = sorted(range(len(nodeids)), key=lambda i: (-est[i], i))
    if parts <= 1:
        return order
    room = slice_sizes(len(nodeids), parts)
    slices: list[list[int]] = [[] for _ in range(parts)]
    load = [0.0] * parts
    for i in order:
        k = min((k for k in range(parts) if len(slices[k]) < room[k]), key=lambda k: (load[k], k))
        slices[k].append(i)
        load[k] += est[i]
    return [i for part in slices for i in part]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("jax_aiter").addoption(
        OPTION, action="store_true", default=False,
        help="run the tests that took longest in earlier runs first (durations kept in the pytest cache); "
             "evens out xdist workers")


def _wanted(config: pytest.Config) -> bool:
    return bool(config.getoption(OPTION) and getattr(config, "cache", None) is not None
                and not config.getoption("failedfirst", False) and not config.getoption("newfirst", False))


def _recorded(config: pytest.Config) -> dict[str, float]:
    data = config.cache.get(CACHE_KEY, {})
    if not isinstance(data, dict):
        return {}
    return {k: float(v) for k, v in data.items() if isinstance(k, str) and isinstance(v, (int, float)) and v >= 0}


class _Recorder:
    """On the process that sees every report: adds up each test's phases, merges them into the cache."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.before = _recorded(config)
        self.seconds: dict[str, float] = {}

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node) -> None:  # xdist controller, once per worker
        node.workerinput[CACHE_KEY] = self.before
        # A worker's own config says dist "no"; only the controller knows the scheduler.
        worksteal = self.config.getoption("dist", "no") == "worksteal"
        node.workerinput[SLICES_KEY] = node.workerinput.get("workercount", 1) if worksteal else 1

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.outcome != "rerun":  # a retried attempt is not the test's usual duration
            self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration

    def pytest_report_header(self, config: pytest.Config) -> str:
        if not self.before:
            return f"{OPTION}: no durations recorded yet, collection order this run"
        return f"{OPTION}: {len(self.before)} recorded durations; a test without one counts as their mean"

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.seconds:
            merged = {**_recorded(self.config), **{k: round(v, 4) for k, v in self.seconds.items()}}
            self.config.cache.set(CACHE_KEY, merged)


RECORDER = "jax_aiter_longest_first_recorder"


def pytest_configure(config: pytest.Config) -> None:
    if _wanted(config) and not hasattr(config, "workerinput"):
        config.pluginmanager.register(_Recorder(config), RECORDER)


def pytest_report_header(config: pytest.Config) -> str | None:
    if not config.getoption(OPTION) or _wanted(config):
        return None  # off, or on and the recorder says what it knows
    why = "--ff/--nf order this run" if getattr(config, "cache", None) is not None else \
        "the pytest cache is off (-p no:cacheprovider), so no durations are kept"
    return f"{OPTION}: not applied, {why}"


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    if not _wanted(config):
        return
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        seconds = workerinput.get(CACHE_KEY, {})
        parts = workerinput.get(SLICES_KEY, 1)
    else:
        seconds, parts = config.pluginmanager.get_plugin(RECORDER).before, 1
    order = longest_first([it.nodeid for it in items], seconds, parts)
    items[:] = [items[i] for i in order]
