"""pytest plugin: list every retried test at the end of the run and in a JSON result.

Retries come from pytest-rerunfailures (``--reruns N``), which reports each
failed attempt with outcome ``rerun``. This plugin collects those reports (on
the xdist controller too) and makes sure a retry never hides a failure: a test
that passed only after retries is listed as flaky, with each failed attempt's
error, in a terminal section and in ``build/test-results/flaky.json`` (or
JA_FLAKY_JSON). The JSON is written even when nothing was retried, so a
reader can tell "no flakes" from "no report".
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from jatools import atomic_write

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


class FlakyReport:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.attempts: dict[str, list[dict]] = {}
        self.outcome: dict[str, str] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
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
        return {"schema": 1, "retries_configured": reruns or 0,
                "retry_plugin": self.config.pluginmanager.hasplugin("rerunfailures"),
                "flaky": sum(t["flaky"] for t in tests), "failed_after_retries": sum(t["final"] == "failed" for t in tests),
                "tests": tests}

    def pytest_terminal_summary(self, terminalreporter) -> None:
        res = self.result()
        if not res["tests"]:
            return
        tr = terminalreporter
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
