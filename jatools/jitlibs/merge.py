"""Merge the JIT producer's per-module shards into one build/aiter_build (`invoke jit.merge-manifests`).

CI jobs each build one lib<module>.so with its build_record.json, so the hours-long MHA builds run side by
side; `merge` joins them: every JIT module of the op table once, bytes as each shard recorded them, the gated
identity fields equal (a shard from other sources or archs would publish a wrong library under this cache id;
the toolchain is advisory, as for reuse). The merged record is moved in last, after every check, so a failed
or interrupted merge leaves the previous tree.
"""
from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from jatools.jitlibs.record import JitCacheError, write_json
from jax_aiter import remedies
from jax_aiter.download import release, reuse_gate
from jax_aiter.integrity import RECORD_NAME, RECORD_SCHEMA, diff_entries

Log = Callable[[str], None]


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
                                f"(schema {record.get('schema')!r}); rebuild it with `{remedies.door('jit', ['<m>'])}`")
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
                            + "\n  ".join(problems) + f"\nre-run that shard's job (`{remedies.door('jit', ['<m>'])}`)")


def check_modules(shards: list[Shard], wanted: dict[str, str]) -> dict[str, tuple[Shard, dict]]:
    """{module: (shard, record entry)}: every module of `wanted` ({module: library}) exactly once, with its library."""
    found: dict[str, list[tuple[Shard, dict]]] = {}
    for s in shards:
        for module, entry in s.record["modules"].items():
            found.setdefault(module, []).append((s, entry))
    problems = [f"module {m} is in no shard (expected {wanted[m]}); add or re-run its shard job "
                f"jit_libs_<backend>_{m}" for m in wanted if m not in found]
    problems += [f"module {m} is in {len(v)} shards: {', '.join(s.name for s, _ in v)}; keep one"
                 for m, v in found.items() if len(v) > 1]
    problems += [f"module {m} (shard {v[0][0].name}) is not a JIT module of the op table" for m, v in found.items()
                 if m not in wanted]
    problems += [f"module {m} (shard {v[0][0].name}): library {v[0][1]['file']['name']}, but the op table "
                 f"names {wanted[m]}" for m, v in found.items()
                 if m in wanted and v[0][1]["file"]["name"] != wanted[m]]
    if problems:
        raise JitCacheError("the shards do not make one build:\n  " + "\n  ".join(problems))
    return {m: found[m][0] for m in wanted}


def check_identities(chosen: dict[str, tuple[Shard, dict]], strict: bool, log: Log) -> dict | None:
    """Gated fields equal across modules (reuse_gate.compare); toolchain differences warn unless strict.
    Returns the common identity when every module's identity is the same, else None."""
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


def merge(from_dir: Path, dest: Path, wanted: dict[str, str], strict: bool = False, log: Log = print) -> dict:
    """Check every shard against `wanted` ({module: library}, jit_build.libraries), then install the libraries
    into `dest` and the merged build record last (not hashed again: `invoke verify`, the next CI step, does)."""
    shards = find_shards(from_dir)
    for s in shards:
        check_files(s)
    chosen = check_modules(shards, wanted)
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
        for shard, entry in chosen.values():
            shutil.copy2(shard.folder / entry["file"]["name"], staging)
        write_json(staging / RECORD_NAME, record)
        release.install_staged(staging, dest, [e["name"] for e in record["files"]], last=RECORD_NAME)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log(f"merge-manifests: {len(modules)} module(s) from {len(shards)} shard(s) installed into {dest}"
        + ("" if ident else " (module identities differ in advisory fields: record identity null)"))
    return record
