"""jatools.wheel.zip_writer: what it writes is an ordinary zip, identical whatever the thread count."""
from __future__ import annotations

import hashlib
import shutil
import subprocess
import zipfile

import pytest

from jatools.wheel import wheel_scan, zip_writer
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


def _write(out, path, workers, level=6):
    with open(out, "wb") as f, DeterministicZipWriter(f, WHEN, level=level, workers=workers) as zw:
        zw.add_files([("pkg/lib.so", path, 0o755, None), ("pkg/empty.bin", path.parent / "empty.bin", 0o644, None)])
        zw.add_bytes("pkg/META", b"hello\n" * 100)
        return zw.members


def test_round_trip(tmp_path):
    path, data = _payload(tmp_path)
    members = _write(tmp_path / "a.zip", path, workers=2)
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


def test_output_does_not_depend_on_thread_count(tmp_path):
    path, _ = _payload(tmp_path)
    _write(tmp_path / "one.zip", path, workers=1)
    _write(tmp_path / "four.zip", path, workers=4)
    assert (tmp_path / "one.zip").read_bytes() == (tmp_path / "four.zip").read_bytes()


def test_zip64_records_when_sizes_pass_the_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(zip_writer, "ZIP64_LIMIT", 1000)
    path, data = _payload(tmp_path, 200_000)
    _write(tmp_path / "z64.zip", path, workers=2)
    with zipfile.ZipFile(tmp_path / "z64.zip") as zf:
        assert zf.testzip() is None and zf.read("pkg/lib.so") == data
        assert zf.getinfo("pkg/lib.so").extract_version == 45
    assert wheel_scan.scan(tmp_path / "z64.zip").members["pkg/lib.so"].sha256 == hashlib.sha256(data).hexdigest()
    assert b"PK\x06\x06" in (tmp_path / "z64.zip").read_bytes(), "ZIP64 end of central directory written"


def test_duplicate_names_and_bad_levels_are_refused(tmp_path):
    with open(tmp_path / "d.zip", "wb") as f:
        zw = DeterministicZipWriter(f, WHEN, workers=1)
        zw.add_bytes("a", b"1")
        with pytest.raises(ValueError, match="duplicate zip member 'a'"):
            zw.add_bytes("a", b"2")
        zw.close()
        with pytest.raises(ValueError, match="libdeflate's deflate level must be 1..12, got 13"):
            DeterministicZipWriter(f, WHEN, level=13)
        with pytest.raises(ValueError, match="zip timestamps start in 1980"):
            DeterministicZipWriter(f, (1970, 1, 1, 0, 0, 0))


def _stored_copy(src, dst):
    """The same members, stored (what some other tools write); zipfile reads them back."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info))
    with zipfile.ZipFile(dst) as z:
        return {i.filename: i for i in z.infolist()}


@pytest.mark.parametrize("method", ["deflated", "stored"])
def test_the_scan_hashes_every_member_and_names_a_damaged_one(tmp_path, method):
    path, _ = _payload(tmp_path)
    out = tmp_path / "a.zip"
    members = _write(out, path, workers=2)
    damage_at = members[0].offset + 30 + len(members[0].arcname) + members[0].compressed_size // 2
    if method == "stored":
        info = _stored_copy(out, tmp_path / "s.zip")["pkg/lib.so"]
        out, damage_at = tmp_path / "s.zip", info.header_offset + 30 + len(info.filename) + info.file_size // 2
    scanned = wheel_scan.scan(out)
    assert {m.arcname: (m.size, m.sha256_hex) for m in members} == {
        n: (s.size, s.sha256) for n, s in scanned.members.items()}
    assert scanned.members["pkg/META"].data == b"hello\n" * 100, "a small member's bytes are kept for the checks"
    raw = bytearray(out.read_bytes())
    raw[damage_at] ^= 0x55  # inside the member's data
    out.write_bytes(raw)
    with pytest.raises(wheel_scan.WheelReadError, match="member pkg/lib.so cannot be read back"):
        wheel_scan.scan(out)
