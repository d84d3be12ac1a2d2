"""Byte progress for long transfers: a live bar on a terminal, a few plain lines in CI logs.

rich draws the bar when it is installed and stderr is a terminal (and CI is
unset); otherwise each task logs at 0, 25, 50, 75 and 100 %.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Callable


class Progress:
    """Per-file progress: a rich bar on a terminal, a few plain lines in logs."""

    def __init__(self, enabled: bool | None, log: Callable[[str], None]):
        """enabled: False for none, True or None (the default) for a bar on a terminal, lines elsewhere."""
        self._log = log
        self._rich = None
        self._enabled = enabled is not False
        if self._enabled and sys.stderr.isatty() and not os.environ.get("CI"):
            try:
                from rich import progress as rp
            except ImportError:
                return
            self._rich = rp.Progress(rp.TextColumn("{task.description}"), rp.BarColumn(), rp.DownloadColumn(),
                                     rp.TransferSpeedColumn(), transient=False)

    def __enter__(self):
        if self._rich is not None:
            self._rich.start()
        return self

    def __exit__(self, *exc):
        if self._rich is not None:
            self._rich.stop()

    def task(self, label: str, total: int) -> Callable[[int], None]:
        if not self._enabled:
            return lambda n: None
        if self._rich is not None:
            tid = self._rich.add_task(label, total=total)
            return lambda n: self._rich.update(tid, advance=n)
        state = {"done": 0, "next": 0}

        def advance(n: int) -> None:
            state["done"] += n
            pct = 100 * state["done"] // max(total, 1)
            if pct >= state["next"]:
                self._log(f"  {label}: {pct}% ({state['done'] / 1e6:.1f} of {total / 1e6:.1f} MB)")
                state["next"] = (pct // 25 + 1) * 25
        return advance
