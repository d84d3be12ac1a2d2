"""verify: sha256 of the three libraries (page cache warm) by `invoke verify`'s code path
(jatools.jitlibs.jit_cache.verify) against `sha256sum` (what the reference's wheel script runs).

Goal: at least 8x faster than sha256sum, and at least 80% of (cores x the
single-core OpenSSL sha256 rate measured in the same run).
"""
from __future__ import annotations

import hashlib
import os
import time

from jatools.bench import records, tools
from jatools.bench.harness import Context, Result
from jatools.bench.timing import alternate
from jatools.jitlibs import jit_cache

GOAL = ">=8x sha256sum, >=80% of cores x 1-core rate"


def single_core_rate(seconds: float = 1.0) -> float:
    """Bytes per second of one core hashing with hashlib's sha256 (OpenSSL) from memory."""
    buf = os.urandom(64 << 20)
    h = hashlib.sha256()
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        h.update(buf)
        n += len(buf)
    return n / (time.perf_counter() - start)


def run(ctx: Context) -> Result:
    tools.require("sha256sum")
    c = ctx.corpus()
    folder = ctx.work("verify")
    paths = records.link_tree(c, folder)
    record = records.write_record(folder, c, {"cache_id": "bench"})
    want = {f["name"]: f["sha256"] for f in record["files"]}
    out = tools.run(["sha256sum", *map(str, paths)])  # warms the page cache and checks the anchor agrees
    got = {line.split()[1].rsplit("/", 1)[1]: line.split()[0] for line in out.stdout.splitlines()}
    if got != want:
        raise RuntimeError(f"sha256sum disagrees with the record: {got} vs {want}")
    rate_before = single_core_rate()
    t = alternate(lambda: jit_cache.verify(folder), lambda: tools.run(["sha256sum", *map(str, paths)]),
                  ctx.runs, ctx.warmup, log=ctx.log, label="verify")
    rate = (rate_before + single_core_rate()) / 2
    cores = os.cpu_count() or 1
    ours_rate = c.total_bytes / t.ours_s
    share = ours_rate / (cores * rate)
    # sha256 is sequential within a file: the largest file bounds the wall time on any number of cores
    bound = c.total_bytes / max(c.total_bytes / cores, max(c.files.values())) / cores
    speedup = t.anchor_s / t.ours_s
    met = speedup >= 8 and share >= 0.8
    short = []
    if speedup < 8:
        short.append(f"{speedup:.2f}x of the 8x goal: with {cores} cores and one file per thread the ceiling over a "
                     f"single-threaded sha256sum is about {cores * rate / (c.total_bytes / t.anchor_s):.2f}x "
                     f"(cores x the 1-core rate / sha256sum's rate)")
    if share < 0.8:
        short.append(f"{100 * share:.0f}% of cores x 1-core rate, goal 80%; per-file hashing bounds it at "
                     f"{100 * bound:.0f}% here (the largest file is one thread's work)")
    return Result("verify", t.ours_s, t.anchor_s, GOAL, met, c.total_bytes,
                  ours="jatools.jitlibs.jit_cache.verify(folder) (invoke verify)", anchor="sha256sum <3 files>",
                  shortfall="; ".join(short), runs={"ours": t.ours, "anchor": t.anchor},
                  extra={"single_core_sha256_Bps": rate, "ours_Bps": ours_rate,
                         "anchor_Bps": c.total_bytes / t.anchor_s, "share_of_cores_x_rate": share,
                         "ceiling_share": bound})
