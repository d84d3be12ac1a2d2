"""jit.merge-manifests: per-module shards joined into one build/aiter_build, or nothing changed.

Shards are generated files standing in for libraries (no compiler), laid out as
the JIT-producer workflow downloads them: build/jit-shards/jit-shard-<job>/.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import pytest
from invoke import Context, Exit

from jatools import config
from jatools.jitlibs import merge
from jatools.jitlibs import record as jit_record
from jatools.native import jit_build
from jax_aiter.download import reuse_gate
from tests.tooling.jit_libs_support import (
    MODULES,
    REPO,
    make_checkout,
    other_identity,
    snapshot,
    write_build,
)

IDENT = other_identity({"kernel_source_revision": "a" * 40, "kernel_source_dirty": False, "gpu_archs": ["gfx950"],
                        "recipe_hash": "b" * 64, "backend": "rocm", "ffi_api_version": "0.3",
                        "toolchain": {"backend": "rocm", "cxx_version": "clang 19", "gpu_compiler": "hipcc",
                                      "gpu_compiler_version": "6.4.1", "platform_version": "6.4.1"}})


def make_shards(root: Path, idents: dict[str, dict] | None = None, modules: list[str] | None = None) -> Path:
    """One shard folder per module (as the workflow names them), each with its own build record."""
    shards = root / "jit-shards"
    for module in modules or list(MODULES):
        lib = MODULES[module]
        write_build(shards / f"jit-shard-jit_libs_rocm_{module}", (idents or {}).get(module, IDENT),
                    {lib: 3000 + len(lib)})
    return shards


@pytest.fixture
def paths(tmp_path: Path) -> tuple[dict[str, str], Path]:
    return dict(MODULES), tmp_path / "build" / "aiter_build"  # the modules the op table names, their libraries


def test_good_merge_installs_every_library_and_one_record_that_verifies(tmp_path, paths):
    wanted, dest = paths
    record = merge.merge(make_shards(tmp_path), dest, wanted, log=lambda m: None)
    assert record["identity"] == IDENT and sorted(record["modules"]) == sorted(MODULES)
    assert sorted(p.name for p in dest.iterdir()) == sorted([*MODULES.values(), "build_record.json"])
    source, n = jit_record.verify(dest)
    assert (source, n) == (str(dest / "build_record.json"), len(MODULES))
    assert not list(dest.parent.glob(".aiter_build.merge-*")), "staging folder left behind"
    # a second merge over an existing build tree replaces it in place
    merge.merge(make_shards(tmp_path), dest, wanted, log=lambda m: None)
    assert jit_record.verify(dest)[1] == len(MODULES)


def test_tampered_library_names_shard_file_and_both_hashes(tmp_path, paths):
    wanted, dest = paths
    shards = make_shards(tmp_path)
    lib = shards / "jit-shard-jit_libs_rocm_mha_fwd" / "libmha_fwd.so"
    recorded = json.loads((lib.parent / "build_record.json").read_text())["modules"]["mha_fwd"]["file"]["sha256"]
    data = bytearray(lib.read_bytes())
    data[100] ^= 0xFF
    lib.write_bytes(bytes(data))
    with pytest.raises(jit_record.JitCacheError) as e:
        merge.merge(shards, dest, wanted)
    msg = str(e.value)
    assert "shard jit-shard-jit_libs_rocm_mha_fwd" in msg and "libmha_fwd.so" in msg
    assert recorded in msg and hashlib.sha256(bytes(data)).hexdigest() in msg  # both hashes
    assert not dest.exists()


def test_gated_field_mismatch_names_shard_field_and_both_values(tmp_path, paths):
    wanted, dest = paths
    odd = other_identity(IDENT, recipe_hash="c" * 64)
    with pytest.raises(jit_record.JitCacheError) as e:
        merge.merge(make_shards(tmp_path, {"mha_bwd": odd}), dest, wanted)
    msg = str(e.value)
    assert "jit-shard-jit_libs_rocm_mha_bwd" in msg and "recipe_hash" in msg
    assert "b" * 64 in msg and "c" * 64 in msg
    assert not dest.exists()


def test_toolchain_difference_warns_and_passes_but_strict_fails(tmp_path, paths):
    wanted, dest = paths
    odd = {**IDENT, "toolchain": {**IDENT["toolchain"], "gpu_compiler_version": "6.4.3"}}
    shards = make_shards(tmp_path, {"rmsnorm_fwd": odd})
    with pytest.raises(jit_record.JitCacheError,
                       match=r"toolchain gpu_compiler_version: wanted 6\.4\.\d, found 6\.4\.\d"):
        merge.merge(shards, dest, wanted, strict=True)
    assert not dest.exists()
    warnings: list[str] = []
    record = merge.merge(shards, dest, wanted, strict=False, log=warnings.append)
    assert any("warning" in w and "gpu_compiler_version" in w and "rmsnorm_fwd" in w for w in warnings), warnings
    assert record["identity"] is None  # the modules' identities are not all the same
    assert reuse_gate.cache_id(odd) == IDENT["cache_id"]  # gated fields agree
    assert jit_record.verify(dest)[1] == len(MODULES)


def test_missing_module_is_named(tmp_path, paths):
    wanted, dest = paths
    with pytest.raises(jit_record.JitCacheError, match=r"module mha_bwd is in no shard \(expected libmha_bwd\.so\)"):
        merge.merge(make_shards(tmp_path, modules=["rmsnorm_fwd", "mha_fwd"]), dest, wanted)


def test_duplicate_module_names_both_shards(tmp_path, paths):
    wanted, dest = paths
    shards = make_shards(tmp_path)
    write_build(shards / "jit-shard-extra", IDENT, {"libmha_fwd.so": 5000})
    with pytest.raises(jit_record.JitCacheError,
                       match=r"module mha_fwd is in 2 shards: jit-shard-extra, jit-shard-jit_libs_rocm_mha_fwd"):
        merge.merge(shards, dest, wanted)


def test_failed_merge_leaves_the_previous_build_tree(tmp_path, paths):
    wanted, dest = paths
    write_build(dest, IDENT, seed=7)
    (dest / "build.ninja").write_text("# other build outputs\n")
    before = snapshot(dest)
    shards = make_shards(tmp_path)
    (shards / "jit-shard-jit_libs_rocm_mha_bwd" / "libmha_bwd.so").write_bytes(b"truncated")
    with pytest.raises(jit_record.JitCacheError, match="size 9 does not match"):
        merge.merge(shards, dest, wanted)
    assert snapshot(dest) == before
    assert not list(dest.parent.glob(".aiter_build.merge-*"))
    assert jit_record.verify(dest)[1] == len(MODULES)


def test_invoke_task_merges_then_verify_passes_and_errors_exit_1(tmp_path, monkeypatch, capsys):
    checkout = make_checkout(tmp_path / "checkout")
    monkeypatch.setenv("JA_ROOT_DIR", str(checkout))
    monkeypatch.setenv("JA_BACKEND", "cpu")
    monkeypatch.delenv("JA_BUILD_DIR", raising=False)
    monkeypatch.delenv("JA_TOOLCHAIN_STRICT", raising=False)
    spec = importlib.util.spec_from_file_location("ja_tasks_merge_under_test", REPO / "tasks.py")
    tasks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tasks)
    assert "jit.merge-manifests" in tasks.ns.task_names
    # The shards of this checkout's ROCm build (verify compares the identity with the checkout's sources, as the
    # merge job's checkout is the producer's); IDENT's made-up sources would be refused as another commit's.
    ours = jit_build.checkout_identity(config.load(env={"JA_BACKEND": "rocm", "GPU_ARCHS": "gfx950"}, root=checkout))[0]
    shards = make_shards(tmp_path, {m: ours for m in MODULES})
    tasks.jit_merge_manifests(Context(), from_=str(shards))
    tasks.jit_verify(Context())
    assert f"verify: {len(MODULES)} file(s) in {checkout / 'build/aiter_build'}" in capsys.readouterr().out
    write_build(checkout / "build" / "aiter_build", IDENT)
    with pytest.raises(Exit) as stale:  # libraries of other sources (IDENT's) are refused by name
        tasks.jit_verify(Context())
    assert ("are not this checkout's" in str(stale.value.message)
            and "kernel_source_revision" in str(stale.value.message))
    odd = {**IDENT, "toolchain": {**IDENT["toolchain"], "cxx_version": "clang 20"}}
    monkeypatch.setenv("JA_TOOLCHAIN_STRICT", "1")
    with pytest.raises(Exit) as e:
        tasks.jit_merge_manifests(Context(), from_=str(make_shards(tmp_path / "again", {"mha_fwd": odd})))
    assert e.value.code == 1 and "jit.merge-manifests: error:" in str(e.value.message)
    assert "toolchain cxx_version" in str(e.value.message)
