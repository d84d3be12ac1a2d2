"""One way to build every op's ffi_call, with optional output poisoning for tests.

With JA_POISON_OUTPUTS=1 (read at trace time) each output is first filled with
NaN (floats) and passed in as an input aliased to the output, so a kernel that
leaves an element unwritten shows NaN instead of a stale value that happens to
be right. Production calls never take this path.

Inside jax.shard_map the outputs get the inputs' varying manual axes (XLA FFI
calls are per-shard computations); JAX would otherwise type them as
replicated and transpose them wrongly, which gives wrong gradients.
"""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np

from jax_aiter.ops import _sharding


def poisoning() -> bool:
    return os.environ.get("JA_POISON_OUTPUTS", "") == "1"


def ffi_call(target: str, out_types, *args, aliases: dict[int, int] | None = None, **attrs):
    """The call of `target` on args. `aliases` {operand index: result index}: results written in place of those
    operands (append_kv's pools); they are never poisoned (they hold the operands' values)."""
    single = not isinstance(out_types, (tuple, list))
    outs = (out_types,) if single else tuple(out_types)
    aliases = dict(aliases or {})
    args = _sharding.vary_like(*args)
    if args and _sharding.varying_axes(args[0]):
        outs = tuple(_sharding.varying_like(o, args[0]) for o in outs)
    fresh = [i for i in range(len(outs)) if i not in aliases.values()]
    if poisoning() and fresh:
        poison = [jnp.full(outs[i].shape, jnp.nan if jnp.issubdtype(outs[i].dtype, jnp.floating) else -1,
                           outs[i].dtype) for i in fresh]
        poison = list(_sharding.vary_like(*args, *poison)[len(args):])
        aliases.update({len(args) + n: i for n, i in enumerate(fresh)})
        call = jax.ffi.ffi_call(target, outs, input_output_aliases=aliases)
        result = call(*args, *poison, **attrs)
    else:
        result = jax.ffi.ffi_call(target, outs, input_output_aliases=aliases or None)(*args, **attrs)
    return result[0] if single else tuple(result)


def f32(value: float) -> np.float32:
    return np.float32(value)
