"""Shared pieces of the sharded tests: mesh layouts, shard_map wrapping, comparisons.

Every layout is a pytest param carrying ``multigpu(devices=N)``, so the
central guard (jatools.testing.pytest_plugin) skips it, with the reason printed, on a
machine with fewer devices. Activations are [batch, seq, heads, head_dim];
"batch" and "heads" are the mesh axes they are sharded over.
"""
from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

# name: (mesh axis names, mesh shape, spec of a [batch, seq, heads, dim] activation)
LAYOUTS = {
    "batch": (("batch",), (2,), P("batch", None, None, None)),
    "heads": (("heads",), (2,), P(None, None, "heads", None)),
    "batch_heads": (("batch", "heads"), (2, 2), P("batch", None, "heads", None)),
}


def layout_params() -> list:
    return [pytest.param(name, id=name, marks=pytest.mark.multigpu(devices=math.prod(shape)))
            for name, (_, shape, _) in LAYOUTS.items()]


def mesh_and_spec(layout: str) -> tuple[jax.sharding.Mesh, P]:
    axes, shape, spec = LAYOUTS[layout]
    return jax.make_mesh(shape, axes, devices=jax.devices()[: math.prod(shape)]), spec


def put(x: jax.Array, mesh: jax.sharding.Mesh, spec: P) -> jax.Array:
    return jax.device_put(x, NamedSharding(mesh, spec))


def shard_mapped(fn, mesh: jax.sharding.Mesh, in_specs, out_specs):
    """jit(shard_map(fn)): fn sees one shard per device, as a multi-GPU model would run it."""
    return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs))


def local_shape(shape: tuple[int, ...], mesh: jax.sharding.Mesh, spec: P) -> tuple[int, ...]:
    return tuple(n // (mesh.shape[a] if a else 1) for n, a in zip(shape, tuple(spec) + (None,) * len(shape)))


def custom_call_shapes(compiled_text: str, target: str) -> list[str]:
    """The result shapes of every custom call to `target` in compiled HLO text."""
    pat = re.compile(r"=\s*([a-z0-9]+\[[0-9,]*\])\S*\s+custom-call\(.*custom_call_target=\"" + re.escape(target) + '"')
    return [m.group(1) for m in pat.finditer(compiled_text)]


def kernel_shapes(compiled_text: str, target: str) -> list[tuple[str, ...]]:
    """The result shapes of every custom call to `target` in compiled HLO text, one tuple per call (a
    multi-result call has a tuple result), layouts dropped."""
    out = []
    for line in compiled_text.splitlines():
        if f'custom_call_target="{target}"' in line and " custom-call(" in line:
            result = line.split("=", 1)[1].split(" custom-call(")[0]
            out.append(tuple(re.findall(r"[a-z0-9]+\[[0-9,]*\]", result)))
    return out


MOVES = ("all-gather", "all-to-all", "collective-permute")  # what moves operands between devices


def moves(compiled_text: str) -> list[str]:
    """The collectives in compiled HLO that move data between devices (an all-reduce of a gradient is not one)."""
    return sorted({m for m in MOVES if re.search(rf"\b{m}(-start)?\(", compiled_text)})


def hlo_shape(dtype, shape: tuple[int, ...]) -> str:
    name = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}[jnp.dtype(dtype).name]
    return f"{name}[{','.join(map(str, shape))}]"


def random(key: int, shape: tuple[int, ...], dtype) -> jax.Array:
    return jax.random.normal(jax.random.key(key), shape, jnp.float32).astype(dtype)


def assert_close(got, want, dtype, what: str) -> None:
    """Sharded vs single-device values where summation order may differ (cross-shard reductions).

    A reduction over shards rounds each shard's partial sum to the dtype before
    the psum, so the bound is relative to the largest magnitude, not per element.
    """
    tol = {"float32": 1e-5, "bfloat16": 2e-2, "float16": 2e-3}[jnp.dtype(dtype).name]
    want = np.asarray(want, np.float32)
    np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=tol, atol=tol * max(1.0, np.abs(want).max()),
                               err_msg=f"{what}: sharded result differs from the single-device result")


def assert_equal(got, want, what: str) -> None:
    """Sharded vs single-device values of a per-row kernel: the same rows, so the same bits."""
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32),
                                  err_msg=f"{what}: sharded result differs from the single-device result")


COLLECTIVES = {"all-gather": "AG", "all-reduce": "AR", "reduce-scatter": "RS", "all-to-all": "A2A",
               "collective-permute": "CP"}
_ITEMSIZE = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4, "u32": 4,
             "f64": 8, "s64": 8, "u64": 8}
_COLLECTIVE_LINE = re.compile(r"^\s*(?:ROOT\s+)?\S+\s*=\s*(.*?)\s+(" + "|".join(COLLECTIVES) + r")(?:-start)?\(")


def collectives(compiled_text: str) -> dict[str, tuple[int, int]]:
    """{kind: (count, bytes)} of the collectives in compiled HLO text: each instruction once (one inside a loop
    body counts once), bytes the size of its result(s) on one device (a tuple all-reduce counts every operand)."""
    out: dict[str, tuple[int, int]] = {}
    for line in compiled_text.splitlines():
        m = _COLLECTIVE_LINE.match(line)
        if not m:
            continue
        size = sum(math.prod(int(d) for d in dims.split(",") if d) * _ITEMSIZE[dt]
                   for dt, dims in re.findall(r"\b([a-z]+[0-9]*)\[([0-9,]*)\]", m.group(1)) if dt in _ITEMSIZE)
        count, nbytes = out.get(m.group(2), (0, 0))
        out[m.group(2)] = (count + 1, nbytes + size)
    return out
