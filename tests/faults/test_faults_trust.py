"""Faults of the trust chain: records that list too little, too much or nothing, and records that are not
records; the wheel's pins and baked base URL. Real files, real invoke tasks (MockContext: nothing shells out)."""
from __future__ import annotations

import importlib.util
import json

import pytest
from invoke import Exit, MockContext

from tests.tooling.jit_libs_support import (  # noqa: F401  (pytest fixtures)
    MODULES,
    REPO,
    checkout_fixture,
    checkout_identity,
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
