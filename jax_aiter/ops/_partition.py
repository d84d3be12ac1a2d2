"""Sharding rules: how XLA's partitioner splits each FFI call under jax.jit with NamedSharding inputs.

An XLA custom call is opaque to the partitioner: without a rule it gathers every
operand onto every device and runs the whole op there. Each op's FFI call is
therefore wrapped in ``jax.experimental.custom_partitioning`` (as JAX documents
for FFI calls, and as NVIDIA TransformerEngine's JAX extension does for its
fused attention and norms), with two parts:

- a Shardy sharding rule (einsum-like factors) that propagation reads: which
  dimensions of the operands and results are the same dimension, and which
  must not be sharded (``need_replication``: a norm's hidden size, the
  sequence and head_dim of attention);
- a partition callback that, given the shardings the partitioner proposes,
  returns the shardings the kernel runs with and the per-shard computation:
  the same FFI call on the shard's shapes. Dimensions the kernel cannot split
  locally are given back unsharded, so the partitioner reshards them
  explicitly (an all-gather the program shows) instead of the kernel
  computing a wrong value on a slice.

The per-op rules live with the ops (rmsnorm.py, activation.py, attention.py);
this module holds what they share. Inside a fully manual jax.shard_map and on
a single device JAX inlines the plain call, so the rule costs nothing there.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

# A spec callback: (static args..., mesh, arg_shapes) -> (arg specs, result specs, sums); each spec a tuple
# with one entry per dimension (a mesh axis name, a tuple of names, or None); sums maps a result's index to
# the mesh axes its per-shard values are partial sums over (psum-ed before they leave the shard).
Specs = Callable[..., tuple[Sequence[tuple], Sequence[tuple], dict[int, tuple[str, ...]]]]


def padded_spec(shape) -> tuple:
    """The PartitionSpec of a ShapeDtypeStruct the partitioner proposes, one entry per dimension.

    Without a mesh (an unnamed GSPMD sharding) nothing is known to be sharded, so every
    entry is None and the op runs replicated: correct, and the same as before the rule."""
    sharding = shape.sharding
    spec = tuple(sharding.spec) if isinstance(sharding, NamedSharding) else ()
    return spec + (None,) * (len(shape.shape) - len(spec))


def axis_names(entry) -> tuple[str, ...]:
    """The mesh axes of a spec entry (None, an axis name or a tuple of names)."""
    return () if entry is None else entry if isinstance(entry, tuple) else (entry,)


def axes_size(mesh, entry) -> int:
    """How many shards a spec entry splits a dimension into."""
    size = 1
    for name in axis_names(entry):
        size *= mesh.shape[name]
    return size


def partitioned(fn: Callable, rule: str | Callable, specs: Specs, n_static: int = 0, **rule_kwargs) -> Callable:
    """fn(*static, *arrays) as a custom_partitioning op. The first `n_static` arguments are compile-time
    constants; `rule` is the Shardy sharding rule (a string, or a callable of (*static, mesh, operand types,
    result types), as custom_partitioning takes it); `specs(*static, mesh, arg_shapes)` gives the specs of
    the arrays and results that the per-shard call runs with."""

    def call(*args):
        return fn(*args)

    op = custom_partitioning(call, static_argnums=tuple(range(n_static)))

    def partition(*args):
        *static, mesh, arg_shapes, result_shape = args
        arg_specs, out_specs, sums = specs(*static, mesh, arg_shapes)
        named = tuple(NamedSharding(mesh, P(*s)) for s in arg_specs)
        outs = tuple(NamedSharding(mesh, P(*s)) for s in out_specs)
        several = isinstance(result_shape, (tuple, list))

        def per_shard(*xs):
            out = fn(*static, *xs)
            if not sums:
                return out
            return tuple(jax.lax.psum(o, sums[i]) if i in sums else o for i, o in enumerate(out))

        return mesh, per_shard, outs if several else outs[0], named

    op.def_partition(partition=partition, sharding_rule=rule, **rule_kwargs)
    return op
