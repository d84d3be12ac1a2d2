"""The ops shard as plain JAX does: every pattern of _parity.CASES x {forward, grad} x {Auto + NamedSharding,
Explicit + jax.set_mesh, shard_map}, compiled by XLA and read from the HLO.

For each, against the same program written in plain JAX (jax.nn.dot_product_attention, jax.numpy norms):
no kind of collective more often or with more bytes (except where the case declares it, which must then
really exceed: the docs list those with their cost), the same output shardings (except where the case
declares they differ: the docs say how), close values; plain JAX may
refuse a pattern (ShardingTypeError under Explicit axes), ours may not. The row of docs/transformations.md's
sharding table for the pattern and mode must be what is measured here
(`python tests/multigpu/_parity.py --write` rewrites it).
"""
from __future__ import annotations

import numpy as np
import pytest
from _parity import (
    BY_NAME,
    CASES,
    MODES,
    Case,
    documented_rows,
    measure,
    reference,
    row,
)
from jax.sharding import NamedSharding

params = [pytest.param(case, mode, id=f"{case.name}-{mode}", marks=pytest.mark.multigpu(devices=case.devices))
          for case in CASES for mode in MODES]


def _close(got, want, what: str) -> None:
    """float32 to 2e-5 of the largest magnitude; 16-bit results to one rounding (2^-7 for bfloat16)."""
    tol = {"float32": 2e-5, "bfloat16": 8e-3, "float16": 1e-3}[np.dtype(got.dtype).name]
    want = np.asarray(want, np.float32)
    np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=tol, atol=tol * max(1.0, np.abs(want).max()),
                               err_msg=f"{what}: differs from plain JAX on one device")


@pytest.mark.parametrize("case,mode", params)
def test_sharding_matches_plain_jax(case: Case, mode: str):
    results = {}
    for what in ("forward", "grad"):
        ours, plain = (measure(case, impl, mode, what == "grad") for impl in ("ours", "plain"))
        results[("ours", what)], results[("plain", what)] = ours, plain
        if ours is None:
            continue
        label = f"{case.name} {mode} {what}"
        for i, (got, want) in enumerate(zip(ours.values, reference(case, what == "grad"))):
            _close(got, want, f"{label} output {i}")
        if plain.error and (mode, what) not in case.shardings_differ:
            # plain JAX refuses it: ours keeps the inputs' shardings (grads: custom_vjp insists)
            of = case.differentiated if what == "grad" else range(len(ours.values))  # output i's input
            shaped = [(i, j, s) for (i, s), j in zip(enumerate(ours.shardings), of)
                      if ours.values[i].shape == case.shapes[j]]
            for i, j, s in (shaped if what == "grad" else shaped[:1]):
                assert s.is_equivalent_to(NamedSharding(s.mesh, case.specs[j]), ours.values[i].ndim), \
                    f"{label}: output {i} sharding {s.spec}, the input's is {case.specs[j]}"
            continue
        if plain.error:  # and the case declares its output shardings (the docs say which)
            continue
        more = {k: (n, b, *plain.collectives.get(k, (0, 0))) for k, (n, b) in ours.collectives.items()
                if n > plain.collectives.get(k, (0, 0))[0] or b > plain.collectives.get(k, (0, 0))[1]}
        if (mode, what) in case.exceeds:
            assert more, f"{label}: declared to exceed plain JAX, but it does not (update the case and the docs)"
        else:
            assert not more, (f"{label}: more collectives than plain JAX ({{kind: (ours count, bytes, plain count, "
                              f"bytes)}}): {more}")
        differ = [(i, o.spec, p.spec) for i, (o, p) in enumerate(zip(ours.shardings, plain.shardings))
                  if not o.is_equivalent_to(p, len(ours.values[i].shape))]
        if (mode, what) in case.shardings_differ:
            assert differ, f"{label}: declared to differ from plain JAX's output shardings, but it does not"
        else:
            assert not differ, f"{label}: output shardings (index, ours, plain JAX's) differ: {differ}"
    documented, measured = documented_rows().get((case.name, mode)), row(case, mode, results)
    assert documented == measured, (f"docs/transformations.md's sharding table row is stale:\n  docs: {documented}\n"
                                    f"  measured: {measured}\n"
                                    "rewrite it with `python tests/multigpu/_parity.py --write`")


@pytest.mark.multigpu(devices=4)
@pytest.mark.parametrize("name", ["fsdp-block-data", "silu-hidden"])
def test_a_split_hidden_axis_is_not_moved_with_all_to_alls(name):
    """Issue 84: an FSDP step with the batch on `data` alone had three all-to-alls per layer that plain JAX has
    not: silu_and_mul's backward concatenated [dgate | dup] over the split hidden axis. Its backward now puts them
    together as plain JAX's autodiff of the halves' slices does (collective-permutes)."""
    ours = measure(BY_NAME[name], "ours", "auto", True)
    assert "all-to-all" not in ours.collectives, ours.collectives


@pytest.mark.multigpu(devices=4)
@pytest.mark.parametrize("mode", ["auto", "explicit"])
def test_a_split_sequence_with_segment_ids_gathers_the_ids_once(mode):
    """Issue 84: under Auto axes a query-sequence split with segment_ids cost two all-gathers and two
    collective-permutes more than plain JAX in the forward (the runs' bounds, a shift and a running max and min
    along the split axis, left to XLA), and under Explicit axes with the ids split like q the op failed
    (ShardingTypeError). The mask's rows are now made per shard from the ids gathered once, as plain JAX's mask
    gathers them, and the backward's cols from the rows gathered once."""
    case = BY_NAME["attn-seq-segments"]
    for grad in (False, True):
        ours = measure(case, "ours", mode, grad)
        assert "collective-permute" not in ours.collectives, (grad, ours.collectives)
        ids_bytes = np.asarray(case.fixed[0][1], np.int32).nbytes
        kv_bytes = 2 * 4 * 32 * 8 * 64 * 4  # K and V gathered whole (TransformerEngine's all-gather strategy)
        n, b = ours.collectives["all-gather"]
        # forward: K, V and the ids; grad: also the rows' bounds for the backward's cols ([4, 2, 32] int32)
        assert (n, b) == ((4, kv_bytes + ids_bytes + 2 * ids_bytes) if grad else (3, kv_bytes + ids_bytes)), (n, b)
