"""A build folder of corpus files, as build_jit.py leaves it (libraries + build_record.json), for the
benchmarks that run the verify / publish / fetch code paths on generated data."""
from __future__ import annotations

import json
import os
from pathlib import Path

from jatools import atomic_write
from jatools.bench.corpus import Corpus
from jax_aiter.integrity import sha256_files

RECORD_NAME = "build_record.json"
MODULES = {"librmsnorm_fwd.so": "rmsnorm_fwd", "libmha_fwd.so": "mha_fwd", "libmha_bwd.so": "mha_bwd"}


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
    files = sorted(({"name": n, "size": s, "sha256": digests[n]} for n, s in c.files.items()), key=lambda e: e["name"])
    modules = {MODULES[f["name"]]: {"identity": identity, "instances": 1, "file": f} for f in files}
    record = {"schema": 1, "identity": identity, "modules": modules, "files": files,
              "last_build": {"modules": sorted(modules), "seconds": 0.0, "note": "benchmark corpus"}}
    atomic_write.write_text(folder / RECORD_NAME, json.dumps(record, indent=2, sort_keys=True) + "\n")
    return record
