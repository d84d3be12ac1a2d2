"""Identity, recipe hash, reuse gate and the reuse/rebuild decision (CPU only, a throwaway git checkout)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jatools import config
from jatools.jitlibs import decide
from jatools.native import jit_build, toolchain
from jax_aiter.download import reuse_gate
from tests.tooling.jit_libs_support import (  # noqa: F401  (pytest fixtures)
    REPO,
    checkout_fixture,
    checkout_identity,
    git,
    make_release,
    other_identity,
    run_py,
    server_fixture,
    settings_for,
    write_build,
)

# Files the compilations of the JIT libraries read (a kernel header, a template, a CPU kernel, the
# instance table's config) or that the identity itself reads (the FFI header), and files no build reads.
READ_BY_THE_BUILD = ["csrc/include/ja/dtype.h", "csrc/kernels/mha/cpu/fwd.inst.in",
                     "csrc/kernels/rmsnorm/rmsnorm_cpu.h", "third_party/xla_ffi/include/xla/ffi/api/c_api.h"]
NOT_READ = ["README.md", "docs/build.md", "tests/ops/test_rmsnorm.py", "csrc/include/ja/unused_by_any_kernel.h"]


def _cache_id(root: Path) -> str:
    return checkout_identity(root)["cache_id"]


@pytest.mark.parametrize("rel", READ_BY_THE_BUILD)
def test_editing_a_file_the_build_reads_changes_the_cache_id(checkout, rel):
    before = _cache_id(checkout)
    with open(checkout / rel, "a") as fh:
        fh.write("\n// changed\n")
    assert _cache_id(checkout) != before


@pytest.mark.parametrize("rel", NOT_READ)
def test_editing_a_file_no_build_reads_keeps_the_cache_id(checkout, rel):
    before = _cache_id(checkout)
    (checkout / rel).parent.mkdir(parents=True, exist_ok=True)
    with open(checkout / rel, "a") as fh:
        fh.write("\n// changed\n")
    assert _cache_id(checkout) == before


def test_a_module_flag_in_the_jit_config_changes_the_cache_id(checkout):
    before = _cache_id(checkout)
    cfg_path = checkout / "jax_aiter/jit/optCompilerConfig.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["modules"]["mha_fwd"]["extra_flags"]["cxx"].append("-DJA_EXTRA=1")
    cfg_path.write_text(json.dumps(cfg))
    assert _cache_id(checkout) != before


def test_op_data_in_the_op_table_keeps_the_cache_id(checkout):
    """The JIT build reads the op table for its module list and library names only; an op's FFI targets, its
    make target, what the lite wheel fetches and an op without JIT modules do not make the libraries' bytes."""
    before = _cache_id(checkout)
    table = checkout / "jax_aiter/op_table.toml"
    text = table.read_text()
    edited = (text.replace('ja_silu_and_mul = "JaSiluAndMul"', 'ja_silu_and_mul = "JaSiluAndMul", ja_silu = "JaSilu"')
              .replace("mha = true, fetched = true", "mha = false") + 'gelu = { targets = { ja_gelu = "JaGelu" } }\n')
    fetched_rows = text.count("mha = true, fetched = true")  # the attention and serving ops
    assert fetched_rows >= 2 and edited.count("mha = false") == fetched_rows and "ja_silu =" in edited
    table.write_text(edited)
    assert _cache_id(checkout) == before


def test_a_build_setting_in_pyproject_changes_the_cache_id(checkout):
    before = _cache_id(checkout)
    py = checkout / "pyproject.toml"
    py.write_text(py.read_text().replace("symbol_visible = false", "symbol_visible = true"))
    config._pyproject_defaults.cache_clear()  # settings are read once per process; this test edits them
    try:
        assert _cache_id(checkout) != before
    finally:
        config._pyproject_defaults.cache_clear()


def test_the_optimisation_flag_in_the_flag_source_changes_the_cache_id(checkout):
    """-O3 -> -O0 where the flags are made (the build tooling's toolchain module): a new cache id."""
    probe = ("from jatools import config; from jatools.native import jit_build; "
             "print(jit_build.checkout_identity(config.load(backend='cpu'))[0]['cache_id'])")
    env = {**os.environ, "JA_ROOT_DIR": str(checkout), "JA_BACKEND": "cpu",
           "PYTHONPATH": f"{checkout}{os.pathsep}{REPO}"}  # its jatools, this jax_aiter
    run = lambda: subprocess.run([sys.executable, "-c", probe], cwd=checkout, env=env, capture_output=True,
                                 text=True, check=True).stdout.strip()
    before = run()
    src = checkout / "jatools/native/toolchain.py"
    assert '"-O3"' in src.read_text()
    src.write_text(src.read_text().replace('"-O3"', '"-O0"'))
    after = run()
    assert re.fullmatch(r"[0-9a-f]{16}", before) and after != before


def test_the_checkout_path_does_not_enter_the_cache_id(checkout, tmp_path):
    """Two checkouts of the same commit in different folders share a cache id (the root path is left out)."""
    other = shutil.copytree(checkout, tmp_path / "elsewhere" / "checkout")
    assert _cache_id(other) == _cache_id(checkout)


def test_the_build_folder_does_not_enter_the_cache_id(checkout):
    """JA_BUILD_DIR moves the outputs, not what they are made of: the same cache id."""
    moved = jit_build.checkout_identity(settings_for(checkout, JA_BUILD_DIR="out/elsewhere"))[0]["cache_id"]
    assert moved == _cache_id(checkout)


def test_kernel_revision_is_the_committed_tree_and_edits_are_flagged_dirty(checkout):
    ident = checkout_identity(checkout)
    assert ident["kernel_source_revision"] == git(checkout, "rev-parse", "HEAD:csrc/kernels").strip()
    assert ident["kernel_source_dirty"] is False
    (checkout / "csrc/kernels/mha/cpu/fwd.inst.in").write_text("// edited\n")
    dirty = checkout_identity(checkout)
    assert dirty["kernel_source_dirty"] is True
    assert dirty["kernel_source_revision"] == ident["kernel_source_revision"]
    git(checkout, "commit", "-qam", "kernel v2")
    assert checkout_identity(checkout)["kernel_source_revision"] != ident["kernel_source_revision"]


def test_cache_id_ignores_arch_order_and_toolchain_but_not_gated_fields(checkout):
    ident = {**checkout_identity(checkout), "gpu_archs": ["gfx942", "gfx950"]}
    cid = reuse_gate.cache_id(ident)
    assert reuse_gate.cache_id({**ident, "gpu_archs": ["gfx950", "gfx942"]}) == cid
    assert reuse_gate.cache_id({**ident, "toolchain": {"cxx_version": "other"}}) == cid
    for field in reuse_gate.GATED_FIELDS:
        assert reuse_gate.cache_id({**ident, field: "changed"}) != cid, field


def test_compare_names_every_gated_difference_and_keeps_toolchain_advisory():
    want = {"kernel_source_revision": "a", "gpu_archs": ["gfx950", "gfx942"], "recipe_hash": "r", "backend": "rocm",
            "ffi_api_version": "0.3", "toolchain": {"platform_version": "7.14"}}
    same = reuse_gate.compare(want, {**want, "gpu_archs": ["gfx942", "gfx950"]})
    assert same.ok and not same.warnings
    newer = {**want, "toolchain": {"platform_version": "7.15"}}
    advisory = reuse_gate.compare(want, newer)
    assert advisory.ok and "platform_version: wanted 7.14, found 7.15" in advisory.warnings[0]
    strict = reuse_gate.compare(want, newer, strict_toolchain=True)
    assert not strict.ok and "platform_version" in strict.mismatches[0]
    bad = reuse_gate.compare(want, {**want, "recipe_hash": "s", "gpu_archs": ["gfx950"]})
    assert bad.mismatches == ["gpu_archs: wanted gfx942;gfx950, found gfx950", "recipe_hash: wanted r, found s"]


def test_decision_reuse_only_when_everything_gated_matches(checkout):
    want = checkout_identity(checkout)
    assert decide.decide(want, dict(want), "here").decision == "reuse"
    d = decide.decide(want, other_identity(want, recipe_hash="0" * 64), "there")
    assert d.rebuild and d.reasons == [f"recipe_hash: wanted {want['recipe_hash']}, found {'0' * 64}"]
    assert decide.decide(want, None, "nowhere").reasons == ["no build found at nowhere"]
    dirty = decide.decide({**want, "kernel_source_dirty": True}, dict(want), "here")
    assert dirty.rebuild and "uncommitted changes" in dirty.reasons[0]


def test_decide_against_a_release_writes_json_and_github_output(checkout, server, tmp_path):
    want = checkout_identity(checkout)
    out, js = tmp_path / "gh_out", tmp_path / "decision.json"
    env = {"JA_ROOT_DIR": str(checkout), "JA_BACKEND": "cpu", "GITHUB_OUTPUT": str(out)}
    miss = run_py(["-m", "invoke", "jit.decide", "--base-url", server.url, "--json-out", str(js)], env)
    assert miss.returncode == 0, miss.stderr
    assert "decide: rebuild" in miss.stdout and "no such release" in miss.stdout
    assert json.loads(js.read_text())["rebuild"] is True
    make_release(server.root, want)
    hit = run_py(["-m", "invoke", "jit.decide", "--base-url", server.url, "--json-out", str(js)], env)
    assert hit.returncode == 0, hit.stderr
    assert "decide: reuse" in hit.stdout and "recipe_hash" in hit.stdout
    decision = json.loads(js.read_text())
    assert decision["decision"] == "reuse" and decision["cache_id"] == want["cache_id"]
    lines = out.read_text().splitlines()
    assert lines[:2] == ["decision=rebuild", "rebuild=true"]
    assert "decision=reuse" in lines[4:] and "rebuild=false" in lines[4:]
    assert f"release_tag=jit-libs-{want['cache_id']}" in lines


def test_decide_against_a_local_record_names_the_changed_field(checkout, tmp_path):
    old = checkout_identity(checkout)
    write_build(tmp_path / "aiter_build", old)
    (checkout / "csrc/include/ja/dtype.h").write_text("// a header the kernels include, v2\n")
    d = decide.run_decide(settings_for(checkout), against=tmp_path / "aiter_build" / "build_record.json",
                             json_path=tmp_path / "d.json", log=lambda m: None)
    assert d.rebuild and len(d.reasons) == 1 and d.reasons[0].startswith("recipe_hash: wanted")
    (tmp_path / "aiter_build" / "libmha_fwd.so").write_bytes(b"damaged")
    d2 = decide.run_decide(settings_for(checkout), against=tmp_path / "aiter_build" / "build_record.json",
                              json_path=tmp_path / "d.json", log=lambda m: None)
    assert d2.rebuild and "libmha_fwd.so: size 7" in d2.reasons[0]


def test_consumer_without_a_gpu_compiler_still_gets_the_gated_identity(checkout, monkeypatch):
    """A test runner may have no hipcc: the identity comes from JA_BACKEND/GPU_ARCHS, toolchain unknown."""
    def no_rocm(settings, env=None, which=None, check_archs=True):
        raise toolchain.ToolchainError("JA_BACKEND=rocm but no ROCm toolchain was found")
    monkeypatch.setattr(toolchain, "detect", no_rocm)
    s = settings_for(checkout)
    s = type(s)(**{**s.__dict__, "backend": "rocm", "gpu_archs": ("gfx950",)})
    ident, notes = jit_build.checkout_identity(s)
    assert ident["backend"] == "rocm" and ident["gpu_archs"] == ["gfx950"] and ident["toolchain"] is None
    assert "toolchain not compared" in notes[0]
    cmp = reuse_gate.compare(ident, {**ident, "toolchain": {"platform_version": "7.14"}})
    assert cmp.ok and cmp.warnings == ["toolchain not compared: not detected here"]
