"""shard_map support: operands and FFI results typed with the same varying manual axes.

Inside jax.shard_map, an operand replicated over a mesh axis (a weight with
in_specs P()) is "invariant" there while the activations vary. A custom_vjp
backward then returns a weight cotangent that varies, and JAX rejects it
because its type no longer matches the primal's. Casting the invariant
operands to varying before the custom_vjp call (jax.lax.pcast ... to="varying")
fixes the types, and the transpose of that cast is the psum over the mesh
axes that the replicated weight's gradient needs. Outside shard_map there are
no manual axes and this is a no-op.
"""
from __future__ import annotations

import jax


def varying_axes(a: jax.Array) -> frozenset[str]:
    """The manual mesh axes `a` varies over (JAX 0.11: typeof(a).manual_axis_type.varying)."""
    aval = jax.typeof(a)
    mat = getattr(aval, "manual_axis_type", None)
    if mat is not None:
        return frozenset(mat.varying)
    return frozenset(getattr(aval, "vma", ()))  # the name before JAX 0.11


def vary_like(*arrays: jax.Array) -> tuple[jax.Array, ...]:
    """The arrays, each cast to vary over the union of the manual axes any of them varies over."""
    vmas = [varying_axes(a) for a in arrays]
    union = frozenset().union(*vmas)
    if not union:
        return arrays
    return tuple(a if vma == union else jax.lax.pcast(a, tuple(sorted(union - vma)), to="varying")
                 for a, vma in zip(arrays, vmas))


def varying_like(out: jax.ShapeDtypeStruct, ref: jax.Array) -> jax.ShapeDtypeStruct:
    """`out` typed as varying over the same manual axes as `ref` (an FFI result is per shard)."""
    aval = jax.typeof(ref)
    mat = getattr(aval, "manual_axis_type", None)
    if mat is None:  # before JAX 0.11 the keyword was vma
        return jax.ShapeDtypeStruct(out.shape, out.dtype, vma=varying_axes(ref))
    # the type is per shard on ref's (manual) mesh, so it names that mesh, unpartitioned
    sharding = jax.sharding.NamedSharding(aval.sharding.mesh, jax.sharding.PartitionSpec())
    return jax.ShapeDtypeStruct(out.shape, out.dtype, sharding=sharding, manual_axis_type=mat)
