"""CPU timing of jax_aiter.flash_attn_func against jax.nn.dot_product_attention.

Both sides get the same inputs and are jitted; each is warmed up, then timed
`--repeats` times in alternating rounds (wall clock with results blocked on,
and the process's CPU time), and the medians are reported, for the forward
and for forward + backward (the VJP with a random cotangent, so all three
gradients are computed). Prints a table and writes the raw numbers to
build/bench/cpu_attention.json (atomically).

    python3 -m benchmarks.cpu_attention [--batch 2 --seq 1024 --heads 8 --head-dim 128]
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

import jax
import jax.numpy as jnp
import numpy as np

import jax_aiter
from jatools import config

ROOT = Path(__file__).resolve().parents[1]


def timed(fns: dict, args, warmup: int, repeats: int) -> dict[str, list[tuple[float, float]]]:
    """(wall, process CPU) seconds per call for each fn; the fns take turns in every
    round, so load from other processes on a shared machine hits them alike."""
    for fn in fns.values():
        for _ in range(warmup):
            jax.block_until_ready(fn(*args))
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            c0, t0 = time.process_time(), time.perf_counter()
            jax.block_until_ready(fn(*args))
            samples[name].append((time.perf_counter() - t0, time.process_time() - c0))
    return samples


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
    impls = implementations(args.causal)
    rows = []
    for dtype in args.dtypes:
        q, k, v, w = (jnp.asarray(rng.standard_normal(shape, np.float32), dtype) for _ in range(4))
        outs = {name: np.asarray(attn(q, k, v), np.float32) for name, attn in impls.items()}
        ours, ref = outs.values()
        diff = float(np.max(np.abs(ours - ref)) / max(np.max(np.abs(ref)), 1e-30))
        for phase, make, fargs in (("forward", lambda f: f, (q, k, v)), ("forward+backward", fwd_bwd, (q, k, v, w))):
            fns = {name: jax.jit(make(attn)) for name, attn in impls.items()}
            for name, samples in timed(fns, fargs, args.warmup, args.repeats).items():
                wall, cpu = [s[0] for s in samples], [s[1] for s in samples]
                rows.append({"dtype": dtype, "impl": name, "phase": phase, "median_s": statistics.median(wall),
                             "min_s": min(wall), "median_cpu_s": statistics.median(cpu), "times_s": wall,
                             "cpu_times_s": cpu, "max_rel_diff_vs_xla": diff})
                print(f"  {dtype:<9} {phase:<17} {name:<29} {statistics.median(wall) * 1e3:10.1f} ms wall "
                      f"{statistics.median(cpu) * 1e3:10.1f} ms CPU", flush=True)
    return rows


def table(rows: list[dict]) -> str:
    head = (f"{'dtype':<9} {'phase':<17} {'jax_aiter ms':>12} {'XLA ms':>9} {'XLA/ours':>8}   "
            f"{'CPU-s ours':>10} {'CPU-s XLA':>9}")
    lines = [head, "-" * len(head)]
    keyed = {(r["dtype"], r["phase"], r["impl"]): r for r in rows}
    for dtype, phase in dict.fromkeys((r["dtype"], r["phase"]) for r in rows):
        ours = keyed[(dtype, phase, "jax_aiter.flash_attn_func")]
        xla = keyed[(dtype, phase, "jax.nn.dot_product_attention")]
        lines.append(f"{dtype:<9} {phase:<17} {ours['median_s'] * 1e3:12.1f} {xla['median_s'] * 1e3:9.1f} "
                     f"{xla['median_s'] / ours['median_s']:8.2f}   {ours['median_cpu_s']:10.3f} "
                     f"{xla['median_cpu_s']:9.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m benchmarks.cpu_attention", description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtypes", type=lambda s: s.split(","), default=["float32", "bfloat16"])
    p.add_argument("--causal", action="store_true")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", type=Path, default=ROOT / config.build_path("bench") / "cpu_attention.json")
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
