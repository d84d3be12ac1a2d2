"""The pytest plugin of every test run (tests/conftest.py loads it; the tiers name it with -p too).

Four parts, each described at its section below:
- device guards: the one place that skips tests the visible hardware cannot run;
- GPU slots: each xdist worker takes a GPU slot before JAX is imported, warms the
  CUDA driver up in the background, and ends without JAX's teardown;
- the run report: retried tests, each failure classified, GPU tests run per device;
- longest first: with --longest-first, the tests that took longest last time start first.

Nothing here imports JAX at start-up (it is imported only when a marked test is set
up): an xdist worker must take its GPU slot before JAX starts, and tooling tests run
without it. Only the standard library and our stdlib-only modules are imported, so
the plugin loads fast in every worker.
"""
from __future__ import annotations

import ctypes
import functools
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from jatools import atomic_write
from jatools.testing import gpu_slots, tiers
from jax_aiter import settings

# --- device guards -----------------------------------------------------------------------------
# Markers (registered in pyproject.toml): ``gpu`` needs a GPU JAX can see; ``cuda_only`` /
# ``rocm_only`` need that GPU platform; ``multigpu(devices=N)`` needs N devices (default 2).
# Each skip prints its reason (``-ra``).

MULTIGPU_DEFAULT_DEVICES = 2
FORCE_CPU_DEVICES_HINT = ("on the CPU run `JA_TEST_TIER=multigpu bash ci/test.sh` (it sets "
                          "XLA_FLAGS=--xla_force_host_platform_device_count=4 before JAX starts)")
DEVICE_MARKERS = ("gpu", "cuda_only", "rocm_only", "multigpu")


def required_devices(item: pytest.Item) -> int | None:
    """N from @pytest.mark.multigpu(devices=N), or None for a test without the marker."""
    mark = item.get_closest_marker("multigpu")
    if mark is None:
        return None
    n = mark.kwargs.get("devices", mark.args[0] if mark.args else MULTIGPU_DEFAULT_DEVICES)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise pytest.UsageError(f"{item.nodeid}: multigpu(devices=...) needs a positive int, got {n!r}")
    return n


@functools.cache
def _devices(platform: str | None) -> tuple[list, str]:
    """(devices, why-empty) for a JAX platform name (None: the default backend)."""
    try:
        import jax
    except ImportError as e:
        return [], f"JAX is not importable ({e})"
    try:
        return (jax.devices(platform) if platform else jax.devices()), ""
    except RuntimeError as e:
        return [], f"JAX has no {platform} backend (default backend: {jax.default_backend()}; {str(e).splitlines()[0]})"


def skip_reason(item: pytest.Item) -> str | None:
    """Why this test cannot run here, or None."""
    for marker, platform, label in (("gpu", "gpu", "a GPU"), ("cuda_only", "cuda", "a CUDA GPU"),
                                    ("rocm_only", "rocm", "a ROCm GPU")):
        if item.get_closest_marker(marker):
            devs, why = _devices(platform)
            if not devs:
                return f"{marker}: needs {label}; {why}"
    need = required_devices(item)
    if need is not None:
        devs, why = _devices(None)
        if len(devs) < need:
            seen = f"JAX sees {len(devs)} ({devs[0].platform})" if devs else why
            hint = f"; {FORCE_CPU_DEVICES_HINT}" if not devs or devs[0].platform == "cpu" else ""
            return f"multigpu: needs {need} devices, {seen}{hint}"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        required_devices(item)  # a malformed marker fails the run at collection, not at setup


def pytest_runtest_setup(item: pytest.Item) -> None:
    reason = skip_reason(item)
    if reason:
        # Reported at the test's location (as a skip marker is), not at this hook's line.
        raise pytest.skip.Exception(reason, _use_item_location=True)
    if any(item.get_closest_marker(m) for m in DEVICE_MARKERS):  # it runs on a device: the run report counts it
        item.user_properties.append((DEVICE_PROPERTY, device_label(dict(os.environ))))


# --- GPU slots ---------------------------------------------------------------------------------
# A worker (PYTEST_XDIST_WORKER set) takes the first free (gpu, slot) lock from
# jatools.testing.gpu_slots in pytest_configure, which runs before test modules are collected
# and so before JAX starts, and pins itself to that GPU through the environment. N workers thus
# spread over the GPUs, slot 0 on every GPU first. The lock is held until the worker exits.
# JA_GPU_SLOT=0 never pins (the multigpu tier runs unpinned and exclusive); JA_GPU_SLOT=1 pins a
# run without xdist too; a process pinned already (JA_GPU_SLOT=<gpu>:<slot>, set by
# ci/parallel_gpu_execute.py) is left alone. With JA_GPU_SLOT_RECORD_DIR each pinned process writes
# <worker>.json there (its slot, the devices JAX saw, when its first test started and its last one
# ended), which the slot speed-up measurement checks and splits its times by.
#
# A pinned worker also gets gpu_slots.pinned_env's process settings: no GPU memory preallocation
# and one BLAS thread (each unless already set). On CUDA it then starts the driver (cuInit) and its
# GPU's primary context in a background thread, overlapping JAX's import: about 0.3 s (H200 host)
# that used to sit between collection and the first test. The thread calls the driver through
# ctypes, which releases the GIL while the driver works; when JAX starts its backend it finds the
# driver up and retains the existing context. XLA creates that context with the flags
# TF_CUDA_PLATFORM_GPU_DEVICE_SCHEDULE names (none by default) and logs an error if it finds it
# active with others, so with that variable set only cuInit runs here. Failures are recorded,
# never raised (JAX reports a missing driver in its own words); the context is freed when the
# process ends. Not started on ROCm (not checked on AMD hardware) or with JA_GPU_WARMUP=0.
#
# A pinned xdist worker ends as soon as it has reported everything: at the end of its
# pytest_unconfigure (the last hook; xdist has had "workerfinished" before it) it flushes its
# output and log handlers and ends at once (os._exit). It does not wait for the controller to tell
# it to stop, and it skips the exit handlers (JAX's backend clean-up: destroying hundreds of loaded
# executables and the CUDA context), pytest's last clean-ups, execnet's shut-down and interpreter
# finalization: about a second, later half a second, that the controller used to wait for. The
# driver releases the same resources when the process ends. JA_WORKER_FAST_EXIT=0 keeps the full
# teardown (to look for leaks or errors at exit). xdist takes the results from the worker's
# messages, so a worker that ends after "workerfinished" is not a crash to it.

FAST_EXIT_ENV = "JA_WORKER_FAST_EXIT"
WARMUP_ENV = "JA_GPU_WARMUP"
SCHEDULE_ENV = "TF_CUDA_PLATFORM_GPU_DEVICE_SCHEDULE"  # XLA's context-flags switch
CUDA_DRIVER = "libcuda.so.1"

_held: gpu_slots.Slot | None = None
_tests = {"count": 0, "first_start": None, "last_end": None}  # wall clock (time.time), for the record
_warmup: dict = {}
_warmup_thread: threading.Thread | None = None


def _wants_slot(env: dict[str, str]) -> bool:
    switch = env.get(gpu_slots.SLOT_ENV, "")
    if switch == "0" or gpu_slots.held(env):
        return False
    return switch == "1" or bool(env.get("PYTEST_XDIST_WORKER"))


def _jax_backends_started() -> bool:
    """True once JAX has initialised a backend (reading the visible devices then).

    Importing JAX alone is harmless: some images' pytest plugins (jaxtyping, chex) import it at
    start-up, before this hook runs. JAX has no public way to ask without starting a backend, so
    this reads its backend table where it is.
    """
    bridge = sys.modules.get("jax._src.xla_bridge")
    return bool(getattr(bridge, "_backends", None))


def _warm(with_context: bool) -> None:
    start = time.monotonic()
    try:
        cuda = ctypes.CDLL(CUDA_DRIVER)
    except OSError as e:
        _warmup.update(error=str(e))
        return
    rc = cuda.cuInit(0)
    _warmup["cuInit"] = rc
    if rc == 0 and with_context:
        device, ctx = ctypes.c_int(), ctypes.c_void_p()
        rc = cuda.cuDeviceGet(ctypes.byref(device), 0)  # ordinal 0: the one GPU the slot shows
        _warmup["context"] = rc if rc else cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), device)
    _warmup["seconds"] = round(time.monotonic() - start, 3)


def start_warmup(platform: str, env: dict[str, str]) -> bool:
    """Start the CUDA warm-up thread for a process pinned to one GPU of `platform`; False if not wanted."""
    global _warmup_thread
    if _warmup_thread is not None or platform != "cuda" or env.get(WARMUP_ENV, "1") == "0":
        return False
    _warmup_thread = threading.Thread(target=_warm, args=(not env.get(SCHEDULE_ENV),), name="ja-cuda-warmup",
                                      daemon=True)
    _warmup_thread.start()
    return True


def warmup_result() -> dict | None:
    """What the warm-up did (driver return codes, seconds), once it has finished; None if it never started."""
    if _warmup_thread is None:
        return None
    return dict(_warmup) if not _warmup_thread.is_alive() else {"running": True}


def _take_gpu_slot(config: pytest.Config) -> None:
    global _held
    if not _wants_slot(dict(os.environ)):
        return
    try:
        gpus = gpu_slots.detect()
        per_gpu, timeout = gpu_slots.tests_per_gpu(), gpu_slots.timeout_from_env()
    except ValueError as e:  # a broken GPU probe, a bad pool or setting: say so, no traceback
        raise pytest.UsageError(f"{tiers.PLUGIN}: {e}") from None
    if gpus.count == 0:
        return  # nothing to pin; the gpu-marked tests skip with their reason
    if _jax_backends_started():
        raise pytest.UsageError(
            f"{tiers.PLUGIN}: JAX started its backends before this worker took its GPU slot, so "
            "the worker could see every GPU; create no arrays and query no devices in conftest.py or "
            "plugins")
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    try:
        _held = gpu_slots.acquire(gpus, per_gpu, timeout=timeout, note=f"pid {os.getpid()}: pytest worker {worker}")
    except (gpu_slots.SlotTimeout, gpu_slots.GpuSlotError) as e:
        raise pytest.UsageError(f"{tiers.PLUGIN} ({worker}): {e}") from e
    # pinned_env is this environment with the slot's settings applied (and what they
    # replace removed): make it this process's own, before anything imports JAX or NumPy.
    pinned = gpu_slots.pinned_env(_held, per_gpu)
    for key in set(os.environ) - set(pinned):
        del os.environ[key]
    os.environ.update(pinned)
    start_warmup(_held.platform, pinned)
    if "numpy" in sys.modules:
        config.issue_config_time_warning(pytest.PytestConfigWarning(
            f"{tiers.PLUGIN} ({worker}): NumPy was imported before this worker took its GPU slot, so "
            f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')} does not reach its BLAS; import "
            "NumPy inside tests or fixtures, not in conftest.py or plugins"), stacklevel=2)


def _record(worker: str) -> None:
    folder = os.environ.get(gpu_slots.RECORD_ENV)
    if not folder or _held is None:
        return
    rec = {"worker": worker, "pid": os.getpid(), "platform": _held.platform, "gpu": _held.gpu,
           "slot": _held.slot, "env": {k: os.environ.get(k) for k in
                                       ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")},
           "warmup": warmup_result(), "tests": dict(_tests)}
    if "jax" in sys.modules:  # only report what the tests already initialised
        jax = sys.modules["jax"]
        rec["jax_devices"] = [str(d) for d in jax.devices()]
    atomic_write.write_text(Path(folder) / f"{worker}.json", json.dumps(rec, indent=1))


def _end_now() -> None:
    """End the process at once: flush the log handlers and the output streams, then os._exit."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(0)


def pytest_runtest_logstart(nodeid: str, location: tuple) -> None:
    if _tests["first_start"] is None:
        _tests["first_start"] = time.time()


def pytest_runtest_logfinish(nodeid: str, location: tuple) -> None:
    _tests["count"] += 1
    _tests["last_end"] = time.time()


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    global _held
    if _held is not None:
        worker = os.environ.get("PYTEST_XDIST_WORKER")
        _record(worker or "main")
        _held.release()
        _held = None
        if worker and os.environ.get(FAST_EXIT_ENV, "1") != "0":
            _end_now()


# --- the run report ----------------------------------------------------------------------------
# Retries come from pytest-rerunfailures (``--reruns N``), which reports each failed attempt with
# outcome ``rerun``. The report collects those (on the xdist controller too) and makes sure a retry
# never hides a failure: a test that passed only after retries is listed as flaky, with each failed
# attempt's error, in a terminal section and in ``build/test-results/flaky.json`` (or JA_FLAKY_JSON).
# The JSON is written even when nothing was retried, so a reader can tell "no flakes" from "no report".
# Each final failure (and each collection error) is classified (tiers.classify) as infrastructure or
# a test failure; the JSON lists them with both counts. A test carrying a device marker that got past
# the device guards ran on a device: it is counted per device (the pinned GPU of its worker, else the
# devices the process was given), so the tier can fail a GPU host's run that ran none.

DEFAULT_REPORT = Path(settings.BY_NAME[tiers.REPORT_ENV].default)
DEVICE_PROPERTY = "ja_device"


def _short(report: pytest.TestReport) -> str:
    text = getattr(report, "longreprtext", "") or ""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    errors = [ln[1:].strip() for ln in lines if ln.startswith("E ")]
    return (errors[0] if errors else lines[-1] if lines else "")[:300]


def _worker(report: pytest.TestReport) -> str | None:
    """The xdist worker that ran the attempt (the controller tags reports with it)."""
    gateway = getattr(getattr(report, "node", None), "gateway", None)
    return getattr(gateway, "id", None)


def device_label(env: dict[str, str]) -> str:
    """The device(s) this process runs its tests on: its pinned GPU, else the pool it was given."""
    held = gpu_slots.held(env)
    if held:
        return f"gpu{held.split(':')[0]}"
    pool = env.get("ROCR_VISIBLE_DEVICES") or env.get("CUDA_VISIBLE_DEVICES")
    return f"gpus {pool}" if pool else "all visible"


class RunReport:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.attempts: dict[str, list[dict]] = {}
        self.outcome: dict[str, str] = {}
        self.failure: dict[str, dict] = {}   # nodeid -> its last failure, classified
        self.device: dict[str, str] = {}     # nodeid -> the device a device-marked test ran its body on
        self.collect_errors: list[dict] = []

    def _failure(self, report, collecting: bool = False) -> dict:
        text = getattr(report, "longreprtext", "") or str(getattr(report, "longrepr", "") or "")
        kind, reason = tiers.classify(text, collecting)
        return {"nodeid": report.nodeid, "when": getattr(report, "when", "collect"), "class": kind,
                "reason": reason, "error": _short(report)}

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.collect_errors.append(self._failure(report, collecting=True))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call":
            label = dict(report.user_properties).get(DEVICE_PROPERTY)
            if label:
                self.device[report.nodeid] = label
        if report.failed:
            self.failure[report.nodeid] = self._failure(report)
        if report.outcome == "rerun":
            self.attempts.setdefault(report.nodeid, []).append(
                {"when": report.when, "duration_s": round(report.duration, 3), "error": _short(report),
                 "worker": _worker(report)})
            self.outcome.pop(report.nodeid, None)
        elif report.failed or (report.when == "call" and report.nodeid not in self.outcome):
            self.outcome[report.nodeid] = "failed" if report.failed else report.outcome
        elif report.when == "setup" and report.skipped:
            self.outcome[report.nodeid] = "skipped"

    def result(self) -> dict:
        tests = []
        for nodeid, attempts in sorted(self.attempts.items()):
            final = self.outcome.get(nodeid, "unknown")
            tests.append({"nodeid": nodeid, "retries": len(attempts), "final": final,
                          "flaky": final == "passed", "attempts": attempts})
        reruns = getattr(self.config.option, "reruns", None)
        failures = [*self.collect_errors,
                    *(f for nodeid, f in sorted(self.failure.items()) if self.outcome.get(nodeid) == "failed")]
        per_device: dict[str, int] = {}
        for nodeid, label in self.device.items():
            if self.outcome.get(nodeid) in ("passed", "failed"):
                per_device[label] = per_device.get(label, 0) + 1
        return {"schema": 2, "retries_configured": reruns or 0,
                "retry_plugin": self.config.pluginmanager.hasplugin("rerunfailures"),
                "timeout_s": getattr(self.config.option, "timeout", None),
                "flaky": sum(t["flaky"] for t in tests), "failed_after_retries": sum(t["final"] == "failed" for t in tests),
                "tests": tests,
                "failure_counts": {k: sum(f["class"] == k for f in failures) for k in ("infrastructure", "test")},
                "failures": failures,
                "device_tests": dict(sorted(per_device.items()))}

    def pytest_terminal_summary(self, terminalreporter) -> None:
        res = self.result()
        tr = terminalreporter
        if res["failures"]:
            tr.section("failures by class (infrastructure: timeout, device, crash, collection, lock wait)", sep="=")
            for f in res["failures"]:
                tr.line(f"{f['class'].upper()} ({f['reason']}): {f['nodeid']}: {f['error']}")
            counts = res["failure_counts"]
            tr.line(f"{counts['infrastructure']} infrastructure, {counts['test']} test failure(s)")
        if not res["tests"]:
            return
        tr.section("retried tests (a pass after a retry is a flake, not a clean pass)", sep="=", yellow=True)
        for t in res["tests"]:
            label = "FLAKY (passed after retry)" if t["flaky"] else f"{t['final'].upper()} after retries"
            tr.line(f"{label}: {t['nodeid']} ({t['retries']} retr{'y' if t['retries'] == 1 else 'ies'})")
            for i, a in enumerate(t["attempts"], 1):
                tr.line(f"    attempt {i} failed in {a['when']}: {a['error']}")
        tr.line(f"{res['flaky']} flaky, {res['failed_after_retries']} failed after retries; "
                f"details in {self.path()}")

    def path(self) -> Path:
        p = Path(os.environ.get(tiers.REPORT_ENV) or DEFAULT_REPORT)
        return p if p.is_absolute() else Path(self.config.rootpath) / p

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        atomic_write.write_text(self.path(), json.dumps(self.result(), indent=1) + "\n")


# --- longest first -----------------------------------------------------------------------------
# With xdist the wall time is set by the worker that finishes last. Collection order can leave a
# long test for the end, so one worker runs it while the others sit idle. Started first, a long
# test overlaps with the other workers' short ones, and the short tests left at the end even the
# workers out (the scheduling rule called LPT, longest processing time first).
#
# Durations come from earlier runs. Each test's setup + call + teardown seconds are kept in pytest's
# cache (.pytest_cache, key jax_aiter/durations). The process that sees every report writes them: the
# xdist controller, or the one pytest process. A test with no recorded duration counts as the mean of
# the recorded ones. With nothing recorded yet, the collection order stands and the header says so.
#
# Under --dist worksteal, xdist first hands each of its N workers one contiguous slice of the
# collection (sizes len // N, ...), and an idle worker later steals the end of a busy one's queue.
# So the order is N slices, one per worker, each filled longest first with the next test going to
# the slice with the least time so far (LPT again): every worker starts with about the same work, its
# own long tests first, and what is left to steal at the end is short.
#
# Every worker must collect the same order, or xdist aborts the run. So the controller reads the
# cache once and hands the durations to each worker (xdist's workerinput), instead of each worker
# reading a file another run may be rewriting. --ff/--nf (failed or new first) win: with either, the
# order is left to them.

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


def _longest_first_wanted(config: pytest.Config) -> bool:
    return bool(config.getoption(OPTION) and getattr(config, "cache", None) is not None
                and not config.getoption("failedfirst", False) and not config.getoption("newfirst", False))


def _recorded(config: pytest.Config) -> dict[str, float]:
    data = config.cache.get(CACHE_KEY, {})
    if not isinstance(data, dict):
        return {}
    return {k: float(v) for k, v in data.items() if isinstance(k, str) and isinstance(v, (int, float)) and v >= 0}


class LongestFirst:
    """Orders the collection; on the process that sees every report, also records each test's duration."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        workerinput = getattr(config, "workerinput", None)
        self.records = workerinput is None  # an xdist worker orders by what the controller hands it
        self.before = _recorded(config) if self.records else workerinput.get(CACHE_KEY, {})
        self.parts = 1 if self.records else workerinput.get(SLICES_KEY, 1)
        self.seconds: dict[str, float] = {}

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node) -> None:  # xdist controller, once per worker
        node.workerinput[CACHE_KEY] = self.before
        # A worker's own config says dist "no"; only the controller knows the scheduler.
        worksteal = self.config.getoption("dist", "no") == "worksteal"
        node.workerinput[SLICES_KEY] = node.workerinput.get("workercount", 1) if worksteal else 1

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        order = longest_first([it.nodeid for it in items], self.before, self.parts)
        items[:] = [items[i] for i in order]

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if self.records and report.outcome != "rerun":  # a retried attempt is not the test's usual duration
            self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration

    def pytest_report_header(self, config: pytest.Config) -> str | None:
        if not self.records:
            return None
        if not self.before:
            return f"{OPTION}: no durations recorded yet, collection order this run"
        return f"{OPTION}: {len(self.before)} recorded durations; a test without one counts as their mean"

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.seconds:
            merged = {**_recorded(self.config), **{k: round(v, 4) for k, v in self.seconds.items()}}
            self.config.cache.set(CACHE_KEY, merged)


# --- the hooks every part shares ---------------------------------------------------------------

def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("jax_aiter").addoption(
        OPTION, action="store_true", default=False,
        help="run the tests that took longest in earlier runs first (durations kept in the pytest cache); "
             "evens out xdist workers")


def pytest_configure(config: pytest.Config) -> None:
    _take_gpu_slot(config)  # first: before anything can import JAX
    if not hasattr(config, "workerinput"):  # an xdist worker's reports reach the controller, which writes them
        config.pluginmanager.register(RunReport(config), "ja_run_report")
    if _longest_first_wanted(config):
        config.pluginmanager.register(LongestFirst(config), "ja_longest_first")


def pytest_report_header(config: pytest.Config) -> str | None:
    if not config.getoption(OPTION) or _longest_first_wanted(config):
        return None  # off, or on and LongestFirst says what it knows
    why = "--ff/--nf order this run" if getattr(config, "cache", None) is not None else \
        "the pytest cache is off (-p no:cacheprovider), so no durations are kept"
    return f"{OPTION}: not applied, {why}"
