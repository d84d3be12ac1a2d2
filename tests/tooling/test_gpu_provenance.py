"""benchmarks/gpu/gpu_provenance.build_provenance: what a bench_gpu.py run timed (each library's bytes and the
build that wrote them), so that a slowdown between two runs is put on a build, or ruled out, from their JSON."""
import hashlib
import importlib
import json

import pytest


@pytest.fixture()
def prov():
    return importlib.import_module("benchmarks.gpu.gpu_provenance")


def _folder(tmp_path, name, record):
    folder = tmp_path / name
    folder.mkdir()
    lib = folder / f"lib{name}.so"
    lib.write_bytes(name.encode() * 1000)
    if record is not None:
        (folder / "build_record.json").write_text(record if isinstance(record, str) else json.dumps(record))
    return lib


def test_each_library_found_gets_its_sha256_and_the_first_record_naming_a_build_gives_the_identity(
        tmp_path, monkeypatch, prov):
    from jax_aiter import _loader

    shims = _folder(tmp_path, "shims", {"schema": 1, "files": []})  # a record of files only: no identity
    broken = _folder(tmp_path, "broken", "{not json")
    jit = _folder(tmp_path, "jit", {"identity": {"kernel_source_revision": "c" * 40, "kernel_source_dirty": False}})
    rows = [{"library": p.name, "path": str(p)} for p in (shims, broken, jit)]
    rows.append({"library": "libmissing.so", "path": None, "error": "not built"})
    monkeypatch.setattr(_loader, "library_report", lambda verify=False: [dict(r) for r in rows] if verify else [])
    monkeypatch.setattr(_loader, "build_identity", lambda: None)
    got = prov.build_provenance()
    assert [r.get("sha256") for r in got["libraries"]] == [
        hashlib.sha256(p.read_bytes()).hexdigest() for p in (shims, broken, jit)] + [None]
    assert got["identity"] == {"kernel_source_revision": "c" * 40, "kernel_source_dirty": False}
    assert got["identity_from"] == str(jit.parent / "build_record.json")


def test_an_installed_wheels_identity_comes_first_and_none_found_says_so(tmp_path, monkeypatch, prov):
    from jax_aiter import _loader

    lib = _folder(tmp_path, "plain", None)
    monkeypatch.setattr(_loader, "library_report", lambda verify=False: [{"library": lib.name, "path": str(lib)}])
    monkeypatch.setattr(_loader, "build_identity", lambda: None)
    assert prov.build_provenance()["identity_from"] == "no build record names one"
    monkeypatch.setattr(_loader, "build_identity", lambda: {"version": "9.9", "kernel_source_revision": "d" * 40})
    got = prov.build_provenance()
    assert (got["identity"]["version"], got["identity_from"]) == ("9.9", "installed wheel")
