"""jax.export: symbolic batch and sequence sizes for every op, the safety checks to disable, and an
exported forward and gradient that reload and run in a fresh process that never imports jax_aiter (JAX's
plugin hook, jax_aiter/_jax_plugin.py, registers what the program calls).

Registration and import stay cheap: `import jax_aiter` imports no JAX, register() starts no JAX backend,
and the plugin hook loads nothing for a program without the package's ops (each checked in a fresh
interpreter)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

import jax_aiter
from jax_aiter import op_table

ROOT = Path(__file__).resolve().parents[2]


def _attn(q, k, v):
    return jax_aiter.flash_attn_func(q, k, v, causal=True)


def _norm_add(x, r, w):
    out, summed = jax_aiter.rms_norm_with_add(x, r, w)
    return out + summed


def _loss_grad(op, n):
    return jax.grad(lambda *a: jnp.sum(jnp.sin(op(*a))), argnums=tuple(range(n)))


# (id, op, symbolic shapes, two concrete bindings of (b, s, t))
CASES = [
    ("rms_norm", jax_aiter.rms_norm, ["b, s, 64", "64"]),
    ("rms_norm_with_add", _norm_add, ["b, s, 64", "b, s, 64", "64"]),
    ("silu_and_mul", jax_aiter.silu_and_mul, ["b, s, 128"]),
    ("flash_attn_func", _attn, ["b, s, 4, 64", "b, t, 2, 64", "b, t, 2, 64"]),
]
BINDINGS = [{"b": 3, "s": 5, "t": 9}, {"b": 1, "s": 70, "t": 3}]  # s > 64 rows: the decode threshold


def _symbolic(specs):
    scope = export.SymbolicScope()
    return [jax.ShapeDtypeStruct(export.symbolic_shape(s, scope=scope), jnp.float32) for s in specs]


def _concrete(specs, binding, seed=0):
    rng = np.random.default_rng(seed)
    shapes = [tuple(binding[d.strip()] if d.strip() in binding else int(d) for d in s.split(",")) for s in specs]
    return [rng.standard_normal(shape).astype(np.float32) for shape in shapes]


@pytest.mark.parametrize("op,specs", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_export_with_symbolic_batch_and_sequence(op, specs):
    fns = {"forward": op, "grad": _loss_grad(op, len(specs))}
    for what, fn in fns.items():
        exp = export.export(jax.jit(fn), disabled_checks=jax_aiter.disabled_checks())(*_symbolic(specs))
        assert any(not isinstance(d, int) for a in exp.in_avals for d in a.shape)
        for binding in BINDINGS:
            args = _concrete(specs, binding)
            got, want = exp.call(*args), jax.jit(fn)(*args)
            for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
                np.testing.assert_array_equal(g, w, err_msg=f"{what} at {binding}")


def test_disabled_checks_are_the_op_tables_targets_and_are_needed():
    targets = [t for op in op_table.load().values() for t, _ in op.targets] + ["ja_partitioned"]
    assert jax_aiter.disabled_checks() == [export.DisabledSafetyCheck.custom_call(t) for t in targets]
    assert jax_aiter.disabled_checks(["silu_and_mul"]) == [export.DisabledSafetyCheck.custom_call(t)
                                                           for t in ("ja_silu_and_mul", "ja_partitioned")]
    x = jax.ShapeDtypeStruct((2, 8), jnp.float32)
    with pytest.raises(ValueError, match="Cannot serialize code with custom calls whose targets have no"):
        export.export(jax.jit(jax_aiter.silu_and_mul))(x)
    with pytest.raises(ValueError, match=r"unknown op\(s\) silu; the ops are rmsnorm_fwd, silu_and_mul"):
        jax_aiter.disabled_checks(["silu"])


# Run in a fresh interpreter that never names jax_aiter: deserialize and run (the plugin hook registers the ops).
RELOAD = textwrap.dedent("""
    import sys, numpy as np
    import jax
    data = np.load(sys.argv[1])
    for name in ("forward", "grad"):
        exp = jax.export.deserialize(bytearray(data[name + "_blob"].tobytes()))
        args = [data[f"arg{i}"] for i in range(int(data["n_args"]))]
        assert "jax_aiter._loader" not in sys.modules or name == "grad", "registered before the program ran"
        got = jax.tree.leaves(exp.call(*args))
        want = [data[f"{name}_out{i}"] for i in range(len(got))]
        for g, w in zip(got, want):
            np.testing.assert_array_equal(np.asarray(g), w)
    assert "jax_aiter._jax_plugin" in sys.modules and "jax_aiter._loader" in sys.modules
    print("reloaded and ran", flush=True)
""")


def reload_in_a_fresh_process(tmp_path, fns: dict, avals, args) -> None:
    """Exports each of fns ({"forward": f, "grad": g}) at the symbolic avals, saves it with args and the jitted
    outputs, and runs RELOAD on them in a fresh interpreter: the same values bit for bit, with no registration
    but JAX's plugin hook."""
    saved = {"n_args": np.array(len(args)), **{f"arg{i}": a for i, a in enumerate(args)}}
    for name, fn in fns.items():
        exp = export.export(jax.jit(fn), disabled_checks=jax_aiter.disabled_checks())(*avals)
        saved[f"{name}_blob"] = np.frombuffer(bytes(exp.serialize()), np.uint8)
        for i, out in enumerate(jax.tree.leaves(jax.jit(fn)(*args))):
            saved[f"{name}_out{i}"] = np.asarray(out)
    np.savez(tmp_path / "exported.npz", **saved)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.run([sys.executable, "-c", RELOAD, str(tmp_path / "exported.npz")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0 and "reloaded and ran" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-4000:]


def test_exported_forward_and_grad_run_in_a_fresh_process(tmp_path):
    specs = CASES[3][2]
    reload_in_a_fresh_process(tmp_path, {"forward": _attn, "grad": _loss_grad(_attn, 3)}, _symbolic(specs),
                              _concrete(specs, BINDINGS[1], seed=1))


# A program without the package's ops, exported and run where jax-aiter is installed: the hook is there, and it
# loads nothing: no native loader, no op module (a search of the program's bytes for the op table's targets).
UNRELATED = textwrap.dedent("""
    import sys
    import jax, jax.numpy as jnp, numpy as np
    exp = jax.export.deserialize(jax.export.export(jax.jit(jnp.sin))(np.ones(3, np.float32)).serialize())
    np.testing.assert_array_equal(exp.call(np.zeros(3, np.float32)), np.zeros(3, np.float32))
    loaded = sorted(m for m in sys.modules if m.startswith("jax_aiter"))
    assert "jax_aiter._jax_plugin" in loaded, loaded
    heavy = {"jax_aiter._loader", "jax_aiter.ops.rmsnorm", "jax_aiter.ops.activation", "jax_aiter.ops.attention"}
    assert not heavy & set(loaded), loaded
    print("untouched", flush=True)
""")


def test_plugin_hook_loads_nothing_for_a_program_without_the_ops():
    proc = subprocess.run([sys.executable, "-c", UNRELATED], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0 and "untouched" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-4000:]


CHEAP = textwrap.dedent("""
    import sys
    import jax_aiter
    assert "jax" not in sys.modules, "import jax_aiter imported JAX"
    jax_aiter.register()
    from jax._src import xla_bridge
    assert not xla_bridge._backends, f"register() started a backend: {list(xla_bridge._backends)}"
    print("cheap", flush=True)
""")


def test_import_and_register_start_no_backend():
    proc = subprocess.run([sys.executable, "-c", CHEAP], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0 and "cheap" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-4000:]


def test_public_names_are_typed():
    """Type checkers see the lazily loaded names through TYPE_CHECKING imports: the same names as _LAZY,
    from the same modules, each a function with annotated parameters and return."""
    import ast
    import inspect

    tree = ast.parse((ROOT / "jax_aiter" / "__init__.py").read_text())
    typed = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            for imp in (n for n in node.body if isinstance(n, ast.ImportFrom)):
                typed.update({alias.name: imp.module for alias in imp.names})
    assert {n: m for n, m in typed.items() if n not in jax_aiter._SUBMODULES} == jax_aiter._LAZY
    assert {n: m for n, m in typed.items() if n in jax_aiter._SUBMODULES} == dict.fromkeys(jax_aiter._SUBMODULES,
                                                                                          "jax_aiter")
    assert (ROOT / "jax_aiter" / "py.typed").is_file()
    for name in jax_aiter.__all__:
        sig = inspect.signature(getattr(jax_aiter, name))
        assert sig.return_annotation is not inspect.Signature.empty, name
        assert all(p.annotation is not inspect.Parameter.empty for p in sig.parameters.values()), name


# JAX's private custom_partitioning callback record as two releases define it: 0.11 with GSPMD's callbacks, 0.12
# without them (issue 84: positional arguments for 0.11 made every exported sharded program fail to reload on 0.12).
class _RecordJax011:
    def __init__(self, propagate_user_sharding, partition, to_mesh_pspec_sharding, in_tree, out_tree,
                 infer_sharding_from_operands, module_context, mesh, static_args):
        self.__dict__.update({k: v for k, v in locals().items() if k != "self"})


class _RecordJax012:
    def __init__(self, partition, to_mesh_pspec_sharding, in_tree, out_tree, module_context, mesh, static_args):
        self.__dict__.update({k: v for k, v in locals().items() if k != "self"})


class _RecordUnknown:
    def __init__(self, partition, to_mesh_pspec_sharding, in_tree, out_tree, module_context, mesh, static_args,
                 lowering_platform):
        pass


_FIELDS = {"partition": "p", "to_mesh_pspec_sharding": "t", "in_tree": "i", "out_tree": "o", "module_context": "m",
           "mesh": "mesh", "static_args": ("s",)}


@pytest.mark.parametrize("record", [_RecordJax011, _RecordJax012], ids=["jax-0.11", "jax-0.12"])
def test_callback_record_is_built_by_name_on_either_jax(record, monkeypatch):
    from jax._src import custom_partitioning as jax_cp

    from jax_aiter.ops import _exported_partition
    monkeypatch.setattr(jax_cp, "_ShardingCallbackInfo", record)
    info = _exported_partition._callback_info(**_FIELDS, propagate_user_sharding=None,
                                              infer_sharding_from_operands=None)
    assert isinstance(info, record)
    for name, value in _FIELDS.items():
        assert getattr(info, name) == value, name
    if record is _RecordJax011:  # GSPMD's callbacks: None (an exported op is partitioned by Shardy only)
        assert info.propagate_user_sharding is None and info.infer_sharding_from_operands is None


def test_callback_record_of_an_unknown_jax_is_refused_by_name(monkeypatch):
    from jax._src import custom_partitioning as jax_cp

    from jax_aiter.ops import _exported_partition
    monkeypatch.setattr(jax_cp, "_ShardingCallbackInfo", _RecordUnknown)
    with pytest.raises(_exported_partition.ExportError,
                       match=rf"JAX {jax.__version__}'s custom_partitioning callback record .* takes "
                             r"\['lowering_platform'\].*install a JAX in the range jax-aiter declares"):
        _exported_partition._callback_info(**_FIELDS, propagate_user_sharding=None, infer_sharding_from_operands=None)
    monkeypatch.setattr(jax_cp, "_ShardingCallbackInfo", _RecordJax012)
    with pytest.raises(_exported_partition.ExportError, match=r"no longer takes \['infer_sharding_from_operands'\]"):
        _exported_partition._callback_info(**_FIELDS, infer_sharding_from_operands=print)
