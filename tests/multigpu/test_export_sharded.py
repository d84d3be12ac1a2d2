"""jax.export of a program over several devices (docs/transformations.md, jax.export): with the ops
inside jax.shard_map it serializes, reloads and runs sharded; with the ops partitioned by their rules
under plain jit, export refuses (the rules are callbacks of the exporting process), as documented."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _mesh_cases import random
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jax_aiter

pytestmark = pytest.mark.multigpu(devices=2)


def _attn(q):
    return jax_aiter.flash_attn_func(q, q, q, causal=True)


def test_multi_device_export_through_shard_map_round_trips():
    mesh = jax.make_mesh((2,), ("d",), devices=jax.devices()[:2])
    q = jax.device_put(random(50, (4, 16, 4, 64), jnp.float32), NamedSharding(mesh, P("d")))
    mapped = jax.jit(jax.shard_map(_attn, mesh=mesh, in_specs=P("d"), out_specs=P("d")))
    exp = jax.export.deserialize(jax.export.export(mapped, disabled_checks=jax_aiter.disabled_checks())(q).serialize())
    assert exp.nr_devices == 2
    out = exp.call(q)
    assert out.sharding.is_equivalent_to(q.sharding, out.ndim)
    np.testing.assert_array_equal(out, _attn(q))

    with pytest.raises(NotImplementedError, match="serialization of host_callbacks is not yet implemented"):
        jax.export.export(jax.jit(_attn), disabled_checks=jax_aiter.disabled_checks())(q)
