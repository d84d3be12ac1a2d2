"""Bounded retry: real processes that fail, then succeed; no retry for commands that cannot start."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from jatools.ci import retry

ROOT = Path(__file__).resolve().parents[2]


def flaky_command(tmp_path: Path, failures: int) -> list[str]:
    """A real command that fails `failures` times (counting in a file), then succeeds."""
    counter = tmp_path / "count"
    code = (f"import pathlib,sys; p=pathlib.Path({str(counter)!r}); n=int(p.read_text()) if p.exists() else 0; "
            f"p.write_text(str(n+1)); sys.exit(3 if n < {failures} else 0)")
    return [sys.executable, "-c", code]


def test_succeeds_after_transient_failures(tmp_path: Path) -> None:
    waits: list[float] = []
    msgs: list[str] = []
    rc = retry.run_with_retry(flaky_command(tmp_path, 2), attempts=3, delay_s=1.0, sleep=waits.append, log=msgs.append)
    assert rc == 0
    assert waits == [1.0, 2.0]  # backoff doubles
    assert "succeeded on attempt 3/3" in msgs[-1]


def test_gives_up_after_the_bound(tmp_path: Path) -> None:
    msgs: list[str] = []
    rc = retry.run_with_retry(flaky_command(tmp_path, 10), attempts=2, delay_s=0, sleep=lambda s: None, log=msgs.append)
    assert rc == 3
    assert (tmp_path / "count").read_text() == "2"
    assert "failed 2 times (last exit 3)" in msgs[-1]


def test_missing_command_is_not_retried() -> None:
    msgs: list[str] = []
    rc = retry.run_with_retry(["/nonexistent/tool"], attempts=3, sleep=lambda s: pytest.fail("slept"), log=msgs.append)
    assert rc == 127 and "not retrying" in msgs[0]


def test_attempts_are_bounded() -> None:
    with pytest.raises(ValueError, match="attempts must be 1..10"):
        retry.run_with_retry(["true"], attempts=50)


def test_cli(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "jatools.ci.retry", "--attempts", "3", "--delay", "0", "--",
                          *flaky_command(tmp_path, 1)], check=False, cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "retrying in 0 s" in out.stderr
