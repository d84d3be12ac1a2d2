"""Small inputs of the memory-bound ops go to XLA instead of the kernel.

A custom call is a fusion boundary and, inside XLA's command buffers, a launch of its own between
XLA's kernels. For a few rows (a decode step's tokens) RMSNorm, fused-add RMSNorm and SiLU-and-mul
take a couple of microseconds whichever code runs them, and what the call costs around the kernel
decides: measured on the H200 (docs/transformations.md, "Small inputs"), our kernels at 8 rows were
as fast as XLA's fusions or faster, and a Llama-like decode step still ran 0.6% (norms) and 0.3%
(SiLU-and-mul) slower with them than with XLA's fusions, from the launch gaps around each call.

So below JA_KERNEL_MIN_BYTES (bytes of x in one call: after vmap folded its batch into the rows,
per device under sharding) the ops write their math in jax.numpy, with the kernels' precision
(float32 inside, one rounding), and XLA fuses it with its neighbours. JA_KERNEL_MIN_BYTES=0 always
calls the kernel; the op tests, the clean-room smoke and the convergence recipe set it, so they
test the kernels at every size. A shape jax.export leaves symbolic always calls the kernel. The op's
libraries load and register on its first call whatever the size, so a broken install shows at once.
"""
from __future__ import annotations

import logging
import math

from jax_aiter import settings

log = logging.getLogger("jax_aiter")
SETTING = "JA_KERNEL_MIN_BYTES"


def limit() -> int:
    """JA_KERNEL_MIN_BYTES, read when an op is traced and passed down as a static argument, so a new value
    is a new trace (a jitted function already traced keeps the choice it made)."""
    return int(settings.from_env(SETTING))


def in_xla(op: str, x, limit: int) -> bool:
    """True when x is smaller than `limit` bytes, so `op` is written in jax.numpy; a symbolic shape never is."""
    if not all(isinstance(n, int) for n in x.shape):
        return False
    nbytes = math.prod(x.shape) * x.dtype.itemsize
    if nbytes >= limit:
        return False
    log.debug("%s: x %s %s is %d bytes, under %s=%d: written in jax.numpy for XLA to fuse, not the kernel",
              op, x.dtype, tuple(x.shape), nbytes, SETTING, limit)
    return True
