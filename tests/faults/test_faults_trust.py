"""Faults of the trust chain: records that list too little, too much or nothing, and records that are not
records; the wheel's pins and baked base URL. Real files, real invoke tasks (MockContext: nothing shells out)."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from invoke import Exit, MockContext

from jatools import release
from tests.tooling.jit_libs_support import (  # noqa: F401  (pytest fixtures)
    FAST_FETCH_ENV,
    MODULES,
    REPO,
    FaultServer,
    checkout_fixture,
    checkout_identity,
    make_release,
    server_fixture,
    write_build,
)


@pytest.fixture
def tasks(checkout, monkeypatch):
    monkeypatch.setenv("JA_ROOT_DIR", str(checkout))
    monkeypatch.setenv("JA_BACKEND", "cpu")
    spec = importlib.util.spec_from_file_location("ja_tasks_faults", REPO / "tasks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def jit(checkout):
    folder = checkout / "build/aiter_build"
    write_build(folder, checkout_identity(checkout))
    return folder


def _verify_fails(tasks) -> str:
    with pytest.raises(Exit) as exc:
        tasks.ns["verify"](MockContext())
    assert exc.value.code == 1
    return exc.value.message


def _edit_record(jit, change) -> None:
    path = jit / "build_record.json"
    record = json.loads(path.read_text())
    change(record)
    path.write_text(json.dumps(record))


def test_faults_verify_record_listing_nothing_fails(tasks, jit):
    tasks.ns["verify"](MockContext())  # the good state passes
    _edit_record(jit, lambda r: r.update(files=[]))
    msg = _verify_fails(tasks)
    for lib in MODULES.values():
        assert f"{lib}: the op table names it, but {jit / 'build_record.json'} does not list it" in msg


def test_faults_verify_dropped_and_tampered_library_fails(tasks, jit):
    _edit_record(jit, lambda r: r.update(files=[f for f in r["files"] if f["name"] != "libmha_fwd.so"]))
    (jit / "libmha_fwd.so").write_bytes(b"\0" * 1000)
    msg = _verify_fails(tasks)
    assert "libmha_fwd.so: the op table names it" in msg
    assert f"{jit / 'libmha_fwd.so'}: a library in the folder that" not in msg  # named once, as the op table's


def test_faults_verify_unlisted_and_extra_libraries_fail(tasks, jit):
    (jit / "libstray.so").write_bytes(b"stray")
    _edit_record(jit, lambda r: r["files"].append({"name": "libextra.so", "size": 1, "sha256": "0" * 64}))
    msg = _verify_fails(tasks)
    assert f"{jit / 'libstray.so'}: a library in the folder that" in msg and "does not list" in msg
    assert "libextra.so: listed in" in msg and "the op table" in msg


@pytest.mark.parametrize("text, says", [("{not json", "is not valid JSON"), ('{"modules": {}}', "has no `files` list"),
                                        ('{"files": [{"name": "x"}]}', "files[0] is not a unique {name, size, sha256}")])
def test_faults_verify_bad_record_names_the_file(tasks, jit, text, says):
    (jit / "build_record.json").write_text(text)
    msg = _verify_fails(tasks)
    assert f"{jit / 'build_record.json'}" in msg and says in msg and "Traceback" not in msg


def _release_fetch(checkout, base_url: str, producer: str) -> subprocess.CompletedProcess:
    """The release's jit stage, as it runs it (a real process)."""
    env = {**os.environ, **FAST_FETCH_ENV, "JA_ROOT_DIR": str(checkout), "JA_BACKEND": "cpu"}
    return subprocess.run([sys.executable, str(REPO / "ci/jit_libs_manifest.py"), "fetch", "--base-url", base_url,
                           "--pins-from", producer], env=env, capture_output=True, text=True, timeout=120, check=False)


def test_faults_release_refuses_a_fetched_set_other_than_the_producers(checkout, server, tmp_path):
    """The producer published its libraries (server); a mirror serves a self-consistent release of the same cache
    id with other bytes: the release's fetch refuses it before downloading. The same bytes from a mirror pass."""
    ident = checkout_identity(checkout)
    make_release(server.root, ident)
    for name, seed in (("evil", 1), ("mirror", 0)):
        (tmp_path / name).mkdir()
        make_release(tmp_path / name, ident, seed=seed)
    with FaultServer(tmp_path / "evil") as evil:
        bad = _release_fetch(checkout, evil.url, server.url)
        downloaded = [r for r in evil.requests if not r[1].endswith("jit-libs-manifest.json")]
    assert bad.returncode == 1 and "offers libraries other than the pinned ones" in bad.stderr, bad.stderr
    assert not downloaded and not (checkout / "build/aiter_build").exists()
    with FaultServer(tmp_path / "mirror") as mirror:
        good = _release_fetch(checkout, mirror.url, server.url)
    assert good.returncode == 0, good.stderr
    assert "pinned to the 3 libraries the producer published at" in good.stdout + good.stderr


def test_faults_release_pins_its_fetch_to_the_producers_base_url():
    from jatools import config

    jit = next(s for s in release.stages("http://mirror.example") if s.name == "jit")
    argv = jit.argv(release.Context(REPO, sys.executable, "http://mirror.example", {}))
    assert argv[argv.index("--base-url") + 1] == "http://mirror.example"
    assert argv[argv.index("--pins-from") + 1] == config.load().raw["jit_libs_base_url"]
