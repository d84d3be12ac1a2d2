"""Manifest schema and the producer: zstd, verification, splitting, manifest last, upload targets."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from jatools.jitlibs import publish
from jax_aiter.download import blob, reuse_gate
from jax_aiter.download import manifest as mf
from jax_aiter.integrity import sha256_file, sha256_files
from tests.tooling.jit_libs_support import (  # noqa: F401  (pytest fixtures)
    MODULES,
    checkout_fixture,
    checkout_identity,
    make_release,
    run_py,
    server_fixture,
    settings_for,
    write_build,
)


def _publish(root: Path, to: str, **kw) -> dict:
    kw.setdefault("level", 3)
    kw.setdefault("window_log", 20)
    return publish.publish(settings_for(root), to, log=lambda m: None, **kw)


def _manifest_at(folder: Path) -> dict:
    path = folder / mf.MANIFEST_NAME
    return mf.parse(path.read_bytes(), str(path))


def test_published_release_round_trips_and_documents_every_byte(checkout, tmp_path):
    ident = checkout_identity(checkout)
    record = write_build(checkout / "build/aiter_build", ident)
    summary = _publish(checkout, str(tmp_path / "rel"))
    tag = reuse_gate.release_tag(ident["cache_id"])
    assert summary["status"] == "published" and summary["release_tag"] == tag
    m = _manifest_at(tmp_path / "rel" / tag)
    assert m["identity"] == ident and m["compression"] == {"codec": "zstd", "level": 3, "window_log": 20,
                                                            "long_distance_matching": True}
    assert mf.raw_entries(m["files"]) == record["files"]
    for f in m["files"]:
        c = f["compressed"]
        assert f["module"] in MODULES and c["name"] == f["name"] + ".zst" and len(c["parts"]) == 1
        asset = tmp_path / "rel" / tag / c["name"]
        assert asset.stat().st_size == c["size"] < f["size"] and sha256_file(asset) == c["sha256"]
        size, sha, comp_sha = blob.decode([asset], 20, f["size"])
        assert (size, sha, comp_sha) == (f["size"], f["sha256"], c["sha256"])
    assert (json.loads((checkout / "build/jit-libs-publish" / f"{tag}-summary.json").read_text())["assets"]
            == len(MODULES))


def test_blobs_over_the_asset_limit_are_split_into_hashed_parts(checkout, tmp_path):
    ident = checkout_identity(checkout)
    write_build(checkout / "build/aiter_build", ident, sizes={lib: 300_000 for lib in MODULES.values()})
    _publish(checkout, str(tmp_path / "rel"), asset_limit=8_000)
    folder = tmp_path / "rel" / reuse_gate.release_tag(ident["cache_id"])
    m = _manifest_at(folder)
    for f in m["files"]:
        parts = f["compressed"]["parts"]
        assert len(parts) > 1 and all(p["size"] <= 8_000 for p in parts)
        assert [p["name"] for p in parts] == [f"{f['name']}.zst.part{i:03d}" for i in range(len(parts))]
        assert sha256_files([folder / p["name"] for p in parts]) == {str(folder / p["name"]): p["sha256"]
                                                                    for p in parts}
        assert blob.decode([folder / p["name"] for p in parts], 20, f["size"])[1] == f["sha256"]


def test_manifest_is_uploaded_last_over_http_put(checkout, server):
    ident = checkout_identity(checkout)
    write_build(checkout / "build/aiter_build", ident)
    _publish(checkout, server.url)
    puts = [r[1] for r in server.requests if r[0] == "PUT"]
    assert len(puts) == len(MODULES) + 1 and puts[-1].endswith("/" + mf.MANIFEST_NAME)
    assert _manifest_at(server.root / reuse_gate.release_tag(ident["cache_id"]))["identity"] == ident


def test_folder_and_file_url_targets_are_the_same_place(checkout, tmp_path):
    ident = checkout_identity(checkout)
    write_build(checkout / "build/aiter_build", ident)
    _publish(checkout, (tmp_path / "rel").as_uri())
    again = _publish(checkout, str(tmp_path / "rel"))
    assert again["status"] == "already-published"


def test_a_published_release_is_never_overwritten_with_other_bytes(checkout, tmp_path):
    ident = checkout_identity(checkout)
    write_build(checkout / "build/aiter_build", ident, seed=1)
    _publish(checkout, str(tmp_path / "rel"))
    folder = tmp_path / "rel" / reuse_gate.release_tag(ident["cache_id"])
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    write_build(checkout / "build/aiter_build", ident, seed=2)
    with pytest.raises(publish.PublishError, match="already published .* with other bytes; releases are immutable"):
        _publish(checkout, str(tmp_path / "rel"))
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


@pytest.mark.parametrize("problem,match", [
    ("dirty", "uncommitted changes"),
    ("damaged", "differ from their build record: .*libmha_bwd.so: sha256 [0-9a-f]{64} does not match the recorded"),
    ("missing_module", "mha_bwd are configured but not built"),
    ("mixed", "built with different identities"),
])
def test_publishing_refuses_a_build_it_cannot_vouch_for(checkout, tmp_path, problem, match):
    ident = checkout_identity(checkout)
    jit = checkout / "build/aiter_build"
    if problem == "dirty":
        write_build(jit, {**ident, "kernel_source_dirty": True})
    elif problem == "damaged":
        write_build(jit, ident)
        data = bytearray((jit / "libmha_bwd.so").read_bytes())
        data[100] ^= 1
        (jit / "libmha_bwd.so").write_bytes(bytes(data))
    elif problem == "missing_module":
        write_build(jit, ident, sizes={lib: 1000 for lib in MODULES.values() if lib != "libmha_bwd.so"})
    else:
        record = write_build(jit, ident)
        record["modules"]["mha_bwd"]["identity"] = {**ident, "recipe_hash": "1" * 64}
        record["identity"] = None
        (jit / "build_record.json").write_text(json.dumps(record))
    with pytest.raises(publish.PublishError, match=match):
        _publish(checkout, str(tmp_path / "rel"))
    assert not (tmp_path / "rel").exists()


def test_a_blob_that_does_not_decode_to_the_library_is_caught_before_upload(checkout, tmp_path, monkeypatch):
    ident = checkout_identity(checkout)
    write_build(checkout / "build/aiter_build", ident)
    real = publish.compress

    def corrupting(src, out_dir, *args):
        entry = real(src, out_dir, *args)
        if src.name == "libmha_fwd.so":
            part = out_dir / entry["parts"][0]["name"]
            data = bytearray(part.read_bytes())
            data[len(data) // 2] ^= 0x55
            part.write_bytes(bytes(data))
            entry["parts"][0]["sha256"] = entry["sha256"] = sha256_file(part)  # hashes agree; content wrong
        return entry
    monkeypatch.setattr(publish, "compress", corrupting)
    with pytest.raises((publish.PublishError, blob.BlobError), match="libmha_fwd.so.zst"):
        _publish(checkout, str(tmp_path / "rel"))
    assert not (tmp_path / "rel").exists()
    assert not list((checkout / "build/jit-libs-publish").glob("*/" + mf.MANIFEST_NAME))


def test_gh_release_is_a_thin_last_step_with_the_manifest_uploaded_alone_and_last(checkout, tmp_path):
    ident = checkout_identity(checkout)
    write_build(checkout / "build/aiter_build", ident)
    tag = reuse_gate.release_tag(ident["cache_id"])
    calls: list[list[str]] = []

    def fake_gh(cmd: list[str]) -> tuple[int, str, str]:
        calls.append(cmd)
        if cmd[2] == "download":
            return 1, "", f"release not found: {tag}"
        if cmd[2] == "view":
            return (1, "", "release not found") if len(calls) < 4 else (0, "{}", "")
        return 0, "", ""
    _publish(checkout, "gh:ROCm/jax-aiter", runner=fake_gh)
    stage = checkout / "build/jit-libs-publish" / tag
    repo = ["--repo", "ROCm/jax-aiter"]
    assert calls[0] == ["gh", "release", "download", tag, "--pattern", mf.MANIFEST_NAME, "--output", "-", *repo]
    assert calls[1] == ["gh", "release", "view", tag, "--json", "tagName", *repo]
    assert calls[2][:4] == ["gh", "release", "create", tag] and calls[2][-2:] == repo
    assert calls[3] == ["gh", "release", "upload", tag,
                        *(str(stage / f"{lib}.zst") for lib in sorted(MODULES.values())), "--clobber", *repo]
    assert calls[5] == ["gh", "release", "upload", tag, str(stage / mf.MANIFEST_NAME), "--clobber", *repo]
    assert len(calls) == 6


def test_manifest_reader_refuses_unknown_schema_tampering_and_unsafe_names(checkout):
    ident = checkout_identity(checkout)
    good = {"kind": mf.KIND, "schema": 1, "release_tag": reuse_gate.release_tag(ident["cache_id"]),
            "identity": ident, "compression": {"codec": "zstd", "window_log": 27},
            "files": [{"name": "libmha_fwd.so", "size": 3, "sha256": "a" * 64,
                       "compressed": {"name": "libmha_fwd.so.zst", "size": 2, "sha256": "b" * 64,
                                      "parts": [{"name": "libmha_fwd.so.zst", "size": 2, "sha256": "b" * 64}]}}]}
    mf.validate(json.loads(json.dumps(good)), "m")

    def bad(mutate, match):
        m = json.loads(json.dumps(good))
        mutate(m)
        with pytest.raises(mf.ManifestError, match=match):
            mf.parse(json.dumps(m), "https://x/m.json")
    bad(lambda m: m.update(schema=2), r"schema 2, but this jax-aiter reads schema 1 only; upgrade jax-aiter")
    bad(lambda m: m["identity"].update(recipe_hash="f" * 64), "do not match its identity")
    bad(lambda m: m["files"][0].update(name="../../etc/passwd"), "unsafe or missing name")
    bad(lambda m: m["files"][0]["compressed"]["parts"][0].update(name=".hidden"), "unsafe")
    bad(lambda m: m["files"][0]["compressed"]["parts"][0].update(size=5), "do not add up")
    bad(lambda m: m["files"][0].update(sha256="xyz"), "no valid sha256")
    bad(lambda m: m.update(kind="other"), "not a jax-aiter JIT-library manifest")
    with pytest.raises(mf.ManifestError, match="not valid JSON"):
        mf.parse(b'{"kind": "jax-aiter-jit', "https://x/m.json")


def test_cli_show_and_verify_name_the_file_and_both_hashes(checkout, tmp_path):
    ident = checkout_identity(checkout)
    manifest = make_release(tmp_path / "rel", ident)
    mpath = tmp_path / "rel" / manifest["release_tag"] / mf.MANIFEST_NAME
    show = run_py(["-m", "invoke", "jit.show", str(mpath)])
    assert show.returncode == 0 and manifest["release_tag"] in show.stdout and "libmha_bwd.so" in show.stdout
    jit = checkout / "build/aiter_build"
    write_build(jit, ident)
    env = {"JA_ROOT_DIR": str(checkout), "JA_BACKEND": "cpu"}
    ok = run_py(["-m", "invoke", "verify", "--against", str(mpath)], env)
    assert ok.returncode == 0, ok.stderr
    (jit / "librmsnorm_fwd.so").write_bytes(b"x" * 200_000)
    bad = run_py(["-m", "invoke", "verify"], env)
    want = next(f["sha256"] for f in manifest["files"] if f["name"] == "librmsnorm_fwd.so")
    assert bad.returncode == 1
    assert f"librmsnorm_fwd.so: sha256 {sha256_file(jit / 'librmsnorm_fwd.so')} does not match the recorded {want}" \
        in bad.stderr


def test_parallel_hashing_matches_hashlib_for_small_empty_and_mmapped_files(tmp_path):
    import hashlib

    from jax_aiter import integrity

    files = {"empty": b"", "small": b"x" * 1000, "big": bytes(range(256)) * ((integrity.MMAP_MIN + 12345) // 256)}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    paths = [str(tmp_path / n) for n in files] + [str(tmp_path / "small")]
    got = sha256_files(paths)
    assert list(got) == [str(tmp_path / n) for n in files]  # input order kept, duplicates once
    assert got == {str(tmp_path / n): hashlib.sha256(d).hexdigest() for n, d in files.items()}
    assert len(files["big"]) >= integrity.MMAP_MIN
