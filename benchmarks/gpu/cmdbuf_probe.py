"""Does XLA put our FFI calls into command buffers (CUDA graphs)?

    python3 -m benchmarks.gpu.cmdbuf_probe            # XLA's default command buffers
    XLA_FLAGS=--xla_gpu_enable_command_buffer= python3 -m benchmarks.gpu.cmdbuf_probe   # none

Times one jitted program of CHAIN RMSNorm calls on a tiny input (each kernel a few microseconds,
so launch cost dominates) three ways: the rmsnorm handler registered as jax_aiter registers it
(the traits the handler itself declares, csrc/ffi/gpu_handler_traits.h), the same handler
registered again with COMMAND_BUFFER_COMPATIBLE passed explicitly at registration, and XLA's own
RMSNorm fusions (optimization barriers keep them apart). A call inside a command buffer replays
from the graph; one outside it is launched by the host, so with command buffers on the first
two agree only if XLA took the handler's own declaration.
"""
from __future__ import annotations

import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jaxlib import xla_client

from jax_aiter import _loader

CHAIN = 64


def chain(call):
    def run(x, w):
        for _ in range(CHAIN):
            x = jax.lax.optimization_barrier(call(x, w))
        return x
    return jax.jit(run)


def ffi(target):
    return lambda x, w: jax.ffi.ffi_call(target, jax.ShapeDtypeStruct(x.shape, x.dtype))(x, w, eps=np.float32(1e-6))


def xla(x, w):
    xf = x.astype(jnp.float32)
    return (xf * jax.lax.rsqrt(jnp.mean(xf * xf, -1, keepdims=True) + 1e-6) * w.astype(jnp.float32)).astype(x.dtype)


def per_call_us(fn, x, w, runs=50) -> float:
    fn(x, w).block_until_ready()
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(runs):
            y = fn(x, w)
        y.block_until_ready()
        samples.append((time.perf_counter() - t0) / runs / CHAIN * 1e6)
    return statistics.median(samples)


def main() -> int:
    _loader.ensure_registered("rmsnorm_fwd")
    shim = _loader._load(_loader.find_library(_loader.OPS["rmsnorm_fwd"].shim))
    jax.ffi.register_ffi_target("probe_rmsnorm_explicit", jax.ffi.pycapsule(shim.JaRmsNormFwdGpu), platform="CUDA",
                                traits=xla_client.CustomCallTargetTraits.COMMAND_BUFFER_COMPATIBLE)
    x = jnp.ones((8, 4096), jnp.bfloat16)
    w = jnp.ones((4096,), jnp.bfloat16)
    for name, call in (("as registered", ffi("ja_rmsnorm_fwd")), ("explicit trait", ffi("probe_rmsnorm_explicit")),
                       ("xla fusion", xla)):
        print(f"cmdbuf_probe: {name:<16} {per_call_us(chain(call), x, w):7.2f} us per call", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
