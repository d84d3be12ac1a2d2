"""Timing: ours and the anchor alternate run by run, after a warm-up; the figure is the median.

Alternating puts both under the same background load (this machine is shared),
so a burst of load slows both rather than one.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

Step = Callable[[], object]


@dataclass
class Timings:
    ours: list[float] = field(default_factory=list)
    anchor: list[float] = field(default_factory=list)

    @property
    def ours_s(self) -> float:
        return statistics.median(self.ours)

    @property
    def anchor_s(self) -> float | None:
        return statistics.median(self.anchor) if self.anchor else None


def timed(fn: Step) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def alternate(ours: Step, anchor: Step | None, runs: int, warmup: int = 1,
              prepare: Step | None = None, log: Callable[[str], None] = print, label: str = "") -> Timings:
    """Time `ours` and `anchor` alternately `runs` times each after `warmup` untimed rounds.

    `prepare` (untimed) runs before every call of either, e.g. to remove the previous output.
    """
    t = Timings()
    for i in range(warmup + runs):
        for which, fn, out in (("ours", ours, t.ours), ("anchor", anchor, t.anchor)):
            if fn is None:
                continue
            if prepare is not None:
                prepare()
            took = timed(fn)
            if i >= warmup:
                out.append(took)
            log(f"bench: {label} {which} {'warm-up' if i < warmup else f'run {i - warmup + 1}/{runs}'}: {took:.2f} s")
    return t
