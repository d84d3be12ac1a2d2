"""Decoding a published blob: zstd-compressed, possibly split into parts, hashed as it is written.

The publisher uses this to prove each blob decompresses to the exact library
before anything is uploaded; the fetch client uses it to unpack downloads. One
pass reads the parts in order, decompresses, hashes and (optionally) writes,
and stops as soon as the output outgrows the size the manifest promises.
"""
from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path

CHUNK = 4 << 20


class BlobError(RuntimeError):
    """A blob that does not decode to what its manifest says; the message names it."""


class PartsReader(io.RawIOBase):
    """A readable stream over several files, one after another (the parts of a split blob)."""

    def __init__(self, paths: list[Path]):
        super().__init__()
        self._paths = list(paths)
        self._fh = None
        self.sha256 = hashlib.sha256()  # of every byte read: the compressed blob's hash, for free

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        while True:
            if self._fh is None:
                if not self._paths:
                    return 0
                self._fh = open(self._paths.pop(0), "rb", buffering=0)  # noqa: SIM115 (closed when drained)
            n = self._fh.readinto(buf)
            if n:
                self.sha256.update(memoryview(buf)[:n])
                return n
            self._fh.close()
            self._fh = None

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        super().close()


def zstd_module():
    """The zstandard package, or an error that says how to install it."""
    try:
        import zstandard
    except ImportError as e:
        raise BlobError("the zstandard package is needed to unpack JIT libraries; "
                        "install it with `pip install zstandard` (or `pip install jax-aiter[fetch]`)") from e
    return zstandard


def decode(parts: list[Path], window_log: int, expected_size: int, out: Path | None = None,
           label: str = "blob") -> tuple[int, str, str]:
    """Decompress the concatenated `parts`, writing to `out` if given.

    Returns (output size, output sha256, sha256 of the compressed input).
    """
    zstd = zstd_module()
    dctx = zstd.ZstdDecompressor(max_window_size=1 << window_log)
    h = hashlib.sha256()
    size = 0
    dst = open(out, "wb") if out is not None else None  # noqa: SIM115 (closed in the finally below)
    src = PartsReader(parts)
    try:
        with src, dctx.stream_reader(src, read_size=CHUNK, read_across_frames=True, closefd=False) as reader:
            while True:
                chunk = reader.read(CHUNK)
                if not chunk:
                    break
                size += len(chunk)
                if size > expected_size:
                    raise BlobError(f"{label} decompresses to more than the {expected_size} bytes its manifest says")
                h.update(chunk)
                if dst is not None:
                    dst.write(chunk)
        if dst is not None:
            dst.flush()
            os.fsync(dst.fileno())
    except zstd.ZstdError as e:
        raise BlobError(f"{label} does not decompress ({e}); the compressed bytes are damaged") from e
    finally:
        if dst is not None:
            dst.close()
    return size, h.hexdigest(), src.sha256.hexdigest()
