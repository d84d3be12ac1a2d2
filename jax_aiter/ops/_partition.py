"""Sharding: how each FFI call is split over a device mesh, under Auto and Explicit mesh axes alike.

An XLA custom call is opaque to the partitioner: without a rule it gathers every
operand onto every device and runs the whole op there. Each op therefore has a
*planner*: given the mesh and how its operands are sharded, it returns a `Plan`,
the shardings the kernel runs with and the per-shard computation (`Plan.body`,
usually the same FFI call on the shard's shapes, plus whatever local slicing or
collective the split needs, such as a norm's partial sums over a sharded hidden
axis). One planner serves both kinds of mesh axes:

- **Auto axes** (``jax.jit`` with ``NamedSharding`` inputs, or ``jax.sharding.Mesh``
  with ``AxisType.Auto``): the op is a ``jax.experimental.custom_partitioning`` call
  (as JAX documents for FFI calls, and as NVIDIA TransformerEngine's JAX extension
  does for its fused attention and norms) with a Shardy sharding rule (einsum-like
  factors that propagation reads) and a partition callback that calls the planner
  on the shardings the partitioner proposes. Operands the plan wants sharded
  differently are resharded by the partitioner, explicitly, in the HLO.
- **Explicit axes** (``jax.make_mesh``'s default in JAX 0.11, inside ``jax.set_mesh``):
  shardings are part of the types, known when the op is traced. The planner runs
  at trace time on those types; the operands are ``jax.sharding.reshard``-ed to
  the plan's specs and the body runs in a ``jax.shard_map`` over the explicit axes,
  so the results carry the plan's shardings in their types (not a replicated type
  that would cost an all-gather, and that ``custom_vjp`` would refuse as the
  gradient of a sharded primal).

Inside a fully manual ``jax.shard_map`` and on a single device the plain call runs
(the caller already holds one shard), so the planner costs nothing there.

A planner may split one mesh axis into two sub-axes (``split_entry``), e.g. to
reduce over the devices that share one GQA kv head: the partition callback may
return a mesh of the same devices with other axis names. Only the Auto path can
(``refine``); under Explicit axes the shard_map runs on the caller's mesh.

``jax.export`` cannot serialize the Auto path's callback: an exported program holds the op as a custom call
that the compiling process partitions with the same planner (_exported_partition.py).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from jax_aiter.ops import _exported_partition

Entry = Any  # one dimension's sharding: None, a mesh axis name, or a tuple of names (major to minor)
Spec = tuple  # one Entry per dimension


@dataclass(frozen=True)
class Operand:
    """What a planner sees of one operand: its shape, dtype and spec (one entry per dimension)."""
    shape: tuple
    dtype: Any
    spec: Spec


@dataclass(frozen=True)
class Plan:
    """How one call runs split: the spec each operand is given to `body` with and each result leaves with,
    and the per-shard computation. `mesh`: the mesh `body`'s axis names refer to when the planner refined
    the caller's (sub-axes); None for the caller's mesh."""
    operands: Sequence[Spec]
    results: Sequence[Spec]
    body: Callable
    mesh: Any = field(default=None, compare=False)


# planner(*static, mesh, operands: list[Operand], refine: bool) -> Plan
Planner = Callable[..., Plan]


def padded(spec, ndim: int) -> Spec:
    """A PartitionSpec (or tuple) as a tuple of exactly `ndim` entries."""
    spec = tuple(spec)
    return spec + (None,) * (ndim - len(spec))


def padded_spec(shape) -> Spec:
    """The spec of a ShapeDtypeStruct the partitioner proposes, one entry per dimension.

    Without a mesh (an unnamed GSPMD sharding) nothing is known to be sharded, so every
    entry is None and the op runs replicated: correct, and the same as before the rule."""
    sharding = shape.sharding
    return padded(sharding.spec if isinstance(sharding, NamedSharding) else (), len(shape.shape))


def axis_names(entry: Entry) -> tuple[str, ...]:
    """The mesh axes of a spec entry (None, an axis name or a tuple of names)."""
    return () if entry is None else entry if isinstance(entry, tuple) else (entry,)


def entry_of(names: Sequence[str]) -> Entry:
    """The spec entry of these axes (the inverse of axis_names)."""
    names = tuple(names)
    return None if not names else names[0] if len(names) == 1 else names


def axes_size(mesh, entry: Entry) -> int:
    """How many shards a spec entry splits a dimension into."""
    return math.prod(mesh.shape[name] for name in axis_names(entry))


def shard_index(entry: Entry):
    """Inside a body: this shard's index along the dimension `entry` splits (0 when it is not split)."""
    names = axis_names(entry)
    return jax.lax.axis_index(names) if names else 0


def split_entry(mesh, entry: Entry, outer: int, refine: bool):
    """Split the devices of `entry` (n of them, major to minor) into `outer` groups of n // outer:
    (mesh, outer entry, inner entry), where shard index = outer index * (n // outer) + inner index.

    The boundary falls between two of the entry's axes, or inside one; the latter needs a mesh with
    that axis split into two sub-axes, which only `refine` allows. None where neither works."""
    names = axis_names(entry)
    before = 1
    for i, name in enumerate(names):
        size = mesh.shape[name]
        if before == outer:
            return mesh, entry_of(names[:i]), entry_of(names[i:])
        if outer % before == 0 and size % (outer // before) == 0 and before * size > outer:
            if not refine:
                return None
            hi = outer // before
            sub = (f"{name}_hi", f"{name}_lo")
            if any(s in mesh.shape for s in sub):
                return None
            new_names, new_shape = [], []
            for n, s in zip(mesh.axis_names, mesh.devices.shape):
                if n == name:
                    new_names += sub
                    new_shape += [hi, s // hi]
                else:
                    new_names.append(n)
                    new_shape.append(s)
            refined = jax.sharding.Mesh(np.asarray(mesh.devices).reshape(new_shape), tuple(new_names))
            return refined, entry_of((*names[:i], sub[0])), entry_of((sub[1], *names[i + 1:]))
        before *= size
    return (mesh, entry, None) if before == outer else None


def explicit_axes(mesh) -> tuple[str, ...]:
    """The mesh's Explicit axes (JAX 0.11: jax.make_mesh's default axis type)."""
    types = getattr(mesh, "axis_types", None) or ()
    return tuple(n for n, t in zip(mesh.axis_names, types) if t == AxisType.Explicit)


def _explicit_mesh():
    """The abstract mesh of `jax.set_mesh` when it has Explicit axes and no Manual ones, else None."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or not explicit_axes(mesh):
        return None
    if any(t == AxisType.Manual for t in mesh.axis_types):
        return None  # inside shard_map: the caller holds shards already
    return mesh


def type_spec(x) -> Spec:
    """The spec in x's type (Explicit axes), one entry per dimension; all None when the type carries none."""
    sharding = getattr(jax.typeof(x), "sharding", None)
    spec = getattr(sharding, "spec", None)
    return padded(spec if spec is not None else (), x.ndim)


def spec_of(x: jax.Array) -> Spec | None:
    """x's spec under Explicit mesh axes (a static, hashable value to reshard a cotangent to), else None."""
    return type_spec(x) if _explicit_mesh() is not None else None


def to_spec(ct: jax.Array, spec: Spec | None) -> jax.Array:
    """A cotangent resharded to its primal's spec (spec_of): under Explicit axes custom_vjp requires the
    backward's results to have the primals' types, shardings included. A no-op for None."""
    if spec is None or type_spec(ct) == spec:
        return ct
    return jax.sharding.reshard(ct, P(*spec))


def like(ct: jax.Array, primal: jax.Array) -> jax.Array:
    """A cotangent resharded to its primal's type (Explicit axes); a no-op without Explicit axes."""
    return to_spec(ct, spec_of(primal))


def partitioned(fn: Callable, rule: str | Callable, planner: Planner, n_static: int = 0, check_vma: bool = True,
                **rule_kwargs) -> Callable:
    """fn(*static, *arrays) as an op split by `planner` over a device mesh. The first `n_static` arguments are
    compile-time constants; `rule` is the Shardy sharding rule of the Auto path (a string, or a callable of
    (*static, mesh, operand types, result types), as custom_partitioning takes it). `check_vma`: the Explicit
    path's shard_map checks that a result declared replicated is (False for a body that makes it so with an
    all-gather, whose result shard_map types as varying)."""

    def call(*args):
        return fn(*args)

    op = custom_partitioning(call, static_argnums=tuple(range(n_static)))

    def partition(*args):
        *static, mesh, arg_shapes, result_shape = args
        operands = [Operand(tuple(s.shape), s.dtype, padded_spec(s)) for s in arg_shapes]
        plan = planner(*static, mesh, operands, True)
        plan_mesh = plan.mesh if plan.mesh is not None else mesh
        named = tuple(NamedSharding(plan_mesh, P(*s)) for s in plan.operands)
        outs = tuple(NamedSharding(plan_mesh, P(*s)) for s in plan.results)
        return plan_mesh, plan.body, outs if isinstance(result_shape, (tuple, list)) else outs[0], named

    op.def_partition(partition=partition, sharding_rule=rule, **rule_kwargs)
    _exported_partition.declare(fn, partition)  # jax.export: the same partition, in the process that compiles

    def explicit(mesh, static, arrays):
        operands = [Operand(tuple(a.shape), a.dtype, type_spec(a)) for a in arrays]
        plan = planner(*static, mesh, operands, False)
        arrays = [a if type_spec(a) == s else jax.sharding.reshard(a, P(*s)) for a, s in zip(arrays, plan.operands)]
        out_specs = tuple(P(*s) for s in plan.results)
        several = len(plan.results) > 1
        body = jax.shard_map(plan.body, mesh=mesh, in_specs=tuple(P(*s) for s in plan.operands),
                             out_specs=out_specs if several else out_specs[0], axis_names=set(explicit_axes(mesh)),
                             check_vma=check_vma)
        return body(*arrays)

    def run(*args):
        mesh = _explicit_mesh()
        if mesh is not None:
            return explicit(mesh, args[:n_static], args[n_static:])
        return op(*args)

    return run


def tangents_from(op: Callable, reference: Callable) -> Callable:
    """`op` (a partitioned call: no derivative of its own) with the forward-mode derivative of `reference`, the
    same function in jax.numpy. The norms and SiLU-and-mul call their kernels in the forward of a gradient and
    keep grad of grad working: JAX differentiates that forward through this rule (plain JAX math)."""
    g = jax.custom_jvp(op)

    @g.defjvp
    def _jvp(primals, tangents):
        return op(*primals), jax.jvp(reference, primals, tangents)[1]
    return g
