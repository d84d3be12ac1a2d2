"""pytest plugin: the run's report: retried tests, each failure classified, GPU tests run per device.

Retries come from pytest-rerunfailures (``--reruns N``), which reports each
failed attempt with outcome ``rerun``. This plugin collects those reports (on
the xdist controller too) and makes sure a retry never hides a failure: a test
that passed only after retries is listed as flaky, with each failed attempt's
error, in a terminal section and in ``build/test-results/flaky.json`` (or
JA_FLAKY_JSON). The JSON is written even when nothing was retried, so a
reader can tell "no flakes" from "no report".

Each final failure (and each collection error) is classified, after XLA's
analyze_bep_infra_errors, as infrastructure (timeout, device lost or out of
memory, worker crash, collection/import error, GPU lock wait exceeded) or a
test failure (``classify``); the JSON lists them with both counts.

A test carrying ``gpu``, ``cuda_only``, ``rocm_only`` or ``multigpu`` that got past the
device guards (jatools.testing.pytest_guards) ran on a device: it is counted per
device (the pinned GPU of its worker, else the devices the process was given), so
jatools.testing.test_tiers can fail a GPU host's run that ran none.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from jatools import atomic_write
from jatools.testing import gpu_slots

JSON_ENV = "JA_FLAKY_JSON"
DEFAULT_JSON = Path("build") / "test-results" / "flaky.json"


def _short(report: pytest.TestReport) -> str:
    text = getattr(report, "longreprtext", "") or ""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    errors = [ln[1:].strip() for ln in lines if ln.startswith("E ")]
    return (errors[0] if errors else lines[-1] if lines else "")[:300]


def _worker(report: pytest.TestReport) -> str | None:
    """The xdist worker that ran the attempt (the controller tags reports with it)."""
    gateway = getattr(getattr(report, "node", None), "gateway", None)
    return getattr(gateway, "id", None)


DEVICE_MARKERS = ("gpu", "cuda_only", "rocm_only", "multigpu")
DEVICE_PROPERTY = "ja_device"
# (reason, pattern in the failure text), first match wins; no match: a test failure.
INFRA_PATTERNS = (
    ("timeout", re.compile(r"Timeout \(>[0-9.]+s\) from pytest-timeout|Failed: Timeout >[0-9.]+s")),
    ("lock wait exceeded", re.compile(r"no free GPU slot after|could not take every GPU slot")),
    ("worker crash", re.compile(r"worker '?gw\d+'? crashed|node down: Not properly terminated|"
                                r"Fatal Python error: (?:Segmentation fault|Aborted)")),
    ("device lost or out of memory", re.compile(
        r"RESOURCE_EXHAUSTED|[Oo]ut of memory|OUT_OF_MEMORY|hipErrorOutOfMemory|DEVICE_LOST|[Dd]evice (?:is )?lost|"
        r"fallen off the bus|hipErrorNoDevice|CUDA_ERROR_NO_DEVICE|no CUDA-capable device|"
        r"uncorrectable ECC|CUDA_ERROR_ECC_UNCORRECTABLE")),
)
COLLECTION = "collection/import error"


def classify(text: str, collecting: bool = False) -> tuple[str, str]:
    """(infrastructure | test, reason) for a failure's text; a collection error is infrastructure."""
    for reason, pattern in INFRA_PATTERNS:
        if pattern.search(text):
            return "infrastructure", reason
    return ("infrastructure", COLLECTION) if collecting else ("test", "test failure")


def device_label(env: dict[str, str]) -> str:
    """The device(s) this process runs its tests on: its pinned GPU, else the pool it was given."""
    held = env.get(gpu_slots.HELD_ENV)
    if held:
        return f"gpu{held.split(':')[0]}"
    pool = env.get("ROCR_VISIBLE_DEVICES") or env.get("CUDA_VISIBLE_DEVICES")
    return f"gpus {pool}" if pool else "all visible"


@pytest.hookimpl(trylast=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # trylast: runs only when the device guards let the test through (a skip raises before this).
    if any(item.get_closest_marker(m) for m in DEVICE_MARKERS):
        item.user_properties.append((DEVICE_PROPERTY, device_label(dict(os.environ))))


class FlakyReport:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.attempts: dict[str, list[dict]] = {}
        self.outcome: dict[str, str] = {}
        self.failure: dict[str, dict] = {}   # nodeid -> its last failure, classified
        self.device: dict[str, str] = {}     # nodeid -> the device a device-marked test ran its body on
        self.collect_errors: list[dict] = []

    def _failure(self, report, collecting: bool = False) -> dict:
        text = getattr(report, "longreprtext", "") or str(getattr(report, "longrepr", "") or "")
        kind, reason = classify(text, collecting)
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
        p = Path(os.environ.get(JSON_ENV) or DEFAULT_JSON)
        return p if p.is_absolute() else Path(self.config.rootpath) / p

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        atomic_write.write_text(self.path(), json.dumps(self.result(), indent=1) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return  # xdist worker: the controller sees every report and writes the result
    config.pluginmanager.register(FlakyReport(config), "ja_flaky_report")
