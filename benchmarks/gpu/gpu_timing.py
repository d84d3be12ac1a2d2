"""Device-side timing for bench_gpu.py: CUDA/HIP events on XLA's stream around each case.

A small FFI library (timer.cu, built here with the project's flags) records events; case_program
builds one compiled program that runs every case `reps` times between its two events, with an L2
flush before each start event (FLUSH_BYTES) and, with --gpu-ahead, a GPU spin (SPIN); time_cases
runs it and reads the elapsed times. rand and n_sets make the rotated input sets.
"""
from __future__ import annotations

import ctypes
import statistics
import subprocess
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jatools import config
from jatools.bench.harness import BENCH_DIR

try:  # jatools/native/toolchain.py; trees from before the tooling's package split have jatools/toolchain.py
    from jatools.native import toolchain
except ImportError:  # pragma: no cover
    from jatools import toolchain

ROOT = Path(__file__).resolve().parents[2]

_slot = 0


def build_timer() -> ctypes.CDLL:
    settings = config.load()
    tc = toolchain.detect(settings)
    if tc.backend == "cpu":
        raise SystemExit("bench_gpu: no GPU toolchain (nvcc/hipcc) found; this benchmark needs a GPU host")
    flags = toolchain.compile_flags(tc, settings)
    out = ROOT / BENCH_DIR / "gpu_timer.so"
    out.parent.mkdir(parents=True, exist_ok=True)
    umbrella = settings.umbrella_dir  # the build tree's (JA_BUILD_DIR), where make links libjax_aiter.so
    cmd = [*flags["link"], *flags["gpu"], "-o", str(out), "benchmarks/gpu/timer.cu",
           f"-L{umbrella}", "-ljax_aiter", f"{flags['link_pass'][0]}-rpath={umbrella}"]
    stamp = out.with_suffix(".cmd")  # rebuilt when its source, the umbrella or the command changed
    inputs = [ROOT / "benchmarks/gpu/timer.cu", umbrella / "libjax_aiter.so"]
    fresh = (out.is_file() and stamp.is_file() and stamp.read_text() == " ".join(cmd)
             and all(p.is_file() and p.stat().st_mtime <= out.stat().st_mtime for p in inputs))
    if not fresh:
        subprocess.run(cmd, cwd=ROOT, check=True)
        stamp.write_text(" ".join(cmd))
    lib = ctypes.CDLL(str(out))
    lib.ja_bench_elapsed_ms.restype = ctypes.c_float
    lib.ja_bench_elapsed_ms.argtypes = [ctypes.c_int64, ctypes.c_int64]
    platform_name = {"cuda": "CUDA", "rocm": "ROCM"}[tc.backend]
    for target, sym in (("ja_bench_record", "JaBenchRecord"), ("ja_bench_copy", "JaBenchCopy"),
                        ("ja_bench_spin", "JaBenchSpin")):
        jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, sym)), platform=platform_name)
    return lib


def _record(token, deps, slot):
    return jax.ffi.ffi_call("ja_bench_record", jax.ShapeDtypeStruct((), jnp.int32), has_side_effect=True)(
        token, *deps, slot=np.int64(slot))


def spin(token, cycles):
    return jax.ffi.ffi_call("ja_bench_spin", jax.ShapeDtypeStruct((), jnp.int32), has_side_effect=True)(
        token, cycles=np.int64(cycles))


def memcpy(x):
    return jax.ffi.ffi_call("ja_bench_copy", jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


# L2 flush: before each timed case the program reads this many bytes (a sum over a
# float32 buffer, outside the events), so every case starts with its inputs out of L2
# (60 MB on an H200) and with no dirty lines to write back, whatever ran before it. Without
# it the cases of one repetition, which share an input set, could find the inputs of the
# case before them in L2 (--warm-l2 keeps that old behaviour).
FLUSH_BYTES = 256 << 20
FLUSH = {"on": True}  # bench_gpu.py's --warm-l2 turns it off
# --gpu-ahead: one GPU thread spins this many clock cycles (~200 us) before each start event, so the
# host has enqueued the case before the GPU reaches it: a case's time is then GPU time alone, with no
# host launch latency in it (at small shapes the two can differ).
SPIN = {"cycles": 0}  # bench_gpu.py's --gpu-ahead sets GPU_AHEAD_CYCLES
GPU_AHEAD_CYCLES = 400_000


def case_program(cases: dict, reps: int, base: int, flush: bool):
    """The timed program of time_cases: each case's run(tree) between two recorded events.

    The L2 flush (a sum over `scratch`) is a dep of the start event's record, so XLA keeps it
    and the stream runs it after the previous stop event and the case's prepare, and before
    the start event. (A flush whose result nothing uses is dead code to XLA: an earlier
    version passed it through an optimization barrier, and XLA dropped it.)
    """
    names = list(cases)

    def program(sets, scratch):
        token = jnp.zeros((), jnp.int32)
        for r in range(reps):
            for c, name in enumerate(names):
                prepare, run = cases[name] if isinstance(cases[name], tuple) else (lambda *a: a, None)
                fn = run or (lambda args, f=cases[name]: f(*args))
                tree, token = jax.lax.optimization_barrier((prepare(*sets[r % len(sets)]), token))
                deps = []
                if flush:  # after the previous stop event and the prepare (token), before this start event
                    buf, tree, token = jax.lax.optimization_barrier((scratch, tree, token))
                    deps = [jnp.sum(buf)]
                slot = base + 2 * (r * len(names) + c)
                if SPIN["cycles"]:
                    token = spin(token, SPIN["cycles"])
                token = _record(token, deps, slot)
                tree, token = jax.lax.optimization_barrier((tree, token))
                token = _record(token, jax.tree_util.tree_leaves(fn(tree)), slot + 1)
        return token

    return program


def time_cases(lib, cases: dict, input_sets: list, reps: int) -> dict[str, list[float]]:
    """Device times (ms) of each case, the cases alternating within each repetition.

    cases: name -> fn(*inputs), or name -> (prepare, run): prepare(*inputs)
    builds an untimed pytree (e.g. a forward pass and its vjp), run(tree) is timed.
    Each case starts with a cold L2 (FLUSH_BYTES read after the previous case's stop
    event and before its own start event) unless --warm-l2.
    """
    global _slot
    names = list(cases)
    base = _slot
    _slot += 2 * reps * len(names)
    flush = FLUSH["on"]
    program = case_program(cases, reps, base, flush)
    scratch = jnp.ones((FLUSH_BYTES // 4 if flush else 1,), jnp.float32)
    fn = jax.jit(program)
    fn(input_sets, scratch).block_until_ready()  # compile and warm up; the timed pass follows
    fn(input_sets, scratch).block_until_ready()
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(reps):
        for c, name in enumerate(names):
            slot = base + 2 * (r * len(names) + c)
            ms = lib.ja_bench_elapsed_ms(slot, slot + 1)
            if ms < 0:
                raise RuntimeError(f"event timing failed for {name}")
            times[name].append(ms)
    return times


def compile_refusal(f, *args) -> str | None:
    """None when jax.jit(f) compiles for args (an anchor takes the shape, a kernel is in the build), else the reason
    in one line: what a benchmark records for a case it leaves out."""
    try:
        jax.jit(f).lower(*args).compile()
        return None
    except Exception as e:  # noqa: BLE001 -- any refusal is recorded, the rest of the run goes on
        return f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"


def rand(shape, dtype, seed):
    return jax.device_put(jax.random.normal(jax.random.key(seed), shape, jnp.float32).astype(dtype))


def n_sets(bytes_per_set: int, l2: int = 60 << 20) -> int:
    return max(2, min(8, -(-3 * l2 // max(bytes_per_set, 1))))


def median(v):
    return statistics.median(v)
