"""Decoding a published blob: zstd-compressed, possibly split into parts, hashed as it is written.

The publisher uses this to prove each blob decompresses to the exact library
before anything is uploaded; the fetch client streams downloads through it. One
pass takes the parts in order, decompresses, hashes and (optionally) writes,
and stops as soon as the output outgrows the size the manifest promises.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import BinaryIO

CHUNK = 1 << 20  # output chunks stay in the CPU cache between decompressing and hashing


class BlobError(RuntimeError):
    """A blob that does not decode to what its manifest says; the message names it."""


def zstd_module():
    """The zstandard package, or an error that says how to install it."""
    try:
        import zstandard
    except ImportError as e:
        raise BlobError("the zstandard package is needed to unpack JIT libraries; "
                        "install it with `pip install zstandard` (or `pip install jax-aiter[fetch]`)") from e
    return zstandard


class Decoder:
    """A sink for one blob's compressed bytes, written in order (the parts one after another).

    Each write is decompressed, and the output hashed, capped at the size the
    manifest promises and written to `out` if given, in one pass: the fetch client
    streams a download through it, so the compressed bytes never touch the disk.
    (The compressed bytes are hashed by the caller, which already hashes each part.)
    A blob that fails to decode is recorded in
    `error` rather than raised, and later writes are only hashed: the caller
    checks the part hashes first, so a damaged download is reported as damaged
    download (its sha256), not as whatever the decompressor made of it.
    """

    def __init__(self, window_log: int, expected_size: int, out: BinaryIO | None = None, label: str = "blob"):
        zstd = zstd_module()
        self._zstd_error = zstd.ZstdError
        self.label, self.expected_size = label, expected_size
        self.size = 0
        self.sha256 = hashlib.sha256()  # of the output
        self.error: BlobError | None = None
        self._out = out
        dctx = zstd.ZstdDecompressor(max_window_size=1 << window_log)
        self._writer = dctx.stream_writer(self, write_size=CHUNK, closefd=False)

    def feed(self, data) -> None:
        """The next compressed bytes."""
        if self.error is not None:
            return
        try:
            self._writer.write(data)
        except self._zstd_error as e:
            self.error = BlobError(f"{self.label} does not decompress ({e}); the compressed bytes are damaged")
        except BlobError as e:
            self.error = e

    def write(self, chunk) -> int:
        """Decompressed output, from the zstd stream writer."""
        self.size += len(chunk)
        if self.size > self.expected_size:
            raise BlobError(f"{self.label} decompresses to more than the {self.expected_size} bytes its manifest says")
        self.sha256.update(chunk)
        if self._out is not None:
            self._out.write(chunk)
        return len(chunk)

    def result(self) -> tuple[int, str]:
        """(output size, output sha256); raises the decoding error, if any."""
        if self.error is not None:
            raise self.error
        return self.size, self.sha256.hexdigest()


def decode(parts: list[Path], window_log: int, expected_size: int, label: str = "blob") -> tuple[int, str, str]:
    """Decompress the concatenated `parts` (files) without keeping the output.

    Returns (output size, output sha256, sha256 of the compressed input).
    """
    decoder = Decoder(window_log, expected_size, label=label)
    compressed = hashlib.sha256()
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    for path in parts:
        with open(path, "rb", buffering=0) as fh:
            while n := fh.readinto(buf):
                compressed.update(view[:n])
                decoder.feed(view[:n])
    return (*decoder.result(), compressed.hexdigest())
