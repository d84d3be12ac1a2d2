"""The one step runner: every sequence of commands the tooling runs goes through `run`.

The CI driver's builds (ci/build.py), the release's stages (jatools.release), the native build and its
compile-only and sanitizer variants (jatools.native) and the clean room's steps (jatools.validate.cleanroom)
are lists of `Step`. `run` prints one progress line per step, times it, stops at the first failure with a
`StepFailed` that names the step, the command, its log and how to re-run just it, and returns a `Record`
per step, which the callers write into their JSON summaries.

Standard library only: ci/build.py runs before any virtual environment exists.
"""
from __future__ import annotations

import collections
import os
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

TAIL_LINES = 25  # of a logged step's output, kept for the failure message and the callers' reports


@dataclass(frozen=True)
class Step:
    """One command. `argv` (and `rerun`) may be callables: a command that depends on what earlier steps made."""

    name: str
    argv: Sequence[str] | Callable[[], Sequence[str]]
    env: Mapping[str, str] | None = None   # the whole environment (None: this process's)
    cwd: Path | None = None
    log: Path | None = None                # output to this file (else straight to the terminal)
    timeout: float | None = None           # seconds
    up_to_date: Callable[[], str | None] | None = None  # why nothing needs doing, or None
    artifacts: Callable[[], list[Path]] | None = None   # the files it made (asked after it passed)
    rerun: str | Callable[[], str] | None = None        # the command that re-runs just this step


@dataclass
class Record:
    """What happened to one step."""

    name: str
    result: str = "not run"  # ok | up-to-date | failed | not run
    command: str = ""
    exit: int | None = None  # None: not run, up to date, or stopped at its time limit
    seconds: float = 0.0
    note: str = ""
    rerun: str = ""
    log: str = ""
    tail: list[str] = field(default_factory=list)  # the last lines of a logged step's output
    artifacts: list[Path] = field(default_factory=list)


class StepFailed(RuntimeError):
    """A step failed. `record` is the failed step's, `records` every step's (the later ones not run)."""

    def __init__(self, message: str, record: Record, records: list[Record]):
        super().__init__(message)
        self.record, self.records = record, records


def _argv(step: Step) -> list[str]:
    return [str(a) for a in (step.argv() if callable(step.argv) else step.argv)]


def rerun_text(step: Step, command: str) -> str:
    """The command that re-runs just `step` from a shell: the variables it sets or changes, then `command`."""
    if step.rerun is not None:
        return step.rerun() if callable(step.rerun) else step.rerun
    changed = {k: v for k, v in (step.env or {}).items() if os.environ.get(k) != v}
    return " ".join([*(f"{k}={shlex.quote(v)}" for k, v in sorted(changed.items())), command])


def seconds(records: list[Record]) -> dict[str, float]:
    """Seconds per step that ran or was up to date, for a JSON summary."""
    return {r.name: r.seconds for r in records if r.result != "not run"}


def timing_line(records: list[Record]) -> str:
    """`umbrella 1.2 s, jit 30.0 s; total 31.2 s`: the one-line summary of a run."""
    times = seconds(records)
    return ", ".join(f"{k} {v:.1f} s" for k, v in times.items()) + f"; total {sum(times.values()):.1f} s"


def run(steps: Sequence[Step], label: str, *, echo: bool = True, groups: bool = False, dry_run: bool = False,
        progress: Callable[[str], None] | None = None) -> list[Record]:
    """Run `steps` in order; a Record per step. Stops at the first failure with StepFailed.

    `label` starts each progress line (`label: [name] $ command`); `progress` prints them (default: stdout).
    `echo`: a logged step's output is also shown, indented. `groups`: GitHub Actions log groups around each
    step. `dry_run`: print the progress lines only (a command that depends on earlier steps says so).
    """
    say = progress or (lambda line: print(line, flush=True))
    records = [Record(s.name) for s in steps]
    for step, rec in zip(steps, records):
        if dry_run:
            try:
                rec.command = shlex.join(_argv(step))
            except (OSError, KeyError, ValueError):
                rec.command = "(the command depends on what the earlier steps make)"
            say(f"{label}: [{step.name}] $ {rec.command}")
            continue
        start = time.monotonic()
        reason = step.up_to_date() if step.up_to_date else None
        if reason:
            rec.result, rec.note = "up-to-date", reason
            say(f"{label}: [{step.name}] up to date: {reason}")
        else:
            argv = _argv(step)
            rec.command = shlex.join(argv)
            say(f"::group::[{step.name}] {rec.command}" if groups else f"{label}: [{step.name}] $ {rec.command}")
            rec.result = "ok" if _execute(step, argv, rec, echo) else "failed"
            if groups:
                say("::endgroup::")
        rec.seconds = round(time.monotonic() - start, 2)
        rec.rerun = rerun_text(step, rec.command)
        if rec.result == "failed":
            raise StepFailed(_failure(label, rec), rec, records)
        rec.artifacts = [p for p in (step.artifacts() if step.artifacts else []) if p.is_file()]
    return records


def _failure(label: str, rec: Record) -> str:
    """The message of a failed step: what failed, its last lines, its log, how to re-run just it."""
    lines = [f"{label}: step {rec.name} failed ({rec.note}): {rec.command}"]
    if rec.tail:
        lines += ["  its last lines:", *(f"    {t}" for t in rec.tail)]
    if rec.log:
        lines.append(f"  full log: {rec.log}")
    lines.append(f"  re-run just this step: {rec.rerun}")
    return "\n".join(lines)


def _execute(step: Step, argv: list[str], rec: Record, echo: bool) -> bool:
    """Run the command into `rec` (exit code, note, log, tail); whether it passed."""
    env = None if step.env is None else dict(step.env)
    stopped = threading.Event()
    try:
        if step.log is None:
            try:
                rec.exit = subprocess.run(argv, cwd=step.cwd, env=env, check=False, timeout=step.timeout).returncode
            except subprocess.TimeoutExpired:
                stopped.set()
        else:
            rec.exit = _logged(step, argv, env, rec, echo, stopped)
    except OSError as e:  # no such program, or a working folder that is not there
        rec.note = f"could not start: {e}"
        return False
    if stopped.is_set():
        rec.exit, rec.note = None, f"did not finish within {step.timeout:g} s"
    elif rec.exit != 0:
        rec.note = f"exit {rec.exit}"
    return rec.exit == 0


def _logged(step: Step, argv: list[str], env: dict[str, str] | None, rec: Record, echo: bool,
            stopped: threading.Event) -> int:
    """The output to the step's log (and, with `echo`, indented to stdout); its last lines kept in `rec`."""
    step.log.parent.mkdir(parents=True, exist_ok=True)  # type: ignore[union-attr]
    rec.log = str(step.log)
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    with open(step.log, "w", encoding="utf-8") as log:  # type: ignore[arg-type]
        proc = subprocess.Popen(argv, cwd=step.cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace")
        timer = threading.Timer(step.timeout, lambda: (stopped.set(), proc.kill())) if step.timeout else None
        if timer:
            timer.start()
        try:
            for line in proc.stdout:  # type: ignore[union-attr]
                log.write(line)
                tail.append(line.rstrip("\n"))
                if echo:
                    sys.stdout.write(f"  {line}")
                    sys.stdout.flush()
            return proc.wait()
        finally:
            if timer:
                timer.cancel()
            rec.tail = list(tail)


def github_output(values: dict[str, str], path: str | None = None) -> None:
    """Append one `name=value` line per entry to `path` (default: $GITHUB_OUTPUT, a GitHub Actions step's
    outputs file); outside a workflow (the variable unset or empty) nothing is written."""
    target = path if path is not None else os.environ.get("GITHUB_OUTPUT")
    if target:
        with open(target, "a") as fh:
            fh.write("".join(f"{k}={v}\n" for k, v in values.items()))
