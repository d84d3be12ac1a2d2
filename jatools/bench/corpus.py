"""The benchmarks' data: deterministic stand-ins for the production JIT libraries.

Files of their sizes and compressibility (zstd level 3: 0.25 to 0.45, as real GPU code objects), so
the verify / publish / fetch / wheel benchmarks (jatools/bench/cases.py) run their code paths at
production sizes on any machine. docs/benchmarks.md, "The data", describes the bytes.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from jatools import atomic_write
from jatools.wheel.wheel_layout import Layout
from jax_aiter.integrity import RECORD_NAME, RECORD_SCHEMA, sha256_files

# Seeded 4 KiB pages of instruction-like words, random bytes or zeros; cached under
# build/bench/corpus/v<version>-s<scale>/, a stamp file written last marking a complete corpus.
CORPUS_VERSION = 1  # bump when the bytes this module produces change
PAGE = 4096
SEGMENT = 1 << 20  # generated (and written) one MiB at a time
CORPUS_SIZES = {"librmsnorm_fwd.so": 167_000_000, "libmha_fwd.so": 1_000_000_000, "libmha_bwd.so": 1_300_000_000}
PAGE_WEIGHTS = (0.68, 0.12, 0.20)  # code, random, zeros
SMALL_OPERAND = 0.85  # share of instruction words with a small operand (one of 32 registers)
CORPUS_STAMP = "corpus.json"


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


def corpus_sizes(scale: float) -> dict[str, int]:
    """File sizes at `scale` (at least one page each, whole pages)."""
    return {n: max(PAGE, int(s * scale) // PAGE * PAGE) for n, s in CORPUS_SIZES.items()}


def _segment(rng: np.random.Generator, opcodes: np.ndarray, n: int) -> bytes:
    """`n` bytes of pages: 8-byte words (an opcode from `opcodes`, an operand usually small, else a random
    32-bit literal), then some pages overwritten with random bytes or zeros."""
    words = n // 8
    ops = opcodes[rng.integers(0, len(opcodes), words)]
    small = rng.random(words) < SMALL_OPERAND
    operand = np.where(small, rng.integers(0, 32, words, dtype=np.uint64),
                       rng.integers(0, 1 << 32, words, dtype=np.uint64))
    data = (ops | (operand << np.uint64(32))).view(np.uint8)
    pages = data.reshape(-1, PAGE)
    kinds = rng.choice(len(PAGE_WEIGHTS), size=len(pages), p=PAGE_WEIGHTS)
    rnd = kinds == 1
    pages[rnd] = rng.integers(0, 256, (int(rnd.sum()), PAGE), dtype=np.uint8)
    pages[kinds == 2] = 0
    return data.tobytes()


def ensure_corpus(root: Path, scale: float, log=print) -> Corpus:
    """The corpus for `scale`, generated once and cached under `root`."""
    folder = root / f"v{CORPUS_VERSION}-s{scale:g}"
    want = corpus_sizes(scale)
    stamp = folder / CORPUS_STAMP
    if stamp.is_file() and json.loads(stamp.read_text()).get("files") == want and all(
            (folder / n).is_file() and (folder / n).stat().st_size == s for n, s in want.items()):
        return Corpus(folder, want)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    log(f"bench: generating the corpus for scale {scale:g} ({sum(want.values()) / 1e9:.2f} GB) in {folder}")
    for name, size in want.items():
        rng = np.random.default_rng(list(f"{CORPUS_VERSION}:{name}".encode()))
        opcodes = rng.integers(0, 1 << 32, 48, dtype=np.uint64)
        with atomic_write.open_bytes(folder / name) as fh:
            for start in range(0, size, SEGMENT):
                n = min(SEGMENT, size - start)
                fh.write(_segment(rng, opcodes, (n + PAGE - 1) // PAGE * PAGE)[:n])
    atomic_write.write_text(stamp, json.dumps({"version": CORPUS_VERSION, "scale": scale, "files": want},
                                              indent=2) + "\n")
    return Corpus(folder, want)


def zstd3_ratio(data: bytes) -> float:
    """Compressed / original size at zstd level 3 (the property the generator promises)."""
    import zstandard

    return len(zstandard.ZstdCompressor(level=3).compress(data)) / len(data)


def link_tree(src: Corpus, dest: Path) -> list[Path]:
    """Hard links to the corpus files in `dest` (same bytes and page cache, no copy)."""
    dest.mkdir(parents=True, exist_ok=True)
    for path in src.paths:
        target = dest / path.name
        if not (target.exists() and os.path.samefile(target, path)):
            target.unlink(missing_ok=True)
            os.link(path, target)
    return [dest / path.name for path in src.paths]


def write_record(folder: Path, c: Corpus, identity: dict) -> dict:
    """build_record.json (schema 1, build_jit.py's format) for the corpus files linked into `folder`; the corpus
    digests are computed once and kept beside it."""
    cache = c.folder / "sha256.json"
    if cache.is_file():
        digests = json.loads(cache.read_text())
    else:
        digests = {Path(p).name: d for p, d in sha256_files(c.paths).items()}
        atomic_write.write_text(cache, json.dumps(digests, indent=2) + "\n")
    module_of = {name: spec.module for name, spec in Layout.load().libraries.items() if spec.kind == "jit"}
    files = sorted(({"name": n, "size": s, "sha256": digests[n]} for n, s in c.files.items()), key=lambda e: e["name"])
    modules = {module_of[f["name"]]: {"identity": identity, "instances": 1, "file": f} for f in files}
    record = {"schema": RECORD_SCHEMA, "identity": identity, "modules": modules, "files": files,
              "last_build": {"modules": sorted(modules), "seconds": 0.0, "note": "benchmark corpus"}}
    atomic_write.write_text(folder / RECORD_NAME, json.dumps(record, indent=2, sort_keys=True) + "\n")
    return record
