"""The pytest plugin of every test run (tests/conftest.py loads it; the tiers name it with -p too).

Four parts, each described at its section below (and in docs/testing.md):
- device guards: the one place that skips tests the visible hardware cannot run;
- GPU slots: each xdist worker takes a GPU slot before JAX is imported, warms the
  CUDA driver up in the background, and ends without JAX's teardown;
- the run report: retried tests, each failure classified, GPU tests run per device;
- longest first: with --longest-first, the tests that took longest last time start first.

Imports only the standard library and our stdlib-only modules, so it loads fast in every worker;
JAX only when a marked test is set up (a worker takes its GPU slot before JAX starts).
"""
from __future__ import annotations

import collections
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
from jax_aiter.ops import _small

# --- device guards -----------------------------------------------------------------------------
# Markers (registered in pyproject.toml): ``gpu`` needs a GPU JAX can see; ``cuda_only`` /
# ``rocm_only`` need that GPU platform; ``multigpu(devices=N)`` needs N devices (default 2);
# ``gpu_memory(gib=N)`` needs N GiB of the first device's memory under XLA's allocator limit (a worker
# that shares its GPU has a fraction: GPU slots, below). Each skip prints its reason (``-ra``).

MULTIGPU_DEFAULT_DEVICES = 2
FORCE_CPU_DEVICES_HINT = ("on the CPU run `JA_TEST_TIER=multigpu bash ci/test.sh` (it sets "
                          "XLA_FLAGS=--xla_force_host_platform_device_count=4 before JAX starts)")
DEVICE_MARKERS = ("gpu", "cuda_only", "rocm_only", "multigpu")


def required_gib(item: pytest.Item) -> float | None:
    """N from @pytest.mark.gpu_memory(gib=N), or None for a test without the marker."""
    mark = item.get_closest_marker("gpu_memory")
    if mark is None:
        return None
    n = mark.kwargs.get("gib", mark.args[0] if mark.args else None)
    if isinstance(n, bool) or not isinstance(n, (int, float)) or not 0 < n < float("inf"):
        raise pytest.UsageError(f"{item.nodeid}: gpu_memory(gib=...) needs a positive number of GiB, got {n!r}")
    return float(n)


def memory_short(need_gib: float, limit_bytes: int | None, env: dict[str, str]) -> str | None:
    """Why a test that needs ``need_gib`` GiB cannot run under an allocator limit of ``limit_bytes`` (None: the
    device reports none, as the CPU does), or None when it can."""
    if limit_bytes is None or limit_bytes >= need_gib * 2**30:
        return None
    shared, fraction = gpu_slots.tests_per_gpu(env), env.get(gpu_slots.MEM_FRACTION_ENV)
    if shared > 1 and gpu_slots.held(env):
        why = (f"{gpu_slots.PER_GPU_ENV}={shared} gives each worker {gpu_slots.MEM_FRACTION_ENV}={fraction or '?'} "
               "of the GPU")
    elif fraction is not None:
        why = f"{gpu_slots.MEM_FRACTION_ENV}={fraction}"
    else:
        why = "the GPU has no more"
    return (f"gpu_memory: needs {need_gib:g} GiB of one GPU, XLA's allocator has {limit_bytes / 2**30:.1f} GiB "
            f"({why}); run it on a GPU of its own ({gpu_slots.PER_GPU_ENV}=1)")


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
    gib = required_gib(item)
    if gib is not None:
        devs, _ = _devices(None)
        stats = devs[0].memory_stats() if devs else None
        return memory_short(gib, (stats or {}).get("bytes_limit"), dict(os.environ))
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        required_devices(item)  # a malformed marker fails the run at collection, not at setup
        required_gib(item)


def pytest_runtest_setup(item: pytest.Item) -> None:
    reason = skip_reason(item)
    if reason:
        # Reported at the test's location (as a skip marker is), not at this hook's line.
        raise pytest.skip.Exception(reason, _use_item_location=True)
    if any(item.get_closest_marker(m) for m in DEVICE_MARKERS):  # it runs on a device: the run report counts it
        item.user_properties.append((DEVICE_PROPERTY, device_label(dict(os.environ))))


# --- GPU slots (docs/testing.md) ---------------------------------------------------------------
# An xdist worker (JA_GPU_SLOT=1: a run without xdist too; 0: never; <gpu>:<slot>: pinned already)
# takes a slot in pytest_configure, before JAX starts, and holds it until it exits; with
# JA_GPU_SLOT_RECORD_DIR it writes <worker>.json there (slot, devices JAX saw, test times). A pinned
# CUDA process starts the driver and its GPU's primary context in a background thread (only cuInit
# with TF_CUDA_PLATFORM_GPU_DEVICE_SCHEDULE set; none with JA_GPU_WARMUP=0); failures are recorded,
# never raised. A pinned xdist worker ends with os._exit once it has reported everything, skipping
# JAX's teardown and interpreter finalization (JA_WORKER_FAST_EXIT=0 keeps them).

FAST_EXIT_ENV = "JA_WORKER_FAST_EXIT"
WARMUP_ENV = "JA_GPU_WARMUP"
SCHEDULE_ENV = "TF_CUDA_PLATFORM_GPU_DEVICE_SCHEDULE"  # XLA's context-flags switch
CUDA_DRIVER = "libcuda.so.1"

_held: gpu_slots.Slot | None = None
_tests = {"count": 0, "first_start": None, "last_end": None}  # wall clock (time.time), for the record
_warmup: dict = {}
_warmup_thread: threading.Thread | None = None


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


def _take_gpu_slot(config: pytest.Config) -> None:
    global _held, _warmup_thread
    switch = os.environ.get(gpu_slots.SLOT_ENV, "")
    if switch == "0" or gpu_slots.held() or not (switch == "1" or os.environ.get("PYTEST_XDIST_WORKER")):
        return
    try:
        gpus = gpu_slots.detect()
        per_gpu, timeout = gpu_slots.tests_per_gpu(), gpu_slots.timeout_from_env()
    except ValueError as e:  # a broken GPU probe, a bad pool or setting: say so, no traceback
        raise pytest.UsageError(f"{tiers.PLUGIN}: {e}") from None
    if gpus.count == 0:
        return  # nothing to pin; the gpu-marked tests skip with their reason
    # Importing JAX is harmless (some images' plugins do it); a started backend has read the visible devices.
    # JAX has no public way to ask without starting one, so this reads its backend table.
    if getattr(sys.modules.get("jax._src.xla_bridge"), "_backends", None):
        raise pytest.UsageError(
            f"{tiers.PLUGIN}: JAX started its backends before this worker took its GPU slot, so "
            "the worker could see every GPU; create no arrays and query no devices in conftest.py or "
            "plugins")
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    try:
        _held = gpu_slots.acquire(gpus, per_gpu, timeout=timeout, note=f"pid {os.getpid()}: pytest worker {worker}")
    except (gpu_slots.SlotTimeout, gpu_slots.GpuSlotError) as e:
        raise pytest.UsageError(f"{tiers.PLUGIN} ({worker}): {e}") from e
    # Make pinned_env (this environment with the slot's settings) the process's own, before JAX or NumPy start.
    pinned = gpu_slots.pinned_env(_held, per_gpu)
    for key in set(os.environ) - set(pinned):
        del os.environ[key]
    os.environ.update(pinned)
    if _held.platform == "cuda" and pinned.get(WARMUP_ENV, "1") != "0":
        _warmup_thread = threading.Thread(target=_warm, args=(not pinned.get(SCHEDULE_ENV),), name="ja-cuda-warmup",
                                          daemon=True)
        _warmup_thread.start()
    if "numpy" in sys.modules:
        config.issue_config_time_warning(pytest.PytestConfigWarning(
            f"{tiers.PLUGIN} ({worker}): NumPy was imported before this worker took its GPU slot, so "
            f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')} does not reach its BLAS; import "
            "NumPy inside tests or fixtures, not in conftest.py or plugins"), stacklevel=2)


def pytest_runtest_logstart(nodeid: str, location: tuple) -> None:
    if _tests["first_start"] is None:
        _tests["first_start"] = time.time()


def pytest_runtest_logfinish(nodeid: str, location: tuple) -> None:
    _tests["count"] += 1
    _tests["last_end"] = time.time()


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    global _held
    if _held is None:
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if folder := os.environ.get(gpu_slots.RECORD_ENV):
        warm = None if _warmup_thread is None else {"running": True} if _warmup_thread.is_alive() else dict(_warmup)
        rec = {"worker": worker or "main", "pid": os.getpid(), "platform": _held.platform, "gpu": _held.gpu,
               "slot": _held.slot, "env": {k: os.environ.get(k) for k in
                                           ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")},
               "warmup": warm, "tests": dict(_tests)}
        if "jax" in sys.modules:  # only report what the tests already initialised
            rec["jax_devices"] = [str(d) for d in sys.modules["jax"].devices()]
        atomic_write.write_text(Path(folder) / f"{rec['worker']}.json", json.dumps(rec, indent=1))
    _held.release()
    _held = None
    if worker and os.environ.get(FAST_EXIT_ENV, "1") != "0":
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(0)


# --- the run report ----------------------------------------------------------------------------
# Written by the process that sees every report (the xdist controller too) to build/test-results/flaky.json
# or JA_FLAKY_JSON, even when nothing was retried: pytest-rerunfailures' retries (a pass after one is a
# flake, never a clean pass), each final failure classified (tiers.classify), device-marked tests that ran
# counted per device (the tier fails a GPU run that ran none).

DEFAULT_REPORT = Path(settings.BY_NAME[tiers.REPORT_ENV].default)
DEVICE_PROPERTY = "ja_device"


def _short(report: pytest.TestReport) -> str:
    lines = [ln for ln in (getattr(report, "longreprtext", "") or "").strip().splitlines() if ln.strip()]
    errors = [ln[1:].strip() for ln in lines if ln.startswith("E ")]
    return (errors[0] if errors else lines[-1] if lines else "")[:300]


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
        if report.when == "call" and (label := dict(report.user_properties).get(DEVICE_PROPERTY)):
            self.device[report.nodeid] = label
        if report.failed:
            self.failure[report.nodeid] = self._failure(report)
        if report.outcome == "rerun":
            worker = getattr(getattr(getattr(report, "node", None), "gateway", None), "id", None)  # xdist's tag
            self.attempts.setdefault(report.nodeid, []).append(
                {"when": report.when, "duration_s": round(report.duration, 3), "error": _short(report),
                 "worker": worker})
            self.outcome.pop(report.nodeid, None)
        elif report.failed or (report.when == "call" and report.nodeid not in self.outcome):
            self.outcome[report.nodeid] = "failed" if report.failed else report.outcome
        elif report.when == "setup" and report.skipped:
            self.outcome[report.nodeid] = "skipped"

    def result(self) -> dict:
        tests = [{"nodeid": nodeid, "retries": len(attempts), "final": self.outcome.get(nodeid, "unknown"),
                  "flaky": self.outcome.get(nodeid) == "passed", "attempts": attempts}
                 for nodeid, attempts in sorted(self.attempts.items())]
        failures = [*self.collect_errors,
                    *(f for nodeid, f in sorted(self.failure.items()) if self.outcome.get(nodeid) == "failed")]
        per_device = collections.Counter(label for nodeid, label in self.device.items()
                                         if self.outcome.get(nodeid) in ("passed", "failed"))
        return {"schema": 2, "retries_configured": getattr(self.config.option, "reruns", None) or 0,
                "retry_plugin": self.config.pluginmanager.hasplugin("rerunfailures"),
                "timeout_s": getattr(self.config.option, "timeout", None),
                "flaky": sum(t["flaky"] for t in tests),
                "failed_after_retries": sum(t["final"] == "failed" for t in tests), "tests": tests,
                "failure_counts": {k: sum(f["class"] == k for f in failures) for k in ("infrastructure", "test")},
                "failures": failures, "device_tests": dict(sorted(per_device.items()))}

    def pytest_terminal_summary(self, terminalreporter) -> None:
        res, tr = self.result(), terminalreporter
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


# --- longest first (docs/testing.md) -----------------------------------------------------------
# Each test's setup + call + teardown seconds are kept in pytest's cache (key jax_aiter/durations) by
# the process that sees every report. Every xdist worker must collect the same order (or xdist aborts),
# so the controller reads the cache once and hands the durations to each worker (workerinput).

OPTION = "--longest-first"
CACHE_KEY = "jax_aiter/durations"
SLICES_KEY = "jax_aiter/longest_first_slices"


def slice_sizes(n: int, parts: int) -> list[int]:
    """How xdist's worksteal scheduler first splits n tests over `parts` workers: n // parts each, the last
    n % parts one more."""
    return [n // parts + (i >= parts - n % parts) for i in range(parts)]


def longest_first(nodeids: list[str], seconds: dict[str, float], parts: int = 1) -> list[int]:
    """Indices of nodeids, longest recorded duration first (ties keep collection order; a test without one
    counts as the mean). parts > 1: `parts` consecutive slices (slice_sizes), each longest first, each test
    going to the slice with the least time so far (how xdist's worksteal first splits the collection)."""
    known = [seconds[n] for n in nodeids if n in seconds]
    if not known:
        return list(range(len(nodeids)))
    est = [seconds.get(n, sum(known) / len(known)) for n in nodeids]
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
    # The tests test the kernels at every size: small inputs would otherwise be written in jax.numpy
    # (jax_aiter/ops/_small.py). tests/ops/test_small_inputs.py sets its own values; subprocesses inherit this.
    os.environ[_small.SETTING] = "0"
    if not hasattr(config, "workerinput"):  # an xdist worker's reports reach the controller, which writes them
        config.pluginmanager.register(RunReport(config), "ja_run_report")
    if _longest_first_wanted(config):
        config.pluginmanager.register(LongestFirst(config), "ja_longest_first")


def pytest_report_header(config: pytest.Config) -> str | None:
    if not config.getoption(OPTION) or hasattr(config, "workerinput"):
        return None
    if _longest_first_wanted(config):
        before = config.pluginmanager.get_plugin("ja_longest_first").before
        return (f"{OPTION}: {len(before)} recorded durations; a test without one counts as their mean" if before
                else f"{OPTION}: no durations recorded yet, collection order this run")
    why = "--ff/--nf order this run" if getattr(config, "cache", None) is not None else \
        "the pytest cache is off (-p no:cacheprovider), so no durations are kept"
    return f"{OPTION}: not applied, {why}"
