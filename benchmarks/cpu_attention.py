#!/usr/bin/env python3
"""CPU timing of jax_aiter.flash_attn_func against jax.nn.dot_product_attention.

Both sides get the same inputs and are jitted; each is warmed up, then timed
`--repeats` times (wall clock, results blocked on), and the median is
reported, for the forward and for forward + backward (the VJP of a weighted
sum, so all three gradients are computed). Prints a table and writes the raw
numbers to build/bench/cpu_attention.json (atomically).

    python benchmarks/cpu_attention.py [--batch 2 --seq 1024 --heads 8 --head-dim 128]
        [--dtypes float32,bfloat16] [--causal] [--repeats 5] [--out FILE]

Needs a CPU build of the libraries (`JA_BACKEND=cpu make && ... build_jit.py && make ja_mods`).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jax_aiter  # noqa: E402


def timed(fn, args, warmup: int, repeats: int) -> list[float]:
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return times


def implementations(causal: bool) -> dict:
    return {
        "jax_aiter.flash_attn_func": lambda q, k, v: jax_aiter.flash_attn_func(q, k, v, causal=causal),
        "jax.nn.dot_product_attention": lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal),
    }


def fwd_bwd(attn):
    def run(q, k, v, w):
        out, vjp = jax.vjp(attn, q, k, v)
        return out, vjp(w)
    return run


def measure(args) -> list[dict]:
    rng = np.random.default_rng(0)
    shape = (args.batch, args.seq, args.heads, args.head_dim)
    rows = []
    for dtype in args.dtypes:
        q, k, v, w = (jnp.asarray(rng.standard_normal(shape, np.float32), dtype) for _ in range(4))
        outputs = {}
        for name, attn in implementations(args.causal).items():
            for phase, fn, fargs in (("forward", jax.jit(attn), (q, k, v)),
                                     ("forward+backward", jax.jit(fwd_bwd(attn)), (q, k, v, w))):
                times = timed(fn, fargs, args.warmup, args.repeats)
                if phase == "forward":
                    outputs[name] = np.asarray(fn(*fargs), np.float32)
                rows.append({"dtype": dtype, "impl": name, "phase": phase, "median_s": statistics.median(times),
                             "min_s": min(times), "times_s": times})
                print(f"  {dtype:<9} {phase:<17} {name:<29} {statistics.median(times) * 1e3:10.1f} ms", flush=True)
        ours, ref = outputs.values()
        diff = float(np.max(np.abs(ours - ref)) / max(np.max(np.abs(ref)), 1e-30))
        for r in rows:
            if r["dtype"] == dtype:
                r["max_rel_diff_vs_xla"] = diff
    return rows


def table(rows: list[dict]) -> str:
    lines = [f"{'dtype':<9} {'phase':<17} {'jax_aiter (ms)':>14} {'XLA (ms)':>10} {'XLA / ours':>10}"]
    keyed = {(r["dtype"], r["phase"], r["impl"]): r["median_s"] for r in rows}
    for dtype, phase in dict.fromkeys((r["dtype"], r["phase"]) for r in rows):
        ours = keyed[(dtype, phase, "jax_aiter.flash_attn_func")]
        xla = keyed[(dtype, phase, "jax.nn.dot_product_attention")]
        lines.append(f"{dtype:<9} {phase:<17} {ours * 1e3:14.1f} {xla * 1e3:10.1f} {xla / ours:10.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtypes", type=lambda s: s.split(","), default=["float32", "bfloat16"])
    p.add_argument("--causal", action="store_true")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", type=Path, default=ROOT / "build/bench/cpu_attention.json")
    args = p.parse_args(argv)
    print(f"cpu_attention: batch {args.batch}, seq {args.seq}, heads {args.heads}, head_dim {args.head_dim}, "
          f"causal {args.causal}, median of {args.repeats} after {args.warmup} warm-up; "
          f"{os.cpu_count()} CPUs, JA_NUM_THREADS={os.environ.get('JA_NUM_THREADS', 'unset')}", flush=True)
    rows = measure(args)
    print()
    print(table(rows))
    result = {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "environment": {"jax": jax.__version__, "cpus": os.cpu_count(), "machine": platform.machine(),
                        "processor": platform.processor(), "JA_NUM_THREADS": os.environ.get("JA_NUM_THREADS")},
        "results": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(args.out.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    os.replace(tmp, args.out)
    print(f"\nraw numbers: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
