"""The op table (jax_aiter/op_table.toml) is the one home of the ops: adding one is one row.

A scratch copy of the checkout gets one new row (plus its JIT module's compile settings, the kernel part, and
its Python op); the Makefile, the wheel layout, the loader, the JIT build, the CI producer's shards and the
public API all pick it up with nothing else edited (docs/architecture.md, "Adding an op").
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jatools import config
from jatools.native import jit_build, jit_modules
from jatools.wheel.wheel_layout import Layout
from jax_aiter import op_table
from tests.build.scratch import REPO, env_for, make_scratch, run

ROW = ('gelu_and_mul = { targets = { ja_gelu_and_mul = "JaGeluAndMul" }, jit = ["gelu_fwd"], mha = true, '
       'fetched = true, python = "gelu", api = ["gelu_and_mul"] }\n')


def add_op(root: Path) -> None:
    """The new op: one row in the op table, and its JIT module's compile settings (its kernel's part)."""
    table = root / "jax_aiter/op_table.toml"
    table.write_text(table.read_text() + ROW)
    cfg_path = root / "jax_aiter/jit/optCompilerConfig.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["modules"]["gelu_fwd"] = {**cfg["modules"]["rmsnorm_fwd"], "symbol": "ja_gelu_fwd_{backend}__{dtype}"}
    cfg_path.write_text(json.dumps(cfg))
    (root / "jax_aiter/ops/gelu.py").write_text("def gelu_and_mul(x):\n    return x\n")  # its Python op


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    root = make_scratch(tmp_path_factory.mktemp("op-table"))
    shutil.copytree(REPO / "ci", root / "ci", ignore=shutil.ignore_patterns("__pycache__"))
    run(["make", "-n", f"PYTHON={sys.executable}", "ja_mods"], root)  # writes build/config.mk from the old table
    mk = root / "build/config.mk"
    assert "gelu" not in mk.read_text()
    earlier = mk.stat().st_mtime - 10  # older than the table edited next, whatever the clock's resolution
    os.utime(mk, (earlier, earlier))
    add_op(root)
    return root


def test_make_builds_the_new_shim_in_ja_mods_only(scratch):
    full = run(["make", "-n", f"PYTHON={sys.executable}", "ja_mods"], scratch)
    assert "jax-aiter: backend cpu" in full.stderr, "the op table changed, so build/config.mk is regenerated"
    mk = (scratch / "build/config.mk").read_text()
    assert ("SHIMS_MHA := mha_fwd mha_bwd append_kv paged_attn gelu_and_mul\n" in mk
            and "JIT_gelu_and_mul := gelu_fwd\n" in mk)
    link = next(line for line in full.stdout.splitlines() if "-o build/jax_aiter_build/gelu_and_mul_ja.so.tmp" in line)
    assert "-lgelu_fwd -ljax_aiter" in link and "-soname=gelu_and_mul_ja.so" in link
    assert "--module gelu_fwd" in full.stdout, "the missing JIT library's error names the new module"
    core = run(["make", "-n", f"PYTHON={sys.executable}", "ja_mods_nomha"], scratch).stdout
    assert "gelu_and_mul_ja.so" not in core and "-soname=silu_and_mul_ja.so" in core


def test_the_wheel_layout_holds_the_new_libraries(scratch):
    layout = Layout.load(root=scratch)
    assert layout.libraries["libgelu_fwd.so"].module == "gelu_fwd" and layout.libraries["libgelu_fwd.so"].kind == "jit"
    assert layout.libraries["gelu_and_mul_ja.so"].op == "gelu_and_mul"
    lite, full = layout.variant("lite"), layout.variant("full")
    assert "gelu_and_mul_ja.so" in lite.libraries and "libgelu_fwd.so" not in lite.libraries
    assert lite.fetched == ("libmha_fwd.so", "libmha_bwd.so", "libpaged_attn.so", "libgelu_fwd.so")
    assert {"gelu_and_mul_ja.so", "libgelu_fwd.so"} <= set(full.libraries) and not full.fetched


def test_the_loader_registers_the_new_targets(scratch):
    code = ("from jax_aiter import _loader; op = _loader.OPS['gelu_and_mul']\n"
            "print(_loader.__file__, op.shim, op.jit, op.targets, _loader.MHA_JIT_LIBS)")
    out = subprocess.run([sys.executable, "-c", code], cwd=scratch, env=env_for(scratch), capture_output=True,
                         text=True, check=True).stdout.split(" ", 1)
    assert out[0].startswith(str(scratch)), "the scratch copy's loader"
    assert out[1].strip() == ("gelu_and_mul_ja.so ('libgelu_fwd.so',) (('ja_gelu_and_mul', 'JaGeluAndMul'),) "
                              "('libmha_fwd.so', 'libmha_bwd.so', 'libpaged_attn.so', 'libgelu_fwd.so')")


def test_the_jit_build_builds_the_new_module(scratch):
    settings = config.load(backend="cpu", root=scratch, env={})
    assert jit_build.libraries(settings) == {"rmsnorm_fwd": "librmsnorm_fwd.so", "mha_fwd": "libmha_fwd.so",
                                             "mha_bwd": "libmha_bwd.so", "paged_attn": "libpaged_attn.so",
                                             "gelu_fwd": "libgelu_fwd.so"}


def test_the_ci_producer_builds_a_shard_of_the_new_module(scratch):
    out = run([sys.executable, "ci/build.py", "--dump_commands"], scratch, env_for(scratch, PYTHONPATH=str(scratch)))
    builds = [b.split("\n", 1) for b in out.stdout.split("# BEGIN ")[1:]]  # [name, its commands]
    shards = [name for name, commands in builds if "--module gelu_fwd" in commands]
    # the checkout's driver: the scratch copy's is the same file
    from tests.tooling.test_ci_build import ci_build

    backends = [b for b, _, _ in ci_build.PRODUCER_BACKENDS]  # a shard per producer backend, the new module too
    assert len(backends) >= 2 and shards == sorted(f"jit_libs_{b}_gelu_fwd" for b in backends), (shards, backends)


def test_the_public_api_exports_the_new_function(scratch):
    code = "import jax_aiter; print(jax_aiter.__file__, 'gelu_and_mul' in jax_aiter.__all__, jax_aiter.gelu_and_mul)"
    out = subprocess.run([sys.executable, "-c", code], cwd=scratch, env=env_for(scratch, PYTHONPATH=str(scratch)),
                         capture_output=True, text=True, check=True).stdout.split(" ", 1)
    assert out[0].startswith(str(scratch)) and out[1].startswith("True <function gelu_and_mul"), out


@pytest.fixture
def tables(tmp_path) -> tuple[config.Settings, Path, Path]:
    """Settings of a checkout at tmp_path holding only the op table and the JIT config."""
    for rel in ("jax_aiter/op_table.toml", "jax_aiter/jit/optCompilerConfig.json"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((config.REPO_ROOT / rel).read_text())
    settings = dataclasses.replace(config.load(backend="cpu", env={}), root=tmp_path,
                                   jit_config=tmp_path / "jax_aiter/jit/optCompilerConfig.json")
    return settings, tmp_path / "jax_aiter/op_table.toml", settings.jit_config


def test_the_jit_config_and_the_op_table_must_name_the_same_modules(tables):
    settings, table, cfg_path = tables
    assert list(jit_modules.module_table(settings)) == ["rmsnorm_fwd", "mha_fwd", "mha_bwd", "paged_attn"]  # they agree
    original = table.read_text()
    table.write_text(original + ROW)
    with pytest.raises(op_table.OpTableError, match=r"module gelu_fwd is needed by the op table .* but has no "
                                                    r"compile settings in .*optCompilerConfig.json"):
        jit_modules.module_table(settings)
    table.write_text(original.replace(', jit = ["mha_bwd"], mha = true, fetched = true', ""))
    with pytest.raises(op_table.OpTableError, match="module mha_bwd has compile settings in .* but no op in"):
        jit_modules.module_table(settings)
    table.write_text(original)
    cfg = json.loads(cfg_path.read_text())
    cfg["modules"]["mha_fwd"]["library"] = "libattention.so"
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(op_table.OpTableError, match=r"module mha_fwd names `library` .*derived \(libmha_fwd.so\)"):
        jit_modules.module_table(settings)


@pytest.mark.parametrize("row, why", [
    ('x = { targets = { ja_x = "JaX" }, shim = "x.so" }', "a row is a table with `targets`"),
    ('x = { jit = ["x"] }', "a row is a table with `targets`"),
    ('x = { targets = {} }', "targets/jit/api has the wrong type"),
    ('x = { targets = { ja_x = "JaX" }, api = ["x"] }', "`api` .the public functions. and `python`"),
    ('x = { targets = { ja_x = "JaX" }, python = "x" }', "`api` .the public functions. and `python`"),
    ('x = { targets = { ja_x = "JaX" }, python = "x", api = ["rms_norm"] }', "rms_norm is in the `api` of more"),
    ('x = { targets = { ja_x = "JaX" }, jit = "x" }', "jit has the wrong type"),
    ('x = { targets = { ja_x = "JaX" }, mha = "yes" }', "mha has the wrong type"),
    ('x = { targets = { ja_x = "JaX" }, fetched = true }', "fetched = true but it names no JIT module"),
    ('x = { targets = { ja_x = "JaX" }, jit = ["mha_fwd"] }',
     "JIT module mha_fwd is fetched for mha_fwd but packaged for x"),
])
def test_a_bad_row_is_refused_naming_the_op_and_the_rule(tables, row, why):
    _, table, _ = tables
    table.write_text(table.read_text() + row + "\n")
    with pytest.raises(op_table.OpTableError, match=f"op_table.toml: .*{why.replace('(', '.').replace(')', '.')}"):
        op_table.load(table.parents[1])


def test_a_table_of_another_schema_is_refused(tables):
    _, table, _ = tables
    table.write_text(table.read_text().replace("schema = 1", "schema = 2"))
    with pytest.raises(op_table.OpTableError, match="expected schema = 1 and an .ops. table, found schema 2"):
        op_table.load(table.parents[1])
