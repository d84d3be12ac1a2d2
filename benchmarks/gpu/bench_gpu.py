"""GPU kernel benchmark: jax-aiter's kernels against XLA (and cuDNN for attention).

    python3 benchmarks/gpu/bench_gpu.py [--quick] [--reps N] [--out build/bench/gpu.json]

Timing is device-side: CUDA/HIP events recorded on XLA's own stream by a small
FFI library (timer.cu, built here with the project's flags) bracket each
kernel. Every case is warmed up, then repeated many times inside one compiled
program with ours and the anchor alternating and the inputs rotated among
several sets larger than L2; the figure is the median. Copy bandwidth is
measured in the same run (a device-to-device memcpy) and is the ceiling for
the memory-bound ops. Prints a table and writes JSON.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jax_aiter as ja  # noqa: E402
from jatools import config, toolchain  # noqa: E402

_slot = 0


def build_timer() -> ctypes.CDLL:
    settings = config.load()
    tc = toolchain.detect(settings)
    if tc.backend == "cpu":
        raise SystemExit("bench_gpu: no GPU toolchain (nvcc/hipcc) found; this benchmark needs a GPU host")
    flags = toolchain.compile_flags(tc, settings)
    out = ROOT / "build/bench/gpu_timer.so"
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [*flags["link"], *flags["gpu"], "-o", str(out), "benchmarks/gpu/timer.cu",
           "-Lbuild/jax_aiter_build", "-ljax_aiter", f"{flags['link_pass'][0]}-rpath={ROOT}/build/jax_aiter_build"]
    subprocess.run(cmd, cwd=ROOT, check=True)
    lib = ctypes.CDLL(str(out))
    lib.ja_bench_elapsed_ms.restype = ctypes.c_float
    lib.ja_bench_elapsed_ms.argtypes = [ctypes.c_int64, ctypes.c_int64]
    platform_name = {"cuda": "CUDA", "rocm": "ROCM"}[tc.backend]
    for target, sym in (("ja_bench_record", "JaBenchRecord"), ("ja_bench_copy", "JaBenchCopy")):
        jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, sym)), platform=platform_name)
    return lib


def _record(token, deps, slot):
    return jax.ffi.ffi_call("ja_bench_record", jax.ShapeDtypeStruct((), jnp.int32), has_side_effect=True)(
        token, *deps, slot=np.int64(slot))


def memcpy(x):
    return jax.ffi.ffi_call("ja_bench_copy", jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def time_cases(lib, cases: dict, input_sets: list, reps: int) -> dict[str, list[float]]:
    """Device times (ms) of each case, the cases alternating within each repetition.

    cases: name -> fn(*inputs), or name -> (prepare, run): prepare(*inputs)
    builds an untimed pytree (e.g. a forward pass and its vjp), run(tree) is timed.
    """
    global _slot
    names = list(cases)
    base = _slot
    _slot += 2 * reps * len(names)

    def program(sets):
        token = jnp.zeros((), jnp.int32)
        for r in range(reps):
            for c, name in enumerate(names):
                prepare, run = cases[name] if isinstance(cases[name], tuple) else (lambda *a: a, None)
                fn = run or (lambda args, f=cases[name]: f(*args))
                tree, token = jax.lax.optimization_barrier((prepare(*sets[r % len(sets)]), token))
                slot = base + 2 * (r * len(names) + c)
                token = _record(token, [], slot)
                tree, token = jax.lax.optimization_barrier((tree, token))
                token = _record(token, jax.tree_util.tree_leaves(fn(tree)), slot + 1)
        return token

    fn = jax.jit(program)
    fn(input_sets).block_until_ready()  # compile and warm up; the timed pass follows
    fn(input_sets).block_until_ready()
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(reps):
        for c, name in enumerate(names):
            slot = base + 2 * (r * len(names) + c)
            ms = lib.ja_bench_elapsed_ms(slot, slot + 1)
            if ms < 0:
                raise RuntimeError(f"event timing failed for {name}")
            times[name].append(ms)
    return times


def rand(shape, dtype, seed):
    return jax.device_put(jax.random.normal(jax.random.key(seed), shape, jnp.float32).astype(dtype))


def n_sets(bytes_per_set: int, l2: int = 60 << 20) -> int:
    return max(2, min(8, -(-3 * l2 // max(bytes_per_set, 1))))


def xla_rms_norm(x, w, eps=1e-6):
    xf = x.astype(jnp.float32)
    return (xf * jax.lax.rsqrt(jnp.mean(xf * xf, -1, keepdims=True) + eps) * w.astype(jnp.float32)).astype(x.dtype)


def xla_rms_norm_add(x, r, w, eps=1e-6):
    s = (x.astype(jnp.float32) + r.astype(jnp.float32)).astype(x.dtype)
    return xla_rms_norm(s, w, eps), s


def xla_silu_and_mul(x):
    a, b = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return (jax.nn.silu(a) * b).astype(x.dtype)


def median(v):
    return statistics.median(v)


def bench_copy(lib, reps):
    x_sets = [(rand((1 << 29,), jnp.bfloat16, s),) for s in range(2)]  # 1 GiB each
    t = time_cases(lib, {"memcpy": memcpy}, x_sets, reps)
    nbytes = 2 * x_sets[0][0].nbytes
    ms = median(t["memcpy"])
    return {"name": "copy_bandwidth", "bytes": nbytes, "ms": ms, "GBps": nbytes / ms / 1e6}


def bench_memory_bound(lib, reps, copy_gbps, quick):
    rows = []
    shapes = [(8192, 4096)] if quick else [(8192, 4096), (32768, 8192)]
    dt = jnp.bfloat16
    for (r, h) in shapes:
        size = r * h * 2
        k = n_sets(3 * size)
        w = rand((h,), dt, 99)
        sets = [(rand((r, h), dt, s), rand((r, h), dt, 100 + s)) for s in range(k)]
        # "copy": memcpy of the same bytes the op must move (its input read, its output written),
        # the ceiling at this size, where ramp-up and tail make a copy slower than the large one.
        specs = [
            ("rms_norm", {"ours": lambda x, res: ja.rms_norm(x, w), "xla": lambda x, res: xla_rms_norm(x, w),
                          "copy": lambda x, res: memcpy(x)}, 2 * size + h * 2),
            ("rms_norm_with_add", {"ours": lambda x, res: ja.rms_norm_with_add(x, res, w),
                                   "xla": lambda x, res: xla_rms_norm_add(x, res, w),
                                   "copy": lambda x, res: (memcpy(x), memcpy(res))}, 4 * size + h * 2),
        ]
        for name, cases, nbytes in specs:
            t = time_cases(lib, cases, sets, reps)
            rows.append(_mem_row(name, (r, h), nbytes, t, copy_gbps))
        xs = [(rand((r, 2 * h), dt, 200 + s),) for s in range(n_sets(3 * size))]
        t = time_cases(lib, {"ours": ja.silu_and_mul, "xla": xla_silu_and_mul}, xs, reps)
        rows.append(_mem_row("silu_and_mul", (r, 2 * h), 3 * size, t, copy_gbps))
    return rows


def _mem_row(name, shape, nbytes, t, copy_gbps):
    ours, xla = median(t["ours"]), median(t["xla"])
    gbps = nbytes / ours / 1e6
    same = {"same_size_copy_ms": median(t["copy"]), "frac_of_same_size_copy": median(t["copy"]) / ours} \
        if "copy" in t else {}
    return {"name": name, "shape": list(shape), "dtype": "bfloat16", "bytes": nbytes, "ours_ms": ours,
            "xla_ms": xla, "ours_GBps": gbps, "frac_of_copy": gbps / copy_gbps, "speedup_vs_xla": xla / ours, **same,
            "goal": ">= 0.85 of copy bandwidth and faster than XLA",
            "met": gbps / copy_gbps >= 0.85 and ours < xla,
            "spread_ms": [min(t["ours"]), max(t["ours"])]}


def attn_flops(b, h, s, d, causal):
    f = 4 * b * h * s * s * d
    return f / 2 if causal else f


def bench_attention(lib, reps, quick):
    rows = []
    b, h, d = 4, 32, 128
    seqs = [1024] if quick else [1024, 4096, 8192]
    for s in seqs:
        for causal in (False, True):
            sets = [tuple(rand((b, s, h, d), jnp.bfloat16, 10 * i + j) for j in range(3))
                    for i in range(n_sets(3 * b * s * h * d * 2))]
            fwd = {
                "ours": lambda q, k, v: ja.flash_attn_func(q, k, v, causal=causal),
                "cudnn": lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal,
                                                                      implementation="cudnn"),
                "xla": lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal,
                                                                    implementation="xla"),
            }
            if s > 4096:
                fwd.pop("xla")  # the XLA route materialises b*h*s*s scores: 8 GiB per call at 8192
            t = time_cases(lib, fwd, sets, reps)
            flops = attn_flops(b, h, s, d, causal)
            row = {"name": "flash_attn_fwd", "seq": s, "causal": causal,
                   **{f"{k}_ms": median(v) for k, v in t.items()},
                   **{f"{k}_TFLOPs": flops / median(v) / 1e9 for k, v in t.items()}}
            row["frac_of_cudnn"] = row["ours_TFLOPs"] / row["cudnn_TFLOPs"]
            row["met"] = row["frac_of_cudnn"] >= 0.5 and ("xla_ms" not in row or row["ours_ms"] < row["xla_ms"])
            rows.append(row)

            def bwd_case(f):
                # the forward runs untimed; only the backward (vjp) is inside the events
                prepare = lambda q, k, v, g: (jax.vjp(f, q, k, v)[1], g)  # noqa: E731
                return prepare, lambda tree: tree[0](tree[1])

            bsets = [(*st, rand((b, s, h, d), jnp.bfloat16, 777 + i)) for i, st in enumerate(sets)]
            bwd = {k: bwd_case(fwd[k]) for k in ("ours", "cudnn")}
            t2 = time_cases(lib, bwd, bsets, reps)
            row2 = {"name": "flash_attn_bwd", "seq": s, "causal": causal}
            for k in bwd:
                ms = median(t2[k])
                row2[f"{k}_ms"] = ms
                row2[f"{k}_TFLOPs"] = 2.5 * flops / ms / 1e9
            row2["frac_of_cudnn"] = row2["ours_TFLOPs"] / row2["cudnn_TFLOPs"]
            row2["met"] = row2["frac_of_cudnn"] >= 0.4
            rows.append(row2)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="one size per op (a smoke run)")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--only", choices=["copy", "memory", "attention"], action="append")
    p.add_argument("--out", type=Path, default=ROOT / "build/bench/gpu.json")
    args = p.parse_args(argv)
    devs = jax.devices()
    if devs[0].platform not in ("gpu", "cuda", "rocm"):
        raise SystemExit(f"bench_gpu: JAX sees no GPU (devices: {devs}); run on a GPU host")
    lib = build_timer()
    only = set(args.only or ["copy", "memory", "attention"])
    start = time.time()
    copy = bench_copy(lib, args.reps)
    results = {"machine": {"device": devs[0].device_kind, "jax": jax.__version__, "python": platform.python_version(),
                           "host": platform.node()},
               "copy": copy, "memory_bound": [], "attention": []}
    if "memory" in only:
        results["memory_bound"] = bench_memory_bound(lib, args.reps, copy["GBps"], args.quick)
    if "attention" in only:
        results["attention"] = bench_attention(lib, max(5, args.reps // 3), args.quick)
    results["seconds"] = round(time.time() - start, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\ndevice {results['machine']['device']}; copy bandwidth {copy['GBps']:.0f} GB/s (memcpy, read+write)")
    print(f"{'op':<20}{'shape':>14}{'ours ms':>10}{'xla ms':>10}{'GB/s':>8}{'of copy':>9}{'vs xla':>8}  met"
          f"  (of a same-size copy)")
    for r in results["memory_bound"]:
        same = f"  ({r['frac_of_same_size_copy']:.2f})" if "frac_of_same_size_copy" in r else ""
        print(f"{r['name']:<20}{'x'.join(map(str, r['shape'])):>14}{r['ours_ms']:>10.4f}{r['xla_ms']:>10.4f}"
              f"{r['ours_GBps']:>8.0f}{r['frac_of_copy']:>9.2f}{r['speedup_vs_xla']:>8.2f}  {str(r['met']):<5}{same}")
    print(f"{'attention':<16}{'seq':>6}{'causal':>7}{'ours TF/s':>11}{'cudnn TF/s':>11}{'xla TF/s':>10}{'of cudnn':>9}  met")
    for r in results["attention"]:
        xla = f"{r['xla_TFLOPs']:.1f}" if "xla_TFLOPs" in r else "-"
        print(f"{r['name']:<16}{r['seq']:>6}{str(r['causal']):>7}{r['ours_TFLOPs']:>11.1f}{r['cudnn_TFLOPs']:>11.1f}"
              f"{xla:>10}{r['frac_of_cudnn']:>9.2f}  {r['met']}")
    print(f"JSON: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
