"""One step of a model_bench workload, ours and plain JAX, inside a CUDA profiler range each.

    ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum --csv \\
        python3 benchmarks/gpu/model_profile.py "decode b8 kv32k" > kernels.csv

Each model is compiled and run twice untimed first; then cuProfilerStart, one step, cuProfilerStop,
so Nsight Compute sees exactly one step of each model (ours first, then plain), kernel by kernel:
where a model step's time goes that the host-timed benchmark only sees as a total.
"""
from __future__ import annotations

import ctypes
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import jax
import llama
import model_bench


def main(argv: list[str]) -> int:
    names = {w.name: w for w in model_bench.WORKLOADS}
    if len(argv) != 1 or argv[0] not in names:
        raise SystemExit(f"usage: model_profile.py WORKLOAD (one of: {', '.join(names)})")
    w = names[argv[0]]
    cuda = ctypes.CDLL("libcuda.so.1")
    impl, _ = model_bench.plain_attention(w)
    key = jax.random.key(0)
    params = llama.init_params(w.cfg, jax.random.fold_in(key, 7))
    for name, ops in (("ours", llama.our_ops()), ("plain", llama.plain_ops(impl))):
        step, state, _ = model_bench.build(w, ops, params, key)
        for _ in range(2):
            state = step(state)
        jax.block_until_ready(state)
        print(f"model_profile: {w.name}: {name} step in the profiler range", file=sys.stderr, flush=True)
        cuda.cuProfilerStart()
        jax.block_until_ready(step(state))
        cuda.cuProfilerStop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
