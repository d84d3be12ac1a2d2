"""Deterministic stand-ins for the production JIT libraries: same sizes, same compressibility, and a
build folder of them as build_jit.py leaves it (libraries + build_record.json), for the benchmarks that
run the verify / publish / fetch code paths on generated data.

The benchmarks must run at production sizes on any machine, without the real
GPU libraries (hours to build, gigabytes to download). What matters to the
tools being measured is the size of the files and how well they compress, so
this generator makes files of the production sizes (167 MB, 1.0 GB, 1.3 GB at
scale 1) that zstd level 3 shrinks to between 0.25 and 0.45 of their size, as
it does real GPU code objects.

How the bytes are made (seeded, so the same scale always gives the same bytes):
each file is a sequence of 4 KiB pages, each page one of
- code: 8-byte instruction-like words, an opcode from a per-file table of 48
  plus an operand that is usually a small register/immediate (3 zero bytes)
  and sometimes a random 32-bit literal;
- random: incompressible bytes (embedded constants, metadata, compressed data);
- zeros: padding and .bss-like runs.
The generated files are cached under build/bench/corpus/v<version>-s<scale>/ and
reused while (scale, generator version) match; a stamp file, written last,
marks a complete corpus.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from jatools import atomic_write
from jatools.jitlibs.jit_cache import RECORD_NAME
from jatools.wheel.wheel_layout import Layout
from jax_aiter.integrity import sha256_files

VERSION = 1  # bump when the bytes this module produces change
PAGE = 4096
SEGMENT = 1 << 20  # generated (and written) one MiB at a time
# name -> size at scale 1 (the production libraries' sizes)
SIZES = {"librmsnorm_fwd.so": 167_000_000, "libmha_fwd.so": 1_000_000_000, "libmha_bwd.so": 1_300_000_000}
PAGE_KINDS = ("code", "random", "zeros")
PAGE_WEIGHTS = (0.68, 0.12, 0.20)
SMALL_OPERAND = 0.85  # share of instruction words with a small operand (one of 32 registers)
STAMP = "corpus.json"


@dataclass(frozen=True)
class Corpus:
    folder: Path
    files: dict[str, int]  # name -> size

    @property
    def paths(self) -> list[Path]:
        return [self.folder / n for n in self.files]

    @property
    def total_bytes(self) -> int:
        return sum(self.files.values())


def sizes(scale: float) -> dict[str, int]:
    """File sizes at `scale` (at least one page each, whole pages)."""
    return {n: max(PAGE, int(s * scale) // PAGE * PAGE) for n, s in SIZES.items()}


def _segment(rng: np.random.Generator, opcodes: np.ndarray, n: int) -> bytes:
    words = n // 8
    ops = opcodes[rng.integers(0, len(opcodes), words)]
    small = rng.random(words) < SMALL_OPERAND
    operand = np.where(small, rng.integers(0, 32, words, dtype=np.uint64),
                       rng.integers(0, 1 << 32, words, dtype=np.uint64))
    data = (ops | (operand << np.uint64(32))).view(np.uint8)
    pages = data.reshape(-1, PAGE)
    kinds = rng.choice(len(PAGE_KINDS), size=len(pages), p=PAGE_WEIGHTS)
    rnd = kinds == 1
    pages[rnd] = rng.integers(0, 256, (int(rnd.sum()), PAGE), dtype=np.uint8)
    pages[kinds == 2] = 0
    return data.tobytes()


def generate_file(path: Path, size: int, seed: str) -> None:
    """Write `size` deterministic bytes for `seed` to `path` (atomically)."""
    rng = np.random.default_rng(list(seed.encode()))
    opcodes = rng.integers(0, 1 << 32, 48, dtype=np.uint64)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            left = size
            while left:
                n = min(SEGMENT, left)
                fh.write(_segment(rng, opcodes, (n + PAGE - 1) // PAGE * PAGE)[:n])
                left -= n
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def folder_for(root: Path, scale: float) -> Path:
    return root / f"v{VERSION}-s{scale:g}"


def ensure(root: Path, scale: float, log=print) -> Corpus:
    """The corpus for `scale`, generated once and cached under `root`."""
    folder = folder_for(root, scale)
    want = sizes(scale)
    stamp = folder / STAMP
    if stamp.is_file() and json.loads(stamp.read_text()).get("files") == want and all(
            (folder / n).is_file() and (folder / n).stat().st_size == s for n, s in want.items()):
        return Corpus(folder, want)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    log(f"bench: generating the corpus for scale {scale:g} ({sum(want.values()) / 1e9:.2f} GB) in {folder}")
    for name, size in want.items():
        generate_file(folder / name, size, f"{VERSION}:{name}")
    atomic_write.write_text(stamp, json.dumps({"version": VERSION, "scale": scale, "files": want}, indent=2) + "\n")
    return Corpus(folder, want)


def zstd3_ratio(data: bytes) -> float:
    """Compressed / original size at zstd level 3 (the property the generator promises)."""
    import zstandard

    return len(zstandard.ZstdCompressor(level=3).compress(data)) / len(data)


# --- the corpus as a build folder ------------------------------------------------------------------------------------
def link_tree(src: Corpus, dest: Path) -> list[Path]:
    """Hard links to the corpus files in `dest` (same bytes and page cache, no copy)."""
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for path in src.paths:
        target = dest / path.name
        if not (target.exists() and os.path.samefile(target, path)):
            target.unlink(missing_ok=True)
            os.link(path, target)
        out.append(target)
    return out


def corpus_digests(c: Corpus) -> dict[str, str]:
    """{name: sha256} of the corpus files, computed once and kept beside them."""
    cache = c.folder / "sha256.json"
    if cache.is_file():
        return json.loads(cache.read_text())
    digests = {Path(p).name: d for p, d in sha256_files(c.paths).items()}
    atomic_write.write_text(cache, json.dumps(digests, indent=2) + "\n")
    return digests


def write_record(folder: Path, c: Corpus, identity: dict) -> dict:
    """build_record.json (schema 1, build_jit.py's format) for the corpus files linked into `folder`."""
    digests = corpus_digests(c)
    module_of = {name: spec.module for name, spec in Layout.load().libraries.items() if spec.kind == "jit"}
    files = sorted(({"name": n, "size": s, "sha256": digests[n]} for n, s in c.files.items()), key=lambda e: e["name"])
    modules = {module_of[f["name"]]: {"identity": identity, "instances": 1, "file": f} for f in files}
    record = {"schema": 1, "identity": identity, "modules": modules, "files": files,
              "last_build": {"modules": sorted(modules), "seconds": 0.0, "note": "benchmark corpus"}}
    atomic_write.write_text(folder / RECORD_NAME, json.dumps(record, indent=2, sort_keys=True) + "\n")
    return record
