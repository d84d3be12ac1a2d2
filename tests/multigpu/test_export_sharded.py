"""jax.export of programs over several devices (docs/transformations.md, jax.export), through the engines users run.

Every sharding pattern of the parity table (_parity.CASES: batch, heads, GQA, MQA, sequence, hidden, FSDP),
forward and grad, under Auto mesh axes (plain jit with NamedSharding inputs: each op's partition callback is
exported as a ``ja_partitioned`` custom call, partitioned by the same planner where the program is compiled)
and under Explicit axes inside ``jax.set_mesh`` (the ops are shard_maps). Each program is exported and
serialized here, then deserialized and run in a fresh process that never imports jax_aiter nor calls
register() (JAX's plugin hook registers what the program calls). The reloaded program has the same bits and
kernels as the live one, and no more collectives (count and bytes per kind) nor other output shardings, except
where JAX's own round trip changes the same program written in plain JAX (the control, exported and reloaded
alongside): there ours reloaded shards as plain JAX reloaded. So the test holds on every JAX of the range
pyproject.toml declares (JAX 0.12 compiles some reloaded plain-JAX grads differently from their live form)."""
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


def _live(case, impl: str, mode: str, grad: bool):
    """The program (ours, or plain JAX's) as the parity table runs it: jitted, and its inputs placed."""
    mesh = _parity._mesh(case, mode)
    fn = _parity.program(case, impl, mode, mesh)
    args = _parity.inputs(case)
    if grad:
        fn = _parity.with_grad(case, fn, args)
    placed = [jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(args, case.specs)]
    return mesh, jax.jit(fn), placed


def _export(case, impl: str, mode: str, grad: bool):
    """(mesh, exported program, live compiled HLO text, live outputs), or None where plain JAX refuses the program
    (ShardingTypeError under Explicit axes: the parity table's "fails")."""
    mesh, fn, placed = _live(case, impl, mode, grad)
    try:
        with jax.set_mesh(mesh) if mode == "explicit" else contextlib.nullcontext():
            compiled = fn.lower(*placed).compile()
            outs = jax.tree.leaves(compiled(*placed))
            exp = jax.export.export(fn, disabled_checks=jax_aiter.disabled_checks())(*placed)
    except Exception:
        if impl == "ours":
            raise
        return None
    return mesh, exp, placed, compiled.as_text(), outs


def _added(reloaded: dict, live: dict) -> dict:
    """{kind: (count, bytes)} the reloaded program's collectives have beyond the live program's."""
    return {k: (max(0, n - live.get(k, (0, 0))[0]), max(0, b - live.get(k, (0, 0))[1]))
            for k, (n, b) in reloaded.items() if n > live.get(k, (0, 0))[0] or b > live.get(k, (0, 0))[1]}


def _moved(mesh, specs: list, outs) -> set[int]:
    """The outputs whose reloaded spec (JSON) places them otherwise than the live program's."""
    return {k for k, (s, o) in enumerate(zip(specs, outs))
            if not NamedSharding(mesh, P(*s)).is_equivalent_to(o.sharding, o.ndim)}


def _equivalent(mesh, spec: list, other: list, ndim: int) -> bool:
    return NamedSharding(mesh, P(*spec)).is_equivalent_to(NamedSharding(mesh, P(*other)), ndim)


@pytest.mark.multigpu(devices=4)
@pytest.mark.parametrize("mode", ["auto", "explicit"])
def test_sharded_programs_reload_in_a_fresh_process_as_they_run_live(mode, tmp_path, monkeypatch):
    """Each program of ours, and as a control the same program in plain JAX, exported here and reloaded in a fresh
    process. Ours reloads with the bits and kernels it runs with live, and the round trip adds to it no collective
    (count or bytes, per kind) and moves no output sharding beyond what the same round trip does to plain JAX's
    program: nothing on JAX 0.11; on JAX 0.12, which compiles some reloaded grads otherwise than their live form
    (rms-weight-split: a replicated weight gradient, its all-reduces 512 B larger, in plain JAX's as in ours), the
    same and no more."""
    monkeypatch.setenv("JA_KERNEL_MIN_BYTES", "0")  # the kernels, not their jax.numpy form, on these small shards
    programs, inputs, live = [], {}, []
    for case in _parity.CASES:
        for grad in (False, True) if case.grad else (False,):  # the paged ops are inference ops: no gradient
            for impl in ("ours", "plain"):
                got = _export(case, impl, mode, grad)
                if got is None:
                    live.append(None)
                    continue
                mesh, exp, placed, live_hlo, outs = got
                i = len(programs)
                if mode == "auto" and impl == "ours":  # ours is partitioned where compiled (and nothing else is)
                    text = exp.mlir_module()
                    assert "CustomSPMDPartitioning" not in text, case.name
                    # where it calls a kernel: silu_and_mul(gate, up)'s gradient is plain JAX's autodiff (none)
                    assert "custom_call @ja_partitioned(" in text or not _kernels(live_hlo), case.name
                (tmp_path / f"{i}.bin").write_bytes(exp.serialize())
                inputs.update({f"{i}_{j}": np.asarray(a, np.float32) for j, a in enumerate(placed)})  # bf16 exactly
                programs.append({"name": f"{case.name} {'grad' if grad else 'forward'}", "mode": mode,
                                 "axes": case.axes, "mesh_shape": case.mesh_shape, "devices": case.devices,
                                 "specs": [_spec(s) for s in case.specs], "dtypes": [str(a.dtype) for a in placed]})
                live.append((i, mesh, live_hlo, outs))
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
    for ours, plain in zip(live[::2], live[1::2]):
        i, mesh, live_hlo, want = ours
        name = programs[i]["name"]
        got = list(np.load(tmp_path / f"{i}_out.npz").values())
        hlo = (tmp_path / f"{i}.hlo").read_text()
        called.update(_kernels(hlo))
        if _kernels(hlo) != _kernels(live_hlo):
            wrong.append(f"{name}: kernels {_kernels(hlo)}, live {_kernels(live_hlo)}")
        for k, (g, w) in enumerate(zip(got, want)):
            if not np.array_equal(g, np.asarray(w, np.float32)):
                wrong.append(f"{name}: output {k} differs by {np.max(np.abs(g - np.asarray(w, np.float32)))}")
        # what the round trip adds to ours, against what it adds to the same program in plain JAX
        added = _added(collectives(hlo), collectives(live_hlo))
        plain_added, plain_moved = {}, set()
        if plain is not None:
            plain_added = _added(collectives((tmp_path / f"{plain[0]}.hlo").read_text()), collectives(plain[2]))
            plain_moved = _moved(plain[1], report["specs"][plain[0]], plain[3])
        more = {k: (n, b, *plain_added.get(k, (0, 0))) for k, (n, b) in added.items()
                if n > plain_added.get(k, (0, 0))[0] or b > plain_added.get(k, (0, 0))[1]}
        if more:
            wrong.append(f"{name}: the reload adds collectives {{kind: (count, bytes, plain JAX's count, bytes)}}: "
                         f"{more}; reloaded {collectives(hlo)}, live {collectives(live_hlo)}")
        moved = _moved(mesh, report["specs"][i], want)
        if moved - plain_moved or any(not _equivalent(mesh, report["specs"][i][k], report["specs"][plain[0]][k],
                                                      want[k].ndim) for k in moved):
            wrong.append(f"{name}: outputs {sorted(moved)} reloaded as {report['specs'][i]}, live "
                         f"{[w.sharding.spec for w in want]}"
                         + (f"; plain JAX reloaded as {report['specs'][plain[0]]}" if plain else ""))
    assert not wrong, "\n".join(wrong)
    # every kernel ran (where a layout has the jax.numpy form: a split hidden axis, mixed dtypes, the backwards)
    assert called == {"ja_mha_fwd", "ja_mha_bwd", "ja_rmsnorm_fwd", "ja_rmsnorm_fwd_add", "ja_silu_and_mul",
                      "ja_append_kv", "ja_paged_attn"}, called
