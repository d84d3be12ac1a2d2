"""The build record of build/aiter_build: written for fetched libraries, and every folder verified against it.

A record (schema 1) is what the JIT build writes last, beside the libraries: one identity, one entry
(name, size, sha256) per library. `verify` checks a folder against it, or against a manifest (path or URL).
"""
from __future__ import annotations

import json
from pathlib import Path

from jatools import atomic_write, config
from jatools.native import jit_build
from jax_aiter import remedies
from jax_aiter.download import manifest as mf
from jax_aiter.download import transfer
from jax_aiter.integrity import (
    RECORD_NAME,
    RECORD_SCHEMA,
    IntegrityError,
    diff_entries,
    read_record,
)


class JitCacheError(RuntimeError):
    """A decision, fetch, merge or verification that failed; the message names the cause and the fix."""


def write_json(path: Path, data: dict) -> None:
    """A record or report as sorted, indented JSON, written atomically."""
    atomic_write.write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def record_from_manifest(manifest: dict, url: str) -> dict:
    """A build record (RECORD_SCHEMA, as the JIT build writes) for fetched libraries, so every later step
    (verify, wheel staging) reads one format whether the libraries were built or fetched."""
    ident = manifest["identity"]
    modules = {f.get("module") or f["name"][3:-3]: {"identity": ident, "instances": f.get("instances"),
                                                    "file": {k: f[k] for k in ("name", "size", "sha256")}}
               for f in manifest["files"]}
    return {"schema": RECORD_SCHEMA, "identity": ident, "modules": modules, "files": mf.raw_entries(manifest["files"]),
            "last_build": {"fetched_from": url, "release_tag": manifest["release_tag"], "modules": sorted(modules)}}


def _entries(folder: Path, against: str | None) -> tuple[str, list[dict], dict | None]:
    """(what `folder` is checked against, its entries, the identity it names: None when it names no single one): a
    manifest URL or path, else the folder's record (else its manifest copy)."""
    if against and "://" in against:
        manifest = mf.parse(transfer.fetch_bytes(against, transfer.FetchOptions.from_env()), against)
        return against, mf.raw_entries(manifest["files"]), manifest["identity"]
    path = Path(against) if against else next(
        (folder / n for n in (RECORD_NAME, mf.MANIFEST_NAME) if (folder / n).is_file()), None)
    if path is None:
        raise JitCacheError(f"{folder} has neither {RECORD_NAME} nor {mf.MANIFEST_NAME}: nothing to verify against; "
                            f"{remedies.build_or_fetch()} first")
    source = against or str(path)
    # A given file is read as what it says it is; the folder's own files by their names.
    if _json_kind(path) == mf.KIND if against else path.name == mf.MANIFEST_NAME:
        manifest = mf.parse(path.read_bytes(), source)
        return source, mf.raw_entries(manifest["files"]), manifest["identity"]
    entries = list(read_record(path, f"; {remedies.build_or_fetch()}").values())
    return source, entries, json.loads(path.read_bytes()).get("identity")


def _set_differences(folder: Path, source: str, listed: set[str], expected: list[str]) -> list[str]:
    """How the listed libraries differ from the op table's (`expected`) and from the folder's lib*.so."""
    return ([f"{n}: the op table names it, but {source} does not list it" for n in expected if n not in listed]
            + [f"{n}: listed in {source}, but the op table ({', '.join(expected)}) has no such library"
               for n in sorted(listed - set(expected))]
            + [f"{p}: a library in the folder that {source} does not list" for p in sorted(folder.glob("lib*.so"))
               if p.name not in listed and p.name not in expected])


def _checked(folder: Path, against: str | None, expected: list[str] | None) -> tuple[str, int, dict | None]:
    try:
        source, entries, identity = _entries(folder, against)
    except (IntegrityError, mf.ManifestError, ValueError) as e:
        raise JitCacheError(str(e)) from None
    problems = [] if expected is None else _set_differences(folder, source, {e["name"] for e in entries}, expected)
    problems += diff_entries(folder, entries)
    if problems:
        raise JitCacheError(f"{len(problems)} difference(s) between {folder} and {source}:\n  " + "\n  ".join(problems))
    return source, len(entries), identity


def verify(folder: Path, against: str | None = None, expected: list[str] | None = None) -> tuple[str, int]:
    """Check `folder` against a manifest (path or URL) or, by default, its build record (else its manifest copy);
    (what it was checked against, number of files), or an error naming every difference. `expected` (the op
    table's JIT libraries) makes the set strict: a table library the record lacks, a listed one the table
    lacks, or a library in the folder it does not list differs too."""
    return _checked(folder, against, expected)[:2]


def verify_build(settings: config.Settings, folder: Path | None = None, against: str | None = None) -> str:
    """`invoke verify`: `folder` (default build/aiter_build) against its record or `against`, strict to the op
    table's JIT libraries, and the identity they were built with against this checkout's sources, as the wheel build
    does (jit_build.stale: it passed libraries built from kernel sources changed since); the line that says what
    matched."""
    folder = folder or settings.jit_dir
    source, n, identity = _checked(folder, against, list(jit_build.libraries(settings).values()))
    if identity is None:
        raise JitCacheError(f"{source} names no single build identity (its modules were built with different ones), "
                            "so the libraries cannot be matched to this checkout's sources; "
                            f"{remedies.build_or_fetch()}")
    if why := jit_build.stale(settings, identity):
        raise JitCacheError(why)
    return (f"verify: {n} file(s) in {folder} match {source}, and its identity (cache id {identity.get('cache_id')}) "
            "is this checkout's")


def _json_kind(path: Path) -> str | None:
    try:
        obj = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None  # read_record says what is wrong with it
    return obj.get("kind") if isinstance(obj, dict) else None
