"""GPU kernel benchmark: jax-aiter's kernels against XLA (and cuDNN for attention).

    python3 -m benchmarks.gpu.bench_gpu [--quick] [--reps N] [--out build/bench/gpu.json]

Timing is device-side: CUDA/HIP events recorded on XLA's own stream by a small
FFI library (timer.cu, built here with the project's flags) bracket each
kernel. Every case is warmed up, then repeated many times inside one compiled
program with ours and the anchor alternating and the inputs rotated among
several sets larger than L2; the figure is the median. Copy bandwidth is
measured in the same run (a device-to-device memcpy) and is the ceiling for
the memory-bound ops. Prints a table and writes JSON.

Sections (--only, repeatable): copy; memory (RMSNorm, fused-add RMSNorm and
SiLU-and-mul over hidden sizes 4096-8192 and 1k-32k rows, against XLA); chain
(the same ops 8 times back to back in one program, as a model's layers run
them); decode (seq_q = 1 against a long grouped-query KV cache: K/V bytes read
per second against copy bandwidth, with cuDNN and XLA, and what the kernel's TMA loads and cluster merge gain:
its time with each turned off over its time); attention (prefill
forward and backward against cuDNN and FlashAttention-3, 1k to 32k tokens; bench_attention.py; --head-dim picks
the head dims); features (issue 56's
attention features through the public API against our dense kernel and cuDNN: packed documents, sliding
windows, softcap, ALiBi, odd head dims, the deterministic backward; bench_attn_features.py); serving (the paged
KV cache: paged decode against copy bandwidth, our dense decode and FlashAttention-3's paged decode, FP8 KV, paged
prefill against varlen, the FP8 forward against bf16; bench_serving.py); model (a
Llama-like decoder built from our ops against the same model in plain JAX, cuDNN attention:
prefill, train step, decode; model_bench.py, llama.py; and a server loop, continuous batching of 64 requests over
our paged KV cache against plain JAX's dense padded cache: serve_bench.py, serve_loop.py). The JSON records the
GPU's provenance before and after the run (nvidia-smi: driver, clocks, power limit, ECC, other processes on the
device), so two runs can be compared honestly.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from unittest import mock

import jax
import jax.numpy as jnp

import jax_aiter as ja
from benchmarks.gpu import bench_attention, bench_attn_features, bench_serving, model_bench, serve_bench
from benchmarks.gpu.gpu_provenance import build_provenance, gpu_provenance
from benchmarks.gpu.gpu_timing import (
    FLUSH,
    FLUSH_BYTES,
    GPU_AHEAD_CYCLES,
    SPIN,
    build_timer,
    compile_refusal,
    median,
    memcpy,
    n_sets,
    rand,
    time_cases,
)
from benchmarks.gpu.llama import (
    plain_rms_norm as xla_rms_norm,  # XLA's fusions: the anchors
)
from benchmarks.gpu.llama import plain_rms_norm_add as xla_rms_norm_add
from benchmarks.gpu.llama import plain_silu_and_mul as xla_silu_and_mul
from jatools import atomic_write, config
from jax_aiter import settings
from jax_aiter.ops import _small

ROOT = Path(__file__).resolve().parents[2]


def bench_copy(lib, reps):
    x_sets = [(rand((1 << 29,), jnp.bfloat16, s),) for s in range(2)]  # 1 GiB each
    t = time_cases(lib, {"memcpy": memcpy}, x_sets, reps)
    nbytes = 2 * x_sets[0][0].nbytes
    ms = median(t["memcpy"])
    return {"name": "copy_bandwidth", "bytes": nbytes, "ms": ms, "GBps": nbytes / ms / 1e6}


# Hidden sizes of common models (4096: Llama-7B/8B, 5120: 13B/Qwen-14B, 7168: 34B-class and
# DeepSeek-V3, 8192: 70B) and rows (tokens in flight) from 1k to 32k.
MEM_HIDDEN = (4096, 5120, 7168, 8192)
MEM_ROWS = (1024, 4096, 8192, 16384, 32768)
# The same op 8 times back to back inside one program, as a model's layers run it:
# each call's output is the next one's input, with an optimization barrier between
# calls where a model has its matmuls (without it XLA fuses its 8 row-local RMSNorms
# into one kernel that reads the rows once, which no model can do).
CHAIN = 8
CHAIN_SHAPES = ((8192, 4096), (8192, 5120), (16384, 8192), (32768, 7168))
MEM_GOAL = 0.90


def bench_memory_bound(lib, reps, copy_gbps, quick, shapes=None):
    rows = []
    shapes = shapes or ([(8192, 4096)] if quick else [(r, h) for h in MEM_HIDDEN for r in MEM_ROWS])
    dt = jnp.bfloat16
    for (r, h) in shapes:
        size = r * h * 2
        k = n_sets(3 * size)
        w = rand((h,), dt, 99)
        sets = [(rand((r, h), dt, s), rand((r, h), dt, 100 + s)) for s in range(k)]
        # "copy": memcpy of the same bytes the op must move (its input read, its output written),
        # the ceiling at this size, where ramp-up and tail make a copy slower than the large one.
        specs = [
            ("rms_norm", {"ours": lambda x, res: ja.rms_norm(x, w),  # noqa: B023 (called in this iteration)
                          "xla": lambda x, res: xla_rms_norm(x, w),  # noqa: B023
                          "copy": lambda x, res: memcpy(x)}, 2 * size + h * 2),
            ("rms_norm_with_add", {"ours": lambda x, res: ja.rms_norm_with_add(x, res, w),  # noqa: B023
                                   "xla": lambda x, res: xla_rms_norm_add(x, res, w),  # noqa: B023
                                   "copy": lambda x, res: (memcpy(x), memcpy(res))}, 4 * size + h * 2),
        ]
        for name, cases, nbytes in specs:
            t = time_cases(lib, cases, sets, reps)
            rows.append(_mem_row(name, (r, h), nbytes, t, copy_gbps))
        del sets
        # the same-size copy moves 3 * size bytes too: a memcpy of r x 1.5 h elements (read and written)
        xs = [(rand((r, 2 * h), dt, 200 + s), rand((r, 3 * h // 2), dt, 400 + s)) for s in range(n_sets(3 * size))]
        t = time_cases(lib, {"ours": lambda x, y: ja.silu_and_mul(x), "xla": lambda x, y: xla_silu_and_mul(x),
                             "copy": lambda x, y: memcpy(y)}, xs, reps)
        rows.append(_mem_row("silu_and_mul", (r, 2 * h), 3 * size, t, copy_gbps))
        del xs
    return rows


def bench_chains(lib, reps, copy_gbps, quick):
    """RMSNorm and fused-add RMSNorm, CHAIN calls back to back in one program, ours against XLA's."""
    rows = []
    dt = jnp.bfloat16
    for (r, h) in ([(8192, 4096)] if quick else CHAIN_SHAPES):
        size = r * h * 2
        w = rand((h,), dt, 98)
        sets = [(rand((r, h), dt, s), rand((r, h), dt, 300 + s)) for s in range(n_sets(3 * size))]

        barrier = jax.lax.optimization_barrier

        def chain(f):
            def run(x, res):
                for _ in range(CHAIN):
                    x = barrier(f(x, w))  # noqa: B023 (run is called in this iteration)
                return x
            return run

        def chain_add(f):
            def run(x, res):
                for _ in range(CHAIN):
                    x, res = barrier(f(x, res, w))  # noqa: B023
                return x, res
            return run

        def copies(n):
            def run(x, res):
                for _ in range(CHAIN):
                    x = barrier(memcpy(x))  # noqa: B023
                    if n == 2:
                        res = barrier(memcpy(res))  # noqa: B023
                return x, res
            return run

        for name, ours, xla, per_call, n_copy in (
                ("rms_norm", chain(ja.rms_norm), chain(xla_rms_norm), 2 * size + h * 2, 1),
                ("rms_norm_with_add", chain_add(ja.rms_norm_with_add), chain_add(xla_rms_norm_add),
                 4 * size + h * 2, 2)):
            t = time_cases(lib, {"ours": ours, "xla": xla, "copy": copies(n_copy)}, sets, max(5, reps // 3))
            row = _mem_row(f"{name} x{CHAIN}", (r, h), CHAIN * per_call, t, copy_gbps)
            row["chain"] = CHAIN
            rows.append(row)
    return rows


def _mem_row(name, shape, nbytes, t, copy_gbps):
    ours, xla = median(t["ours"]), median(t["xla"])
    gbps = nbytes / ours / 1e6
    same = {"same_size_copy_ms": median(t["copy"]), "frac_of_same_size_copy": median(t["copy"]) / ours} \
        if "copy" in t else {}
    return {"name": name, "shape": list(shape), "dtype": "bfloat16", "bytes": nbytes, "ours_ms": ours,
            "xla_ms": xla, "ours_GBps": gbps, "xla_GBps": nbytes / xla / 1e6, "frac_of_copy": gbps / copy_gbps,
            "xla_frac_of_copy": nbytes / xla / 1e6 / copy_gbps, "speedup_vs_xla": xla / ours, **same,
            "goal": f">= {MEM_GOAL} of copy bandwidth and never slower than XLA",
            "met": gbps / copy_gbps >= MEM_GOAL and ours <= xla,
            "spread_ms": [min(t["ours"]), max(t["ours"])]}


# Decode: one query token per sequence against a long KV cache, grouped-query heads.
DECODE_CASES = ((8, 32, 8, 8192), (8, 32, 8, 32768), (8, 32, 4, 8192), (8, 32, 4, 32768))
DECODE_GOAL = 0.70
# The split-KV decode kernel's sub-paths on sm_90, each timed off as well (the switch is read at every launch, so
# each runs as its own timed program): what each gains is (time with it off) / (time with it on), per case.
DECODE_SUBPATHS = {"cp_async": "JA_MHA_FWD_DECODE_TMA", "merge_kernel": "JA_MHA_FWD_DECODE_CLUSTER"}


def bench_decode(lib, reps, copy_gbps, quick):
    """seq_q = 1 against seq_k keys: K/V bytes read per second against copy bandwidth, with XLA and cuDNN."""
    rows = []
    d = 128
    for (b, hq, hkv, sk) in (DECODE_CASES[:1] if quick else DECODE_CASES):
        kv_bytes = 2 * b * sk * hkv * d * 2
        sets = [(rand((b, 1, hq, d), jnp.bfloat16, 50 + i), rand((b, sk, hkv, d), jnp.bfloat16, 60 + i),
                 rand((b, sk, hkv, d), jnp.bfloat16, 70 + i)) for i in range(n_sets(kv_bytes))]
        cases = {
            "ours": lambda q, k, v: ja.flash_attn_func(q, k, v),
            "cudnn": lambda q, k, v: jax.nn.dot_product_attention(q, k, v, implementation="cudnn"),
            "xla": lambda q, k, v: jax.nn.dot_product_attention(q, k, v, implementation="xla"),
        }
        refused = {}
        for name in ("cudnn", "xla"):
            why = compile_refusal(cases[name], *sets[0])
            if why:
                refused[name] = why
                cases.pop(name)
        t = time_cases(lib, cases, sets, reps)
        row = {"name": "decode", "batch": b, "heads_q": hq, "heads_kv": hkv, "seq_q": 1, "seq_k": sk, "head_dim": d,
               "kv_bytes": kv_bytes}
        for name, v in t.items():
            ms = median(v)
            row[f"{name}_ms"] = ms
            row[f"{name}_frac_of_copy"] = kv_bytes / ms / 1e6 / copy_gbps
        for name, env in DECODE_SUBPATHS.items():  # ours with one sub-path turned off
            with mock.patch.dict(os.environ, {env: "0"}):
                ms = median(time_cases(lib, {"ours": cases["ours"]}, sets, reps)["ours"])
            row[f"ours_{name}_ms"] = ms
            row[f"gain_of_{'tma' if name == 'cp_async' else 'cluster'}"] = ms / row["ours_ms"]
        row["refused"] = refused
        row["goal"] = f">= {DECODE_GOAL} of copy bandwidth on the K/V bytes read"
        row["met"] = row["ours_frac_of_copy"] >= DECODE_GOAL
        row["spread_ms"] = [min(t["ours"]), max(t["ours"])]
        rows.append(row)
    return rows


SECTIONS = ["copy", "memory", "chain", "decode", "attention", "features", "serving", "model"]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python3 -m benchmarks.gpu.bench_gpu", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="one size per op (a smoke run)")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--only", choices=SECTIONS, action="append")
    p.add_argument("--shape", action="append", default=[], metavar="ROWSxHIDDEN",
                   help="memory-bound shapes to run instead of the default grid (repeatable), e.g. 16384x8192")
    p.add_argument("--head-dim", type=int, action="append", choices=[32, 64, 96, 128, 256],
                   help="attention head dims (repeatable; default 64, 128 and 256, --quick: 128)")
    p.add_argument("--model-workload", action="append",
                   choices=[w.name for w in model_bench.WORKLOADS] + [w.name for w in serve_bench.SERVE],
                   help="model workloads to run (repeatable; default all, --quick: "
                        + ", ".join(model_bench.QUICK) + ")")
    p.add_argument("--model-swaps", action="store_true", help="also time plain JAX with one group of our ops "
                   "swapped in (attention, the norms, SiLU-and-mul): which op a model's difference comes from")
    p.add_argument("--warm-l2", action="store_true", help="no L2 flush before each timed case (the cases of a "
                   "repetition share inputs, so later ones may read them from L2)")
    p.add_argument("--gpu-ahead", action="store_true", help="a ~200 us GPU spin before each timed case, so host "
                   "launch latency cannot enter a case's time")
    p.add_argument("--out", type=Path, default=ROOT / config.build_path("bench") / "gpu.json")
    p.add_argument("--gate", action="store_true", help="then gate the JSON against the committed baseline of this "
                   "GPU model (ci/perf/bench_gate.py; exit 1 names each regression)")
    return p.parse_args(argv)


def run_sections(args: argparse.Namespace, lib, device_kind: str, save=lambda results: None) -> dict:
    """The JSON of one run: the machine, the copy bandwidth, and the rows of every section asked for. save(results)
    is called as each section ends ("partial": true until the last), so a run cut short keeps what it measured."""
    only = set(args.only or SECTIONS)
    shapes = [tuple(int(v) for v in sh.lower().split("x")) for sh in args.shape] or None
    start = time.time()
    provenance_before = gpu_provenance()
    copy = bench_copy(lib, args.reps)
    results = {"machine": {"device": device_kind, "jax": jax.__version__, "python": platform.python_version(),
                           "host": platform.node(), "xla_flags": os.environ.get("XLA_FLAGS", ""),
                           "model_kernel_min_bytes": settings.from_env(_small.SETTING),
                           "gpu_before": provenance_before, "build": build_provenance()},
               "l2_flush_bytes": FLUSH_BYTES if FLUSH["on"] else 0, "gpu_ahead_cycles": SPIN["cycles"],
               "reps": args.reps,
               "copy": copy, "memory_bound": [], "chains": [], "decode": [], "attention": [], "features": [],
               "serving": [], "model": [], "serve": [], "partial": True}

    def section(key, fn, *fn_args):
        results[key] = fn(*fn_args)
        results["seconds"] = round(time.time() - start, 1)
        save(results)

    # The memory and chain sections time the kernels, also at sizes where the ops would write their math in
    # jax.numpy for XLA (jax_aiter/ops/_small.py); the model section runs the ops as a user gets them.
    with mock.patch.dict(os.environ, {_small.SETTING: "0"}):
        if "memory" in only:
            section("memory_bound", bench_memory_bound, lib, args.reps, copy["GBps"], args.quick, shapes)
        if "chain" in only:
            section("chains", bench_chains, lib, args.reps, copy["GBps"], args.quick)
    if "decode" in only:
        section("decode", bench_decode, lib, args.reps, copy["GBps"], args.quick)
    if "attention" in only:
        def attention_so_far(rows):
            results["attention"] = list(rows)
            save(results)

        section("attention", partial(bench_attention.bench_attention, progress=attention_so_far), lib,
                max(5, args.reps // 3), args.quick, args.head_dim)
    if "features" in only:
        section("features", bench_attn_features.bench_features, lib, max(3, args.reps // 6))
    if "serving" in only:
        section("serving", bench_serving.bench_serving, lib, max(5, args.reps // 3), copy["GBps"], args.quick)
    if "model" in only:
        names = args.model_workload or (list(model_bench.QUICK) if args.quick else None)
        section("model", model_bench.bench_model, max(5, args.reps // 2), names, args.model_swaps)
        section("serve", serve_bench.bench_serve_all, max(3, args.reps // 10), names)
    results["partial"] = False
    results["seconds"] = round(time.time() - start, 1)
    results["machine"]["gpu_after"] = gpu_provenance()
    return results


def print_kernel_tables(results: dict) -> None:
    """The memory-bound, decode and attention tables of one run."""
    print(f"{'op':<20}{'shape':>14}{'ours ms':>10}{'xla ms':>10}{'GB/s':>8}{'of copy':>9}{'vs xla':>8}  met"
          f"  (of a same-size copy)")
    for r in results["memory_bound"] + results["chains"]:
        same = f"  ({r['frac_of_same_size_copy']:.2f})" if "frac_of_same_size_copy" in r else ""
        print(f"{r['name']:<20}{'x'.join(map(str, r['shape'])):>14}{r['ours_ms']:>10.4f}{r['xla_ms']:>10.4f}"
              f"{r['ours_GBps']:>8.0f}{r['frac_of_copy']:>9.2f}{r['speedup_vs_xla']:>8.2f}  "
              f"{str(r['met']):<5}{same}")  # noqa: RUF010
    if results["decode"]:
        print(f"{'decode b,hq,hkv,sk':<24}{'ours ms':>9}{'cudnn ms':>10}{'xla ms':>9}  of copy (K/V bytes): "
              f"{'ours':>5}{'cudnn':>7}{'xla':>6}  met")
    for r in results["decode"]:
        def f(key, fmt):
            return format(r[key], fmt) if key in r else "-"  # noqa: B023 (f is called in this iteration)
        case = ",".join(str(r[k]) for k in ("batch", "heads_q", "heads_kv", "seq_k"))
        print(f"{case:<24}{f('ours_ms', '.4f'):>9}"
              f"{f('cudnn_ms', '.4f'):>10}{f('xla_ms', '.4f'):>9}{'':22}{f('ours_frac_of_copy', '.2f'):>5}"
              f"{f('cudnn_frac_of_copy', '.2f'):>7}{f('xla_frac_of_copy', '.2f'):>6}  {r['met']}"
              f"  gain of TMA {f('gain_of_tma', '.3f')}, of the cluster merge {f('gain_of_cluster', '.3f')}")
        for k, why in r["refused"].items():
            print(f"    {k} not run: {why}")
    if results["attention"]:
        bench_attention.print_table(results["attention"])
    if results["serving"]:
        bench_serving.print_table(results["serving"])


def write_json(path: Path, results: dict) -> None:
    """The run's JSON, replaced whole (jatools.atomic_write): a reader never sees half of it."""
    atomic_write.write_text(path, json.dumps(results, indent=2) + "\n")


def main(argv=None) -> int:
    args = parse_args(argv)
    devs = jax.devices()
    if devs[0].platform not in ("gpu", "cuda", "rocm"):
        raise SystemExit(f"bench_gpu: JAX sees no GPU (devices: {devs}); run on a GPU host")
    lib = build_timer()
    FLUSH["on"] = not args.warm_l2
    SPIN["cycles"] = GPU_AHEAD_CYCLES if args.gpu_ahead else 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    results = run_sections(args, lib, devs[0].device_kind, save=partial(write_json, args.out))
    write_json(args.out, results)
    gpu = (results["machine"]["gpu_before"].get("gpus") or [{}])[0]
    before = results["machine"]["gpu_before"]
    print(f"\ndevice {results['machine']['device']}; copy bandwidth {results['copy']['GBps']:.0f} GB/s (memcpy, "
          f"read+write); driver {gpu.get('driver_version', '?')}, SM clock {gpu.get('clocks.sm', '?')}/"
          f"{gpu.get('clocks.max.sm', '?')} MHz, power limit {gpu.get('power.limit', '?')} W, "
          f"ECC {gpu.get('ecc.mode.current', '?')}, other processes on the GPU: "
          f"{before.get('other_processes', before.get('error', '?'))}")
    build = results["machine"]["build"]
    ident = build["identity"] or {}
    print(f"timed: kernel source {ident.get('kernel_source_revision', '?')[:12]}"
          f"{' (dirty tree)' if ident.get('kernel_source_dirty') else ''}, {json.dumps(ident.get('toolchain', '?'))}; "
          + ", ".join(f"{r['library']} {r['sha256'][:12]}" for r in build["libraries"] if "sha256" in r))
    print_kernel_tables(results)
    if results["features"]:
        bench_attn_features.print_table(results["features"])
    if results["model"]:
        model_bench.print_table(results["model"])
    if results["serve"]:
        serve_bench.print_table(results["serve"])
    print(f"JSON: {args.out}")
    if args.gate:
        return subprocess.call([sys.executable, "-m", "ci.perf.bench_gate", str(args.out)], cwd=ROOT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
