"""One attention backward (or forward) per implementation, for a profiler: what Nsight Compute reads.

    ncu --clock-control none --kernel-name regex:'mha_bwd_sm90|FlashAttnBwd|cudnn' --section SpeedOfLight \\
        python3 -m benchmarks.gpu.profile_attention --impl ours fa3 --seq 16384 --batch 1 [--causal]

Each implementation's program is compiled and run once untimed (so compilation and autotuning stay out of what
the profiler sees first), then once more; a profiler that skips the first launches of each kernel
(--launch-skip) sees the second. The implementations are bench_attention.py's: ours (jax_aiter), cudnn
(jax.nn.dot_product_attention) and fa3 (flash_attn3_jax, skipped with the reason printed where it does not
import). Prints each run's wall time, which under a profiler means nothing.
"""
from __future__ import annotations

import argparse
import sys
import time

import jax
import jax.numpy as jnp

from benchmarks.gpu import bench_attention
from benchmarks.gpu.gpu_timing import rand


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m benchmarks.gpu.profile_attention", description=__doc__.splitlines()[0])
    p.add_argument("--impl", nargs="+", default=["ours"], choices=["ours", "cudnn", "fa3"])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=16384)
    p.add_argument("--heads", type=int, default=None, help="default: bench_attention.heads(head dim)")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--forward", action="store_true", help="profile the forward alone, not the backward")
    args = p.parse_args(argv)
    h = args.heads or bench_attention.heads(args.head_dim)
    shape = (args.batch, args.seq, h, args.head_dim)
    q, k, v, g = (rand(shape, jnp.bfloat16, i) for i in range(4))
    fa3_mod, why = bench_attention.fa3()
    fwds = bench_attention.forwards(args.causal, args.seq, fa3_mod)
    for name in args.impl:
        if name not in fwds:
            print(f"{name}: skipped ({why})")
            continue
        f = fwds[name]
        if args.forward:
            run = jax.jit(f)
            call = lambda: run(q, k, v)  # noqa: B023 (called in this iteration)
        else:
            _, vjp = jax.vjp(f, q, k, v)
            run = jax.jit(lambda vjp, g: vjp(g))
            call = lambda: run(vjp, g)  # noqa: B023
        jax.block_until_ready(call())
        start = time.perf_counter()
        jax.block_until_ready(call())
        print(f"{name}: {'forward' if args.forward else 'backward'} {shape} causal={args.causal} "
              f"ran in {1e3 * (time.perf_counter() - start):.2f} ms (wall clock, under the profiler)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
