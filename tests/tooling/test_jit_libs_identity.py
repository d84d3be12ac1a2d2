"""Identity, recipe hash, reuse gate and the reuse/rebuild decision (CPU only, a throwaway git checkout)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from jatools import config
from jatools.jitlibs import identity, jit_cache
from jatools.native import toolchain
from jax_aiter import reuse_gate
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

LISTED = ["jax_aiter/jit/build_jit.py", "jax_aiter/jit/optCompilerConfig.json", "scripts/aiter_jit_fix.patch",
          "csrc/include/ja/gpu.h"]
UNLISTED = ["README.md", "scripts/unrelated.patch", "csrc/kernels/attn/attn.inst.in"]


def _recipe(root: Path) -> str:
    s = settings_for(root)
    return identity.recipe_hash(root, s.recipe_files)


@pytest.mark.parametrize("rel", LISTED)
def test_changing_a_listed_recipe_file_changes_the_recipe_hash(checkout, rel):
    before = _recipe(checkout)
    with open(checkout / rel, "a") as fh:
        fh.write("\n// changed\n")
    assert _recipe(checkout) != before


@pytest.mark.parametrize("rel", UNLISTED)
def test_changing_an_unlisted_file_keeps_the_recipe_hash(checkout, rel):
    before = _recipe(checkout)
    with open(checkout / rel, "a") as fh:
        fh.write("\nchanged\n")
    assert _recipe(checkout) == before


def test_recipe_list_is_the_pyproject_data(checkout):
    """A file becomes part of the recipe by being listed in pyproject, nowhere else."""
    extra = checkout / "scripts/extra_recipe.txt"
    extra.write_text("v1\n")
    before = _recipe(checkout)
    extra.write_text("v2\n")
    assert _recipe(checkout) == before
    py = checkout / "pyproject.toml"
    py.write_text(py.read_text().replace('recipe_files = [', 'recipe_files = [\n  "scripts/extra_recipe.txt",'))
    config._pyproject_defaults.cache_clear()  # settings are read once per process; this test edits them
    assert "scripts/extra_recipe.txt" in settings_for(checkout).recipe_files
    with_listed = _recipe(checkout)
    extra.write_text("v3\n")
    assert _recipe(checkout) != with_listed


def test_kernel_revision_is_the_committed_tree_and_edits_are_flagged_dirty(checkout):
    ident = checkout_identity(checkout)
    assert ident["kernel_source_revision"] == git(checkout, "rev-parse", "HEAD:csrc/kernels").strip()
    assert ident["kernel_source_dirty"] is False
    (checkout / "csrc/kernels/attn/attn.inst.in").write_text("// edited\n")
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
    assert jit_cache.decide(want, dict(want), "here").decision == "reuse"
    d = jit_cache.decide(want, other_identity(want, recipe_hash="0" * 64), "there")
    assert d.rebuild and d.reasons == [f"recipe_hash: wanted {want['recipe_hash']}, found {'0' * 64}"]
    assert jit_cache.decide(want, None, "nowhere").reasons == ["no build found at nowhere"]
    dirty = jit_cache.decide({**want, "kernel_source_dirty": True}, dict(want), "here")
    assert dirty.rebuild and "uncommitted changes" in dirty.reasons[0]


def test_decide_against_a_release_writes_json_and_github_output(checkout, server, tmp_path):
    want = checkout_identity(checkout)
    out, js = tmp_path / "gh_out", tmp_path / "decision.json"
    env = {"JA_ROOT_DIR": str(checkout), "JA_BACKEND": "cpu", "GITHUB_OUTPUT": str(out)}
    miss = run_py(["ci/jit_libs_manifest.py", "decide", "--base-url", server.url, "--json-out", str(js)], env)
    assert miss.returncode == 0, miss.stderr
    assert "decide: rebuild" in miss.stdout and "no such release" in miss.stdout
    assert json.loads(js.read_text())["rebuild"] is True
    make_release(server.root, want)
    hit = run_py(["ci/jit_libs_manifest.py", "decide", "--base-url", server.url, "--json-out", str(js)], env)
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
    (checkout / "jax_aiter/jit/build_jit.py").write_text("# recipe driver v2\n")
    d = jit_cache.run_decide(settings_for(checkout), against=tmp_path / "aiter_build" / "build_record.json",
                             json_path=tmp_path / "d.json", log=lambda m: None)
    assert d.rebuild and len(d.reasons) == 1 and d.reasons[0].startswith("recipe_hash: wanted")
    (tmp_path / "aiter_build" / "libmha_fwd.so").write_bytes(b"damaged")
    d2 = jit_cache.run_decide(settings_for(checkout), against=tmp_path / "aiter_build" / "build_record.json",
                              json_path=tmp_path / "d.json", log=lambda m: None)
    assert d2.rebuild and "libmha_fwd.so: size 7" in d2.reasons[0]


def test_consumer_without_a_gpu_compiler_still_gets_the_gated_identity(checkout, monkeypatch):
    """A test runner may have no hipcc: the identity comes from JA_BACKEND/GPU_ARCHS, toolchain unknown."""
    def no_rocm(settings, env=None, which=None, check_archs=True):
        raise toolchain.ToolchainError("JA_BACKEND=rocm but no ROCm toolchain was found")
    monkeypatch.setattr(toolchain, "detect", no_rocm)
    s = settings_for(checkout)
    s = type(s)(**{**s.__dict__, "backend": "rocm", "gpu_archs": ("gfx950",)})
    ident, notes = identity.checkout_identity(s)
    assert ident["backend"] == "rocm" and ident["gpu_archs"] == ["gfx950"] and ident["toolchain"] is None
    assert "toolchain not compared" in notes[0]
    cmp = reuse_gate.compare(ident, {**ident, "toolchain": {"platform_version": "7.14"}})
    assert cmp.ok and cmp.warnings == ["toolchain not compared: not detected here"]
