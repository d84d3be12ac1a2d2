"""Join per-module JIT build shards into one build/aiter_build with one build record.

The JIT producer builds each module in its own CI job (a shard: lib<module>.so
plus that job's build_record.json) so the hours-long MHA builds run side by
side. Publishing needs one build: every module of optCompilerConfig.json once,
bytes as each shard recorded them, and one identity. A shard built from other
sources or for other archs would publish a wrong library under this release's
cache id, so the gated fields must agree; the toolchain is advisory, as for reuse.
Nothing is installed until every check passes; the merged record is moved in
last, so a failed or interrupted merge leaves the previous build tree.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from jatools.jitlibs.jit_cache import RECORD_NAME, JitCacheError, Log, _write_json
from jax_aiter import fetch, reuse_gate
from jax_aiter.integrity import diff_entries

RECORD_SCHEMA = 1  # the schema jax_aiter/jit/build_jit.py writes


@dataclass
class Shard:
    name: str  # folder relative to --from (the artifact name)
    folder: Path
    record: dict


def find_shards(from_dir: Path) -> list[Shard]:
    """Every folder under `from_dir` holding a build record; a library without one is an error."""
    if not from_dir.is_dir():
        raise JitCacheError(f"{from_dir} is not a folder: download the shard artifacts there first "
                            "(actions/download-artifact with pattern jit-shard-*)")
    shards = []
    for path in sorted(from_dir.rglob(RECORD_NAME)):
        name = path.parent.relative_to(from_dir).as_posix()
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise JitCacheError(f"shard {name}: cannot read {path}: {e}") from None
        if record.get("schema") != RECORD_SCHEMA or not isinstance(record.get("modules"), dict):
            raise JitCacheError(f"shard {name}: {path} is not a schema-{RECORD_SCHEMA} build record "
                                f"(schema {record.get('schema')!r}); rebuild it with `nox -s jit -- --module <m>`")
        shards.append(Shard(name, path.parent, record))
    with_record = {s.folder for s in shards}
    orphans = sorted(str(p) for p in from_dir.rglob("lib*.so") if p.parent not in with_record)
    if orphans:
        raise JitCacheError(f"libraries without a {RECORD_NAME} beside them: {', '.join(orphans)}; "
                            "each shard artifact must hold its build record")
    if not shards:
        raise JitCacheError(f"no shard (folder with {RECORD_NAME}) under {from_dir}")
    return shards


def check_files(shard: Shard) -> None:
    """Each module's library re-hashed against the shard's record; no unrecorded library."""
    entries = [m["file"] for m in shard.record["modules"].values()]
    problems = diff_entries(shard.folder, entries)
    recorded = {e["name"] for e in entries}
    problems += [f"{p}: not in the shard's {RECORD_NAME}" for p in sorted(shard.folder.glob("lib*.so"))
                 if p.name not in recorded]
    if problems:
        raise JitCacheError(f"shard {shard.name}: {len(problems)} file(s) differ from its {RECORD_NAME}:\n  "
                            + "\n  ".join(problems) + "\nre-run that shard's job (`nox -s jit -- --module <m>`)")


def check_modules(shards: list[Shard], config_path: Path) -> dict[str, tuple[Shard, dict]]:
    """{module: (shard, record entry)}: every configured module exactly once, with its configured library."""
    wanted = json.loads(config_path.read_text())["modules"]
    found: dict[str, list[tuple[Shard, dict]]] = {}
    for s in shards:
        for module, entry in s.record["modules"].items():
            found.setdefault(module, []).append((s, entry))
    problems = [f"module {m} is in no shard (expected {wanted[m]['library']}); add or re-run its shard job "
                f"jit_libs_<backend>_{m}" for m in wanted if m not in found]
    problems += [f"module {m} is in {len(v)} shards: {', '.join(s.name for s, _ in v)}; keep one"
                 for m, v in found.items() if len(v) > 1]
    problems += [f"module {m} (shard {v[0][0].name}) is not in {config_path}" for m, v in found.items()
                 if m not in wanted]
    problems += [f"module {m} (shard {v[0][0].name}): library {v[0][1]['file']['name']}, but {config_path} "
                 f"says {wanted[m]['library']}" for m, v in found.items()
                 if m in wanted and v[0][1]["file"]["name"] != wanted[m]["library"]]
    if problems:
        raise JitCacheError("the shards do not make one build:\n  " + "\n  ".join(problems))
    return {m: found[m][0] for m in wanted}


def check_identities(chosen: dict[str, tuple[Shard, dict]], strict: bool, log: Log) -> dict | None:
    """Gated fields equal across modules (reuse_gate.compare); toolchain differences warn unless strict.

    Returns the common identity when every module's identity is the same, else None.
    """
    (ref_module, (ref_shard, ref_entry)), *rest = chosen.items()
    ref = ref_entry["identity"]
    problems = []
    for module, (shard, entry) in rest:
        cmp = reuse_gate.compare(ref, entry["identity"], strict)
        where = f"shard {shard.name} (module {module}) vs shard {ref_shard.name} (module {ref_module})"
        problems += [f"{where}: {m}" for m in cmp.mismatches]
        for w in cmp.warnings:
            log(f"merge-manifests: warning: {where}: {w}")
    if problems:
        raise JitCacheError("the shards were built from different inputs (wanted = the first shard's value):\n  "
                            + "\n  ".join(problems) + "\nre-run the shard jobs from one commit and one configuration")
    return ref if all(e["identity"] == ref for _, e in chosen.values()) else None


def merge(from_dir: Path, dest: Path, config_path: Path, strict: bool = False, log: Log = print) -> dict:
    """Check every shard, then install the libraries into `dest` and the merged build record last.

    The copies are not hashed again here: the CI step after this one (`invoke verify`) re-hashes `dest`
    against the merged record.
    """
    shards = find_shards(from_dir)
    for s in shards:
        check_files(s)
    chosen = check_modules(shards, config_path)
    ident = check_identities(chosen, strict, log)
    modules = {m: entry for m, (_, entry) in chosen.items()}
    record = {"schema": RECORD_SCHEMA, "identity": ident, "modules": modules,
              "files": sorted((e["file"] for e in modules.values()), key=lambda e: e["name"]),
              "last_build": {"modules": sorted(modules), "merged_from": {m: s.name for m, (s, _) in chosen.items()}}}
    dest.parent.mkdir(parents=True, exist_ok=True)
    for stale in dest.parent.glob(f".{dest.name}.merge-*"):
        shutil.rmtree(stale, ignore_errors=True)
    staging = dest.parent / f".{dest.name}.merge-{os.getpid()}"
    staging.mkdir()
    try:
        names = []
        for shard, entry in chosen.values():
            names.append(entry["file"]["name"])
            shutil.copy2(shard.folder / entry["file"]["name"], staging / entry["file"]["name"])
        _write_json(staging / RECORD_NAME, record)
        fetch.install_staged(staging, dest, names, last=RECORD_NAME)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log(f"merge-manifests: {len(modules)} module(s) from {len(shards)} shard(s) installed into {dest}"
        + ("" if ident else " (module identities differ in advisory fields: record identity null)"))
    return record
