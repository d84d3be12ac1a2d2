"""benchmarks/gpu/gpu_provenance.build_provenance: what a bench_gpu.py run timed (each library's bytes and the
build that wrote them), so that a slowdown between two runs is put on a build, or ruled out, from their JSON."""
import hashlib
import importlib
import json

import pytest


@pytest.fixture()
def prov():
    return importlib.import_module("benchmarks.gpu.gpu_provenance")


def test_each_library_found_gets_the_sha256_it_was_verified_by_and_its_records_identity(tmp_path, monkeypatch, prov):
    """Through the loader's own lookup: a folder named by JAX_AITER_LIB_DIR holds a library and the build record
    that names its build; its row carries its sha256 (hashed once, by the verify of `jax_aiter info --verify`),
    and the identity comes from that record."""
    from jax_aiter import _loader, integrity

    lib = tmp_path / "libmha_bwd.so"
    lib.write_bytes(b"not a real library" * 100)
    ident = {"kernel_source_revision": "c" * 40, "kernel_source_dirty": True, "toolchain": {"gpu_compiler": "nvcc"}}
    (tmp_path / integrity.RECORD_NAME).write_text(json.dumps({
        "identity": ident, "files": [{"name": lib.name, "size": lib.stat().st_size, "sha256": "0" * 64}]}))
    monkeypatch.setenv(_loader.LIB_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(_loader, "build_identity", lambda: None)
    got = prov.build_provenance()
    row = next(r for r in got["libraries"] if r["library"] == lib.name)
    assert row["path"] == str(lib) and row["sha256"] == hashlib.sha256(lib.read_bytes()).hexdigest()
    assert any("the file was altered" in p for p in row["problems"])  # the verify compared that digest
    assert (got["identity"], got["identity_from"]) == (ident, str(tmp_path / integrity.RECORD_NAME))


def test_a_record_names_a_build_only_with_an_identity(tmp_path):
    from jax_aiter import _loader, integrity

    for name, text, want in [("files", json.dumps({"schema": 1, "files": []}), None), ("broken", "{not json", None),
                             ("list", "[1, 2]", None), ("none", None, None),
                             ("jit", json.dumps({"identity": {"kernel_source_revision": "d" * 40}}),
                              {"kernel_source_revision": "d" * 40})]:
        folder = tmp_path / name
        folder.mkdir()
        if text is not None:
            (folder / integrity.RECORD_NAME).write_text(text)
        assert _loader.record_identity(folder) == want, name


def test_an_installed_wheels_identity_comes_first_and_none_found_says_so(tmp_path, monkeypatch, prov):
    from jax_aiter import _loader

    lib = tmp_path / "libplain.so"
    lib.write_bytes(b"x")
    monkeypatch.setattr(_loader, "library_report", lambda verify=False: [{"library": lib.name, "path": str(lib)}])
    monkeypatch.setattr(_loader, "build_identity", lambda: None)
    assert prov.build_provenance()["identity_from"] == "no build record names one"
    monkeypatch.setattr(_loader, "build_identity", lambda: {"version": "9.9", "kernel_source_revision": "d" * 40})
    got = prov.build_provenance()
    assert (got["identity"]["version"], got["identity_from"]) == ("9.9", "installed wheel")
