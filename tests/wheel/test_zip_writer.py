"""jatools.wheel.zip_writer: what it writes is an ordinary zip, identical whatever the thread count."""
from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import zipfile

import pytest

from jatools.wheel import zip_writer
from jatools.wheel.zip_writer import DeterministicZipWriter

WHEN = (2024, 5, 6, 7, 8, 10)


def _payload(tmp_path, size=3_000_000):
    # Compressible but not trivial: a repeating ramp with a pseudo-random stripe.
    rnd = hashlib.sha256(b"seed").digest() * (size // 32 + 1)
    data = bytes((i * 7 + (rnd[i] if i % 5 == 0 else 0)) & 0xFF for i in range(size))
    path = tmp_path / "payload.bin"
    path.write_bytes(data)
    (tmp_path / "empty.bin").write_bytes(b"")
    return path, data


ENGINES = [pytest.param("zlib"), pytest.param("libdeflate", marks=pytest.mark.skipif(
    importlib.util.find_spec("deflate") is None, reason="the `deflate` package (libdeflate) is not installed; "
                                                        "pip install deflate (it is in the test extra)"))]


def _write(out, path, workers, chunk=256 << 10, level=6, engine="zlib"):
    with open(out, "wb") as f, DeterministicZipWriter(f, WHEN, level=level, workers=workers, chunk=chunk,
                                                      engine=engine) as zw:
        zw.add_files([("pkg/lib.so", path, 0o755, None), ("pkg/empty.bin", path.parent / "empty.bin", 0o644, None)])
        zw.add_bytes("pkg/META", b"hello\n" * 100)
        return zw.members


@pytest.mark.parametrize("engine", ENGINES)
def test_round_trip_with_many_chunks(tmp_path, engine):
    path, data = _payload(tmp_path)
    members = _write(tmp_path / "a.zip", path, workers=2, engine=engine)
    with zipfile.ZipFile(tmp_path / "a.zip") as zf:
        assert zf.testzip() is None
        assert zf.read("pkg/lib.so") == data and zf.read("pkg/empty.bin") == b""
        assert zf.read("pkg/META") == b"hello\n" * 100
        info = zf.getinfo("pkg/lib.so")
        assert info.date_time == WHEN and info.external_attr >> 16 == 0o100755 and info.create_system == 3
        assert info.compress_type == zipfile.ZIP_DEFLATED and info.compress_size < len(data)
    assert members[0].sha256 == hashlib.sha256(data).digest()
    if shutil.which("unzip") is None:
        pytest.skip("Info-ZIP unzip is not installed (apt-get install unzip); zipfile alone checked the archive")
    unzip = subprocess.run(["unzip", "-tq", str(tmp_path / "a.zip")], capture_output=True, text=True, check=False)
    assert unzip.returncode == 0, unzip.stdout + unzip.stderr


@pytest.mark.parametrize("engine", ENGINES)
def test_output_does_not_depend_on_thread_count(tmp_path, engine):
    path, _ = _payload(tmp_path)
    _write(tmp_path / "one.zip", path, workers=1, engine=engine)
    _write(tmp_path / "four.zip", path, workers=4, engine=engine)
    assert (tmp_path / "one.zip").read_bytes() == (tmp_path / "four.zip").read_bytes()


@pytest.mark.parametrize("engine", ENGINES)
def test_zip64_records_when_sizes_pass_the_limit(tmp_path, monkeypatch, engine):
    monkeypatch.setattr(zip_writer, "ZIP64_LIMIT", 1000)
    path, data = _payload(tmp_path, 200_000)
    _write(tmp_path / "z64.zip", path, workers=2, chunk=64 << 10, engine=engine)
    with zipfile.ZipFile(tmp_path / "z64.zip") as zf:
        assert zf.testzip() is None and zf.read("pkg/lib.so") == data
        assert zf.getinfo("pkg/lib.so").extract_version == 45
    assert b"PK\x06\x06" in (tmp_path / "z64.zip").read_bytes(), "ZIP64 end of central directory written"


def test_a_file_that_changes_size_while_read_is_an_error(tmp_path, monkeypatch):
    path, _ = _payload(tmp_path, 100_000)
    real_stat = os.stat
    monkeypatch.setattr(zip_writer.os, "stat", lambda p, *a, **k: os.stat_result(
        (*real_stat(p)[:6], 200_000, *real_stat(p)[7:])) if str(p) == str(path) else real_stat(p, *a, **k))
    with (open(tmp_path / "x.zip", "wb") as f, pytest.raises(OSError, match="shrank while it was being zipped"),
          DeterministicZipWriter(f, WHEN, workers=1) as zw):
        zw.add_file("lib.so", path)


def test_duplicate_names_and_bad_levels_are_refused(tmp_path):
    with open(tmp_path / "d.zip", "wb") as f:
        zw = DeterministicZipWriter(f, WHEN, workers=1)
        zw.add_bytes("a", b"1")
        with pytest.raises(ValueError, match="duplicate zip member 'a'"):
            zw.add_bytes("a", b"2")
        zw.close()
        with pytest.raises(ValueError, match="zlib deflate level must be 1..9"):
            DeterministicZipWriter(f, WHEN, level=0)
        with pytest.raises(ValueError, match="unknown deflate engine 'brotli'"):
            DeterministicZipWriter(f, WHEN, engine="brotli")
        with pytest.raises(ValueError, match="zip timestamps start in 1980"):
            DeterministicZipWriter(f, (1970, 1, 1, 0, 0, 0))


@pytest.mark.parametrize("inflate", ["libdeflate", "zlib"])
def test_read_back_hashes_every_member_and_names_a_damaged_one(tmp_path, monkeypatch, inflate):
    from jatools.wheel import wheel_members
    if inflate == "zlib":
        monkeypatch.setattr(wheel_members, "_libdeflate", lambda: None)
    elif wheel_members._libdeflate() is None:
        pytest.skip("the `deflate` package (libdeflate) is not installed; pip install deflate")
    path, _ = _payload(tmp_path)
    out = tmp_path / "a.zip"
    members = _write(out, path, workers=2)
    scanned = wheel_members.scan(out)
    assert {m.arcname: (m.size, m.sha256_hex) for m in members} == {
        n: (s.size, s.sha256) for n, s in scanned.items()}
    lib = members[0]
    raw = bytearray(out.read_bytes())
    raw[lib.offset + 30 + len(lib.arcname) + lib.compressed_size // 2] ^= 0x55  # inside the deflate stream
    out.write_bytes(raw)
    with pytest.raises(wheel_members.WheelReadError, match="member pkg/lib.so cannot be read back"):
        wheel_members.scan(out)
