"""Faults of the public API as a JAX user meets it: what `import jax_aiter` costs, what a type checker says about a
misspelt name, and register() given one op's name. Fresh interpreters and the real mypy."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.faults.test_faults_loader import checkout  # noqa: F401  (fixture: a checkout's build tree, copied)

ROOT = Path(__file__).resolve().parents[2]


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    full = {**{k: v for k, v in os.environ.items() if not k.startswith(("JA_", "JAX_AITER"))},
            "PYTHONPATH": str(ROOT), **env}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=full, capture_output=True,
                          text=True, timeout=300, check=False)


def test_faults_import_jax_aiter_imports_nothing_but_itself():
    """`import jax_aiter` loads jax_aiter/__init__.py and nothing else: no JAX, no NumPy, and not the op table's
    TOML reader, dataclasses or typing, which made it take 25-50 ms instead of 2. The modules are counted, not
    timed (a timed test measures the machine; `nox -s bench -- --only import` times it)."""
    r = _python("""
        import json, sys
        before = set(sys.modules)
        import jax_aiter
        print(json.dumps(sorted(set(sys.modules) - before)))
    """)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == ["jax_aiter"], r.stdout


def test_faults_public_names_still_resolve_lazily():
    """The cheap import keeps every public name, __all__, __version__ and dir() (the op table read on first use)."""
    r = _python("""
        import json
        import jax_aiter
        names = jax_aiter.__all__
        register = jax_aiter.register.__module__  # the first op name imports JAX, not before
        print(json.dumps({"all": names, "dir": all(n in dir(jax_aiter) for n in names),
                          "version": jax_aiter.__version__, "register": register}))
        ns = {}
        exec("from jax_aiter import *", ns)
        assert set(names) <= set(ns), sorted(ns)
        try:
            jax_aiter.rms_nrom
        except AttributeError as e:
            print(e)
    """)
    assert r.returncode == 0, r.stderr
    first, missing = r.stdout.splitlines()
    got = json.loads(first)
    assert set(got["all"]) == {"append_kv", "disabled_checks", "flash_attn_func", "paged_attention", "paged_prefill",
                               "register", "rms_norm", "rms_norm_with_add", "silu_and_mul"}
    assert got["dir"] and got["version"] and got["register"] == "jax_aiter.ops.export"
    assert missing == "module 'jax_aiter' has no attribute 'rms_nrom'"


MYPY_CONFIG = """
[mypy]
cache_dir = {cache}
# JAX and NumPy are not what is checked here (and would take minutes): their names are Any.
[mypy-jax.*,jaxlib.*,numpy.*,ml_dtypes.*]
follow_imports = skip
[mypy-jax_aiter.*]
follow_imports = silent
"""


def test_faults_misspelt_public_name_is_a_mypy_error(tmp_path):
    """mypy, run on a user's file against this checkout, reports `ja.rms_nrom` and accepts the real names (the
    module __getattr__ had no return type, so mypy read every attribute as Any and passed the typo)."""
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed in this environment (pyproject's `test` group has it)")
    (tmp_path / "mypy.ini").write_text(MYPY_CONFIG.format(cache=tmp_path / "cache"))
    (tmp_path / "user.py").write_text("import jax_aiter as ja\n\n"
                                      "print(ja.rms_norm, ja.flash_attn_func, ja.register, ja.__version__, "
                                      "ja.rmsnorm.rms_norm)\n"
                                      "ja.rms_nrom\n")
    r = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(tmp_path / "mypy.ini"), "user.py"],
                       cwd=tmp_path, env={**os.environ, "MYPYPATH": str(ROOT)}, capture_output=True, text=True,
                       timeout=600, check=False)
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stdout.splitlines()[0] == 'user.py:4: error: Module has no attribute "rms_nrom"  [attr-defined]', r.stdout
    assert "Found 1 error in 1 file" in r.stdout, r.stdout


def test_faults_register_takes_one_op_name(monkeypatch):
    """register("mha_fwd") registers mha_fwd (it iterated the string: "unknown op(s) m, h, a, ..."); a wrong name
    is named whole."""
    pytest.importorskip("jax", reason="register() is part of the JAX-facing API")
    from jax_aiter import _loader
    from jax_aiter.ops import export

    done: list[str] = []
    monkeypatch.setattr(_loader, "ensure_registered", done.append)
    export.register("mha_fwd")
    export.register(["rmsnorm_fwd", "silu_and_mul"])
    assert done == ["mha_fwd", "rmsnorm_fwd", "silu_and_mul"]
    with pytest.raises(ValueError, match=r"unknown op\(s\) mha_fwdd; the ops are rmsnorm_fwd"):
        export.register("mha_fwdd")
    assert [str(c) for c in export.disabled_checks("silu_and_mul")] == \
        [str(c) for c in export.disabled_checks(["silu_and_mul"])]


# Exported in one fresh process (2 forced CPU devices, Auto axes: heads split attention, hidden split rms_norm),
# run in another that never names jax_aiter.
EXPORT_SHARDED = """
    import sys
    from pathlib import Path
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
    import jax_aiter
    out = Path(sys.argv[1])
    mesh = jax.make_mesh((2,), ("model",), axis_types=(AxisType.Auto,))
    rng = np.random.default_rng(0)
    q, x, w = (rng.standard_normal(s).astype(np.float32) for s in ((2, 16, 4, 64), (2, 8, 256), (256,)))
    args = [jax.device_put(a, NamedSharding(mesh, s)) for a, s in
            zip((q, x, w), (P(None, None, "model"), P(None, None, "model"), P("model")))]
    f = jax.jit(lambda q, x, w: (jax_aiter.flash_attn_func(q, q, q, causal=True), jax_aiter.rms_norm(x, w)))
    (out / "blob").write_bytes(jax.export.export(f, disabled_checks=jax_aiter.disabled_checks())(*args).serialize())
    compiled = f.lower(*args).compile()
    (out / "live.hlo").write_text(compiled.as_text())
    np.savez(out / "io.npz", q=q, x=x, w=w, *[np.asarray(o) for o in compiled(*args)])
"""
RUN_SHARDED = """
    import sys
    from pathlib import Path
    import jax, numpy as np
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
    out = Path(sys.argv[1])
    io = np.load(out / "io.npz")
    mesh = jax.make_mesh((2,), ("model",), axis_types=(AxisType.Auto,))
    args = [jax.device_put(io[n], NamedSharding(mesh, s)) for n, s in
            zip("qxw", (P(None, None, "model"), P(None, None, "model"), P("model")))]
    exp = jax.export.deserialize(bytearray((out / "blob").read_bytes()))
    compiled = jax.jit(exp.call).lower(*args).compile()
    (out / "reloaded.hlo").write_text(compiled.as_text())
    for got, want in zip(compiled(*args), (io["arr_0"], io["arr_1"])):
        np.testing.assert_array_equal(np.asarray(got), want)
    print("same", flush=True)
"""


def test_faults_sharded_program_exports_and_runs_reloaded_without_register(tmp_path):
    """Exporting a jit program whose ops are partitioned over 2 devices failed inside JAX ("serialization of
    host_callbacks is not yet implemented"), and a reloaded program failed without register() ("No FFI handler
    registered for ja_..."): both work, with the live program's collectives (an all-reduce of the norm's
    partial sums; tests/multigpu/test_export_sharded.py does every sharding pattern)."""
    pytest.importorskip("jax", reason="jax.export")
    from tests.multigpu._mesh_cases import collectives

    flags = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu",
             "JA_KERNEL_MIN_BYTES": "0"}
    r = _python(EXPORT_SHARDED.replace("sys.argv[1]", repr(str(tmp_path))), **flags)
    assert r.returncode == 0, r.stderr[-4000:]
    r = _python(RUN_SHARDED.replace("sys.argv[1]", repr(str(tmp_path))), **flags)
    assert r.returncode == 0 and "same" in r.stdout, r.stderr[-4000:]
    live, reloaded = (collectives((tmp_path / n).read_text()) for n in ("live.hlo", "reloaded.hlo"))
    assert reloaded == live and live.get("all-reduce", (0, 0))[0] >= 1, (live, reloaded)


def test_faults_reloaded_program_missing_its_library_names_it(checkout, tmp_path):  # noqa: F811 (the fixture)
    """A deserialized program whose attention library is missing (a lite wheel before jax-aiter-fetch-mha): the
    error names the program, the FFI target and the library with the command that provides it, not XLA's bare
    "No FFI handler registered for ja_mha_fwd"."""
    pytest.importorskip("jax", reason="jax.export")
    build, env = checkout
    r = _python(f"""
        import jax, jax.numpy as jnp, jax_aiter
        q = jax.ShapeDtypeStruct((1, 16, 2, 64), jnp.float32)
        def attention(q):
            return jax_aiter.flash_attn_func(q, q, q)
        exp = jax.export.export(jax.jit(attention), disabled_checks=jax_aiter.disabled_checks())(q)
        open({str(tmp_path / 'blob')!r}, "wb").write(exp.serialize())
    """, JAX_PLATFORMS="cpu")
    assert r.returncode == 0, r.stderr[-4000:]
    (build / "aiter_build" / "libmha_fwd.so").unlink()
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import jax, numpy as np
        exp = jax.export.deserialize(bytearray(open({str(tmp_path / 'blob')!r}, "rb").read()))
        exp.call(np.ones((1, 16, 2, 64), np.float32))
    """)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 1, proc.stderr[-4000:]
    error = [line for line in proc.stderr.splitlines() if line.startswith("jax_aiter._loader.")]
    assert len(error) == 1 and error[0].startswith(
        "jax_aiter._loader.LibraryNotFoundError: jax_aiter: the deserialized program 'attention' calls ja_mha_fwd "
        "(jax_aiter's mha_fwd), whose library is missing: jax_aiter: libmha_fwd.so not found"), proc.stderr[-3000:]
    assert "No FFI handler" not in proc.stderr
