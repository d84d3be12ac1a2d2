"""Bounded retry for commands that touch the network (package installs, asset fetches, image pushes).

CI wraps only its fetch steps in this, as XLA's CI retries its dependency-fetching
dry run before the real build: a transient registry or download failure costs a
short wait instead of a red run, while a real failure still fails after a fixed,
small number of attempts. Commands that cannot start (exit 126/127) or were
interrupted (130) are not retried: waiting cannot fix them.

    python3 -m jatools.ci.retry [--attempts 3] [--delay 10] -- COMMAND [ARG...]
"""
from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

MAX_ATTEMPTS = 10
NOT_RETRYABLE = {126: "not executable", 127: "command not found", 130: "interrupted"}


def run_with_retry(argv: Sequence[str], attempts: int = 3, delay_s: float = 10.0, backoff: float = 2.0,
                   run: Callable[[Sequence[str]], int] | None = None,
                   sleep: Callable[[float], None] | None = None,
                   log: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True)) -> int:
    """Run argv up to `attempts` times, waiting delay_s * backoff**k between tries; return the last exit code."""
    if not argv:
        raise ValueError("no command given to retry")
    if not 1 <= attempts <= MAX_ATTEMPTS:
        raise ValueError(f"attempts must be 1..{MAX_ATTEMPTS}, got {attempts}")
    run = run or (lambda a: subprocess.call(list(a)))
    sleep = sleep or time.sleep
    text = shlex.join(argv)
    rc = 0
    for attempt in range(1, attempts + 1):
        try:
            rc = run(argv)
        except FileNotFoundError:
            rc = 127
        if rc == 0:
            if attempt > 1:
                log(f"retry: `{text}` succeeded on attempt {attempt}/{attempts}")
            return 0
        if rc in NOT_RETRYABLE:
            log(f"retry: `{text}` exited {rc} ({NOT_RETRYABLE[rc]}); not retrying")
            return rc
        if attempt < attempts:
            wait = delay_s * backoff ** (attempt - 1)
            log(f"retry: `{text}` exited {rc} on attempt {attempt}/{attempts}; retrying in {wait:.0f} s")
            sleep(wait)
    log(f"retry: `{text}` failed {attempts} times (last exit {rc}); giving up")
    return rc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m jatools.ci.retry", description=__doc__.splitlines()[0])
    p.add_argument("--attempts", type=int, default=3, help=f"tries in all (1..{MAX_ATTEMPTS}, default 3)")
    p.add_argument("--delay", type=float, default=10.0, help="seconds before the second try; doubles after")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = p.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    try:
        return run_with_retry(cmd, args.attempts, args.delay)
    except ValueError as e:
        p.error(str(e))
    return 2


if __name__ == "__main__":
    sys.exit(main())
