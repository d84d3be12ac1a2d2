"""The consumers against a real HTTP server on 127.0.0.1: faults, kills, concurrency, the runtime loader.

Every fault must end with a clear message, a non-zero exit and the previous good state intact.
"""
from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest

from jatools.jitlibs import download
from jatools.jitlibs import record as jit_record
from jax_aiter import _loader, op_table
from jax_aiter.download import manifest as mf
from jax_aiter.download import release as fetcher
from jax_aiter.download import reuse_gate, transfer
from jax_aiter.integrity import diff_entries
from tests.tooling.jit_libs_support import (  # noqa: F401  (pytest fixtures)
    MODULES,
    REPO,
    checkout_fixture,
    checkout_identity,
    fast_fetch_env_fixture,
    make_release,
    other_identity,
    popen_py,
    run_py,
    server_fixture,
    snapshot,
    wheel_identity,
)

MHA = list(_loader.MHA_JIT_LIBS)


@pytest.fixture
def release(checkout, server):
    """A published release of the checkout's identity; returns (identity, manifest)."""
    ident = checkout_identity(checkout)
    sizes = {**dict.fromkeys(MODULES.values(), 50_000), "libmha_fwd.so": 600_000, "libmha_bwd.so": 400_000}
    return ident, make_release(server.root, ident, sizes=sizes)


def _fetch(server, ident, dest, names=None, **kw):
    return fetcher.fetch_release(server.url, ident, dest, names, opts=transfer.FetchOptions.from_env(),
                               log=lambda m: None, **kw)


def _good_previous_state(server, ident, dest) -> dict:
    """Install the release once (the previous good state) and return its snapshot."""
    _fetch(server, ident, dest)
    state = snapshot(dest)
    assert {"libmha_fwd.so", "libmha_bwd.so", "librmsnorm_fwd.so", mf.MANIFEST_NAME} <= set(state)
    return state


def test_fetch_installs_verified_libraries_and_a_second_fetch_downloads_nothing(release, server, tmp_path,
                                                                                 fast_fetch_env):
    ident, manifest = release
    dest = tmp_path / "build/aiter_build"
    result = _fetch(server, ident, dest)
    assert result.status == "fetched" and sorted(result.files) == sorted(f["name"] for f in manifest["files"])
    assert diff_entries(dest, mf.raw_entries(manifest["files"])) == []
    assert not list(dest.parent.glob(".aiter_build.fetch-*"))
    before = len(server.requests)
    assert _fetch(server, ident, dest).status == "present"
    assert [r[1].rsplit("/", 1)[-1] for r in server.requests[before:]] == [mf.MANIFEST_NAME]


def test_split_release_is_joined_and_verified(checkout, server, tmp_path, fast_fetch_env):
    ident = checkout_identity(checkout)
    manifest = make_release(server.root, ident, asset_limit=10_000)
    assert all(len(f["compressed"]["parts"]) > 1 for f in manifest["files"])
    dest = tmp_path / "out"
    _fetch(server, ident, dest)
    assert diff_entries(dest, mf.raw_entries(manifest["files"])) == []


@pytest.mark.parametrize("fault,match", [
    ("tamper", (r"libmha_fwd.so.zst: sha256 [0-9a-f]{64} does not match the manifest's [0-9a-f]{64}; the asset at "
                r"http://127.0.0.1:\d+/jit-libs-\w+/libmha_fwd.so.zst was altered or damaged")),
    ("truncate", r"connection closed early after \d+ of \d+ bytes; gave up after 3 attempts"),
    ("stall", r"stalled: no data for 0.5 s after \d+ bytes; gave up after 3 attempts.*JA_FETCH_TIMEOUT_S"),
    ("404", r"libmha_fwd.so.zst: HTTP 404 \(not found\)"),
])
def test_asset_faults_fail_clearly_and_keep_the_previous_good_state(release, server, tmp_path, fast_fetch_env,
                                                                    fault, match):
    ident, _ = release
    dest = tmp_path / "build/aiter_build"
    before = _good_previous_state(server, ident, dest)
    server.faults["libmha_fwd.so.zst"] = fault
    start = time.monotonic()
    with pytest.raises(transfer.FetchError, match=match):
        _fetch(server, ident, dest, force=True)
    assert snapshot(dest) == before
    assert not list(dest.parent.glob(".aiter_build.fetch-*"))
    if fault == "stall":  # three attempts of 0.5 s each plus backoff, not a hang
        assert len(server.gets("libmha_fwd.so.zst")) == 1 + 3 and time.monotonic() - start < 10


def test_a_stall_or_truncation_once_is_retried_and_resumed(release, server, tmp_path, fast_fetch_env):
    ident, manifest = release
    server.faults["libmha_fwd.so.zst"] = "truncate_once"
    server.faults["libmha_bwd.so.zst"] = "stall_once"
    dest = tmp_path / "out"
    assert _fetch(server, ident, dest).status == "fetched"
    assert diff_entries(dest, mf.raw_entries(manifest["files"])) == []
    fwd = server.gets("libmha_fwd.so.zst")
    assert len(fwd) == 2 and fwd[0][2] is None and fwd[1][2].startswith("bytes=")  # resumed with a range request
    assert len(server.gets("libmha_bwd.so.zst")) == 2


def test_a_retry_from_a_server_that_ignores_ranges_skips_what_was_taken(release, server, tmp_path, fast_fetch_env):
    ident, manifest = release
    server.faults["libmha_fwd.so.zst"] = "truncate_once"
    server.ignore_range = True  # the retry gets the whole part again (200), not the rest (206)
    dest = tmp_path / "out"
    assert _fetch(server, ident, dest).status == "fetched"
    assert diff_entries(dest, mf.raw_entries(manifest["files"])) == []
    fwd = server.gets("libmha_fwd.so.zst")
    assert len(fwd) == 2 and fwd[1][2].startswith("bytes=")


def test_no_release_is_a_miss_that_names_the_fix(checkout, server, tmp_path, fast_fetch_env):
    ident = checkout_identity(checkout)
    dest = tmp_path / "out"
    with pytest.raises(transfer.ReleaseNotFound, match=rf"no release jit-libs-{ident['cache_id']} at {server.url}.*"
                                                     r"nox -s jit.*invoke jit.publish"):
        _fetch(server, ident, dest)
    assert not dest.exists()


def test_manifest_of_another_identity_is_refused(checkout, server, tmp_path, fast_fetch_env):
    ident = checkout_identity(checkout)
    other = other_identity(ident, recipe_hash="0" * 64)
    make_release(server.root, other)
    # a release folder holding the wrong (but self-consistent) manifest, e.g. a mis-uploaded one
    os.rename(server.root / reuse_gate.release_tag(other["cache_id"]),
              server.root / reuse_gate.release_tag(ident["cache_id"]))
    dest = tmp_path / "out"
    with pytest.raises(transfer.FetchError, match=rf"is for another build identity: release tag: wanted "
                                               rf"jit-libs-{ident['cache_id']}, found jit-libs-{other['cache_id']}; "
                                               rf"recipe_hash: wanted {ident['recipe_hash']}, found 0{{64}}"):
        _fetch(server, ident, dest)
    assert not dest.exists()


def test_manifest_with_an_unknown_schema_is_refused(release, server, tmp_path, fast_fetch_env):
    ident, manifest = release
    dest = tmp_path / "out"
    before = _good_previous_state(server, ident, dest)
    path = server.root / manifest["release_tag"] / mf.MANIFEST_NAME
    path.write_text(json.dumps({**manifest, "schema": 2}))
    with pytest.raises(mf.ManifestError, match="schema 2, but this jax-aiter reads schema 1 only"):
        _fetch(server, ident, dest, force=True)
    assert snapshot(dest) == before


def test_toolchain_difference_warns_by_default_and_refuses_when_strict(checkout, server, tmp_path, fast_fetch_env):
    ident = checkout_identity(checkout)
    built_with = {**ident, "toolchain": {**ident["toolchain"], "cxx_version": "g++ 99.0"}}
    make_release(server.root, built_with)
    logs: list[str] = []
    fetcher.fetch_release(server.url, ident, tmp_path / "a", opts=transfer.FetchOptions.from_env(), log=logs.append)
    assert any("warning: toolchain cxx_version: wanted" in m and "found g++ 99.0 (advisory" in m for m in logs)
    with pytest.raises(transfer.FetchError, match="toolchain cxx_version"):
        _fetch(server, ident, tmp_path / "b", strict_toolchain=True)
    assert not (tmp_path / "b").exists()


def test_unwritable_destination_fails_before_downloading(release, server, tmp_path, fast_fetch_env):
    ident, _ = release
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    before = len(server.requests)
    with pytest.raises(transfer.FetchError, match=r"cannot write to .*a_file.*choose a writable destination"):
        _fetch(server, ident, blocker / "cache" / "x")
    assert blocker.read_text() == "not a folder"
    assert [r for r in server.requests[before:] if not r[1].endswith(mf.MANIFEST_NAME)] == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores folder permissions; the not-a-folder case covers it")
def test_read_only_destination_keeps_the_previous_good_state(release, server, tmp_path, fast_fetch_env):
    ident, _ = release
    dest = tmp_path / "ro" / "aiter_build"
    before = _good_previous_state(server, ident, dest)
    (tmp_path / "ro").chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        with pytest.raises(transfer.FetchError, match="cannot write to"):
            _fetch(server, ident, dest, force=True)
    finally:
        (tmp_path / "ro").chmod(0o755)
    assert snapshot(dest) == before


# --- real processes: jax-aiter-fetch-mha ---------------------------------------------------------------------

def _identity_file(tmp_path: Path, ident: dict, base_url: str | None) -> Path:
    path = tmp_path / "_build_identity.json"
    path.write_text(json.dumps(wheel_identity(ident, base_url)))
    return path


def test_fetch_mha_uses_the_baked_base_url_and_the_loader_finds_the_libraries(release, server, tmp_path,
                                                                             monkeypatch):
    ident, manifest = release
    idf = _identity_file(tmp_path, ident, server.url)
    monkeypatch.setattr(_loader, "IDENTITY_FILE", idf)
    monkeypatch.setattr(_loader, "PACKAGED_LIB_DIR", tmp_path / "no_wheel_libs")
    monkeypatch.setenv("JA_ROOT_DIR", str(tmp_path / "no_checkout"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("JAX_AITER_LIB_DIR", raising=False)
    monkeypatch.delenv("JA_FETCH_BASE_URL", raising=False)
    with pytest.raises(_loader.LibraryNotFoundError, match="jax-aiter-fetch-mha"):
        _loader.find_library("libmha_fwd.so")
    proc = run_py(["-m", "jax_aiter.fetch_mha", "--identity", str(idf)],
                  {"XDG_CACHE_HOME": str(tmp_path / "xdg"), "JA_FETCH_BASE_URL": ""})
    assert proc.returncode == 0, proc.stderr
    cache = tmp_path / "xdg" / "jax-aiter" / "0.1.0" / ident["cache_id"]
    assert _loader.fetch_cache_dir() == cache
    assert _loader.find_library("libmha_fwd.so") == cache / "libmha_fwd.so"
    assert sorted(p.name for p in cache.iterdir()) == sorted(MHA + [mf.MANIFEST_NAME])
    assert diff_entries(cache, mf.raw_entries(mf.select_files(manifest, MHA))) == []
    assert not server.gets("librmsnorm_fwd.so.zst")  # only what a lite wheel lacks


def test_fetch_mha_honours_the_environment_base_url_and_lib_dir(release, server, tmp_path):
    ident, _ = release
    idf = _identity_file(tmp_path, ident, "http://127.0.0.1:9/never-used")
    proc = run_py(["-m", "jax_aiter.fetch_mha", "--identity", str(idf)],
                  {"JA_FETCH_BASE_URL": server.url, "JAX_AITER_LIB_DIR": str(tmp_path / "libs")})
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "libs" / "libmha_bwd.so").is_file()


def test_fetch_mha_without_an_installed_wheel_says_what_to_run_instead(tmp_path):
    proc = run_py(["-m", "jax_aiter.fetch_mha", "--base-url", "http://127.0.0.1:9"])
    assert proc.returncode == 1
    assert "not an installed wheel" in proc.stderr and "invoke jit.fetch" in proc.stderr


def test_fetch_mha_checks_the_gpu_arch_unless_told_not_to(checkout, server, tmp_path):
    ident = other_identity(checkout_identity(checkout), backend="rocm", gpu_archs=["gfx950"])
    make_release(server.root, ident, sizes=dict.fromkeys(op_table.fetched_libraries(op_table.load()).values(), 20_000))
    fake_bin = tmp_path / "bin"  # stands in for ROCm's rocminfo on a machine with an MI300 (gfx942)
    fake_bin.mkdir()
    (fake_bin / "rocminfo").write_text("#!/bin/sh\necho '  Name:                    gfx942'\n")
    (fake_bin / "rocminfo").chmod(0o755)
    idf = _identity_file(tmp_path, ident, server.url)
    env = {"PATH": f"{fake_bin}:{os.environ['PATH']}", "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    refused = run_py(["-m", "jax_aiter.fetch_mha", "--identity", str(idf)], env)
    assert refused.returncode == 1
    assert "GPUs are gfx942 (rocminfo)" in refused.stderr and "built for gfx950" in refused.stderr
    assert "--skip-arch-check" in refused.stderr and not server.gets("libmha_fwd.so.zst")
    forced = run_py(["-m", "jax_aiter.fetch_mha", "--identity", str(idf), "--skip-arch-check"], env)
    assert forced.returncode == 0, forced.stderr


def _wait_for(cond, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out waiting"
        time.sleep(0.02)


@pytest.mark.parametrize("previous", [False, True], ids=["fresh", "over-a-good-install"])
def test_a_fetch_killed_mid_download_leaves_the_previous_state_and_the_next_one_cleans_up(
        release, server, tmp_path, previous):
    ident, manifest = release
    idf = _identity_file(tmp_path, ident, server.url)
    dest = tmp_path / "cache" / ident["cache_id"]
    args = ["-m", "jax_aiter.fetch_mha", "--identity", str(idf), "--dest", str(dest)]
    if previous:
        assert run_py(args).returncode == 0
    before = snapshot(dest)
    server.faults["libmha_fwd.so.zst"] = "slow"
    server.slow_chunk, server.slow_pause = 2048, 0.05  # about 40 kB/s: seconds to kill it mid-download
    sent_before = server.sent.get("libmha_fwd.so.zst", 0)
    proc = popen_py(args + ["--force"])
    _wait_for(lambda: server.sent.get("libmha_fwd.so.zst", 0) >= sent_before + 8192)
    proc.kill()
    proc.wait(10)
    assert list(dest.parent.glob(f".{dest.name}.fetch-*")), "the killed fetch should have left its staging folder"
    assert snapshot(dest) == before  # nothing half-written where the loader looks
    del server.faults["libmha_fwd.so.zst"]
    done = run_py(args)
    assert done.returncode == 0, done.stderr
    assert "fetch: removing leftovers of an interrupted run" in done.stderr
    assert not list(dest.parent.glob(f".{dest.name}.fetch-*"))
    assert diff_entries(dest, mf.raw_entries(mf.select_files(manifest, MHA))) == []


def test_two_fetches_at_once_download_once_and_agree(release, server, tmp_path):
    ident, manifest = release
    idf = _identity_file(tmp_path, ident, server.url)
    dest = tmp_path / "cache" / ident["cache_id"]
    server.faults["libmha_fwd.so.zst"] = "slow"
    server.slow_chunk, server.slow_pause = 4096, 0.05  # over a second: the second process starts meanwhile
    args = ["-m", "jax_aiter.fetch_mha", "--identity", str(idf), "--dest", str(dest)]
    procs = [popen_py(args), popen_py(args)]
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    stderr = "".join(o[1] for o in outs)
    assert "waiting for it" in stderr and "already in" in stderr
    assert len(server.gets("libmha_fwd.so.zst")) == 1 and len(server.gets("libmha_bwd.so.zst")) == 1
    assert diff_entries(dest, mf.raw_entries(mf.select_files(manifest, MHA))) == []


# --- CI consumer: invoke jit.fetch's code path ------------------------------------------------------------------

def test_ci_fetch_installs_into_the_build_tree_with_a_build_record(release, server, checkout, monkeypatch,
                                                                  fast_fetch_env):
    ident, manifest = release
    monkeypatch.setenv("JA_FETCH_BASE_URL", server.url)
    from tests.tooling.jit_libs_support import settings_for
    settings = settings_for(checkout)
    download.run_fetch(settings, log=lambda m: None)
    record = json.loads((settings.jit_dir / "build_record.json").read_text())
    assert record["identity"] == ident and record["files"] == mf.raw_entries(manifest["files"])
    assert set(record["modules"]) == set(MODULES)
    assert jit_record.verify(settings.jit_dir)[1] == len(MODULES)
    summary = json.loads((settings.build_dir / "jit_libs_fetch.json").read_text())
    assert summary["status"] == "fetched" and summary["downloaded_bytes"] == sum(
        f["compressed"]["size"] for f in manifest["files"])
    (checkout / "csrc/kernels/mha/cpu/fwd.inst.in").write_text("// edited, not committed\n")
    with pytest.raises(jit_record.JitCacheError, match="uncommitted changes"):
        download.run_fetch(settings, log=lambda m: None)


def test_ci_wrapper_script_fetches_and_fails_on_a_miss(release, server, checkout):
    import subprocess
    import sys

    from tests.tooling.jit_libs_support import FAST_FETCH_ENV
    env = {**os.environ, **FAST_FETCH_ENV, "JA_ROOT_DIR": str(checkout), "JA_BACKEND": "cpu",
           "PYTHON": sys.executable}
    miss = subprocess.run(["bash", str(REPO / "ci/fetch_jit_libs.sh"), "--base-url", server.url + "/nothing-here"],
                          check=False, capture_output=True, text=True, env=env, timeout=60)
    assert miss.returncode == 1 and "no release jit-libs-" in miss.stderr
    assert not (checkout / "build/aiter_build").exists()
    ok = subprocess.run(["bash", str(REPO / "ci/fetch_jit_libs.sh"), "--base-url", server.url],
                        check=False, capture_output=True, text=True, env=env, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert (checkout / "build/aiter_build/build_record.json").is_file()
