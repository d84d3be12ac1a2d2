"""jax.export of programs over several devices (docs/transformations.md, jax.export), through the engines users run.

Every sharding pattern of the parity table (_parity.CASES: batch, heads, GQA, MQA, sequence, hidden, FSDP),
forward and grad, under Auto mesh axes (plain jit with NamedSharding inputs: each op's partition callback is
exported as a ``ja_partitioned`` custom call, partitioned by the same planner where the program is compiled)
and under Explicit axes inside ``jax.set_mesh`` (the ops are shard_maps). Each program is exported and
serialized here, then deserialized and run in a fresh process that never imports jax_aiter nor calls
register() (JAX's plugin hook registers what the program calls). The reloaded program's compiled HLO has the
same collectives (count and bytes per kind) as the live program's, its outputs the same shardings and the
same bits."""
from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import _parity
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _mesh_cases import collectives, random
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jax_aiter
from jax_aiter.ops._exported_partition import ExportError

ROOT = Path(__file__).resolve().parents[2]


def _attn(q):
    return jax_aiter.flash_attn_func(q, q, q, causal=True)


@pytest.mark.multigpu(devices=2)
def test_multi_device_export_through_shard_map_round_trips():
    mesh = jax.make_mesh((2,), ("d",), devices=jax.devices()[:2])
    q = jax.device_put(random(50, (4, 16, 4, 64), jnp.float32), NamedSharding(mesh, P("d")))
    mapped = jax.jit(jax.shard_map(_attn, mesh=mesh, in_specs=P("d"), out_specs=P("d")))
    exp = jax.export.deserialize(jax.export.export(mapped, disabled_checks=jax_aiter.disabled_checks())(q).serialize())
    assert exp.nr_devices == 2
    out = exp.call(q)
    assert out.sharding.is_equivalent_to(q.sharding, out.ndim)
    np.testing.assert_array_equal(out, _attn(q))


@pytest.mark.multigpu(devices=2)
def test_export_inside_a_partly_manual_shard_map_names_the_way_out():
    """A shard_map manual over some axes leaves the op to the partitioner over the others, inside the manual
    region, which export cannot express: refused by name, with the forms that do export."""
    mesh = jax.make_mesh((1, 2), ("a", "b"), devices=jax.devices()[:2], axis_types=(jax.sharding.AxisType.Auto,) * 2)
    x = jax.device_put(random(51, (4, 8, 256), jnp.float32), NamedSharding(mesh, P("a", None, "b")))
    w = jax.device_put(random(52, (256,), jnp.float32), NamedSharding(mesh, P()))
    f = jax.jit(jax.shard_map(jax_aiter.rms_norm, mesh=mesh, in_specs=(P("a"), P()), out_specs=P("a"),
                              axis_names={"a"}))
    with pytest.raises(ExportError, match=r"inside a jax.shard_map that leaves mesh axes \['b'\] automatic: make "
                                          r"the shard_map manual over every axis"):
        jax.export.export(f, disabled_checks=jax_aiter.disabled_checks())(x, w)


def _spec(entries) -> list:
    """A PartitionSpec as JSON: one entry per dimension, None, an axis name or a list of names."""
    return [list(e) if isinstance(e, tuple) else e for e in entries]


# The fresh process: no jax_aiter import, no register(); it compiles and runs each program, and writes what the
# parent compares (compiled HLO text, output specs and values).
RELOAD = textwrap.dedent("""
    import contextlib, json, sys
    from pathlib import Path
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
    out = Path(sys.argv[1])
    programs = json.loads((out / "programs.json").read_text())
    data = np.load(out / "inputs.npz")
    assert not [m for m in sys.modules if m.startswith("jax_aiter")], "the reloading process imported jax_aiter"
    report = []
    for i, p in enumerate(programs):
        kind = AxisType.Explicit if p["mode"] == "explicit" else AxisType.Auto
        mesh = jax.make_mesh(p["mesh_shape"], p["axes"], devices=jax.devices()[:p["devices"]],
                             axis_types=(kind,) * len(p["axes"]))
        args = [jax.device_put(data[f"{i}_{j}"].astype(jnp.dtype(t)), NamedSharding(mesh, P(*s)))
                for j, (s, t) in enumerate(zip(p["specs"], p["dtypes"]))]
        exp = jax.export.deserialize(bytearray((out / f"{i}.bin").read_bytes()))
        with jax.set_mesh(mesh) if p["mode"] == "explicit" else contextlib.nullcontext():
            compiled = jax.jit(exp.call).lower(*args).compile()
            outs = jax.tree.leaves(compiled(*args))
        (out / f"{i}.hlo").write_text(compiled.as_text())
        np.savez(out / f"{i}_out.npz", *[np.asarray(o, np.float32) for o in outs])  # bfloat16 exactly
        report.append([[list(e) if isinstance(e, tuple) else e for e in o.sharding.spec] for o in outs])
    (out / "report.json").write_text(json.dumps({"specs": report, "plugin": "jax_aiter._jax_plugin" in sys.modules}))
""")


def _kernels(compiled_text: str) -> list[str]:
    """The custom calls a compiled program makes: the ops' kernels (ja_partitioned must be partitioned away)."""
    return sorted(set(re.findall(r'custom_call_target="([^"]+)"', compiled_text)))


def _live(case, mode: str, grad: bool):
    """The program as the parity table runs it: compiled live, and its inputs placed."""
    mesh = _parity._mesh(case, mode)
    fn = _parity.program(case, "ours", mode, mesh)
    args = _parity.inputs(case)
    if grad:
        fn = _parity._with_grad(fn, _parity._cotangents(case.program(_parity.PLAIN), args))
    placed = [jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(args, case.specs)]
    return mesh, jax.jit(fn), placed


@pytest.mark.multigpu(devices=4)
@pytest.mark.parametrize("mode", ["auto", "explicit"])
def test_sharded_programs_reload_in_a_fresh_process_as_they_run_live(mode, tmp_path, monkeypatch):
    monkeypatch.setenv("JA_KERNEL_MIN_BYTES", "0")  # the kernels, not their jax.numpy form, on these small shards
    programs, inputs, live = [], {}, []
    for case in _parity.CASES:
        for grad in (False, True):
            mesh, fn, placed = _live(case, mode, grad)
            with jax.set_mesh(mesh) if mode == "explicit" else contextlib.nullcontext():
                compiled = fn.lower(*placed).compile()
                outs = jax.tree.leaves(compiled(*placed))
                exp = jax.export.export(fn, disabled_checks=jax_aiter.disabled_checks())(*placed)
            i = len(programs)
            if mode == "auto":  # the ops are partitioned where the program is compiled (and nothing else is)
                text = exp.mlir_module()
                assert "custom_call @ja_partitioned(" in text and "CustomSPMDPartitioning" not in text, case.name
            (tmp_path / f"{i}.bin").write_bytes(exp.serialize())
            inputs.update({f"{i}_{j}": np.asarray(a, np.float32) for j, a in enumerate(placed)})  # bfloat16 exactly
            programs.append({"name": f"{case.name} {'grad' if grad else 'forward'}", "mode": mode, "axes": case.axes,
                             "mesh_shape": case.mesh_shape, "devices": case.devices,
                             "specs": [_spec(s) for s in case.specs], "dtypes": [str(a.dtype) for a in placed]})
            live.append((mesh, compiled.as_text(), outs))
    (tmp_path / "programs.json").write_text(json.dumps(programs))
    np.savez(tmp_path / "inputs.npz", **inputs)

    env = {**{k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}, "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": f"--xla_force_host_platform_device_count={max(c.devices for c in _parity.CASES)}"}
    proc = subprocess.run([sys.executable, "-c", RELOAD, str(tmp_path)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-6000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["plugin"], "the programs ran without jax-aiter's plugin hook: what registered the ops?"

    wrong, called = [], set()
    for i, (p, (mesh, live_hlo, want)) in enumerate(zip(programs, live)):
        got = list(np.load(tmp_path / f"{i}_out.npz").values())
        hlo = (tmp_path / f"{i}.hlo").read_text()
        if collectives(hlo) != collectives(live_hlo):
            wrong.append(f"{p['name']}: collectives {collectives(hlo)}, live {collectives(live_hlo)}")
        called.update(_kernels(hlo))
        if _kernels(hlo) != _kernels(live_hlo):
            wrong.append(f"{p['name']}: kernels {_kernels(hlo)}, live {_kernels(live_hlo)}")
        for k, (spec, g, w) in enumerate(zip(report["specs"][i], got, want)):
            if not NamedSharding(mesh, P(*spec)).is_equivalent_to(w.sharding, w.ndim):
                wrong.append(f"{p['name']}: output {k} reloaded as {spec}, live {w.sharding.spec}")
            if not np.array_equal(g, np.asarray(w, np.float32)):
                wrong.append(f"{p['name']}: output {k} differs by {np.max(np.abs(g - np.asarray(w, np.float32)))}")
    assert not wrong, "\n".join(wrong)
    # every kernel ran (where a layout has the jax.numpy form: a split hidden axis, mixed dtypes, the backwards)
    assert called == {"ja_mha_fwd", "ja_mha_bwd", "ja_rmsnorm_fwd", "ja_rmsnorm_fwd_add", "ja_silu_and_mul"}, called
