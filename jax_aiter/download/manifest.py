"""The JIT-library manifest: the published, versioned description of one `jit-libs-<cache-id>` release.

It carries the build identity and, per library, the raw {name, size, sha256}
plus the compressed blob and the parts it was split into, each with its own
size and sha256, so every byte can be checked at every hand-off. The schema is
documented in docs/jit-libs.md; a reader refuses any schema it does not know
rather than guess, and refuses names that could escape the destination folder.

Read at runtime by jax-aiter-fetch-mha, so it must not import JAX.
"""
from __future__ import annotations

import json
import re

from jax_aiter.download import reuse_gate

SCHEMA = 1
KIND = "jax-aiter-jit-libs"
MANIFEST_NAME = "jit-libs-manifest.json"

_SAFE_NAME = re.compile(r"[A-Za-z0-9_+\-][A-Za-z0-9._+\-]*")
_SHA256 = re.compile(r"[0-9a-f]{64}")


class ManifestError(ValueError):
    """A manifest that cannot be used; the message names its source and what is wrong."""


def _check_entry(entry: object, where: str, source: str) -> None:
    if not isinstance(entry, dict):
        raise ManifestError(f"{source}: {where} is not an object")
    name, size, sha = entry.get("name"), entry.get("size"), entry.get("sha256")
    if not isinstance(name, str) or not _SAFE_NAME.fullmatch(name) or name in (".", ".."):
        raise ManifestError(f"{source}: {where} has an unsafe or missing name {name!r}")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ManifestError(f"{source}: {where} ({name}) has no valid size")
    if not isinstance(sha, str) or not _SHA256.fullmatch(sha):
        raise ManifestError(f"{source}: {where} ({name}) has no valid sha256")


def validate(manifest: object, source: str) -> dict:
    """Check structure, schema version and internal consistency; return the manifest."""
    if not isinstance(manifest, dict) or manifest.get("kind") != KIND:
        raise ManifestError(f"{source} is not a jax-aiter JIT-library manifest (kind is not {KIND!r})")
    schema = manifest.get("schema")
    if schema != SCHEMA:
        raise ManifestError(
            f"{source} has manifest schema {schema!r}, but this jax-aiter reads schema {SCHEMA} only; "
            "upgrade jax-aiter (`pip install -U jax-aiter`) or fetch with the version that published it")
    ident = manifest.get("identity")
    if not isinstance(ident, dict) or any(k not in ident for k in reuse_gate.GATED_FIELDS):
        raise ManifestError(f"{source}: identity is missing or lacks one of {', '.join(reuse_gate.GATED_FIELDS)}")
    cid = reuse_gate.cache_id(ident)
    if ident.get("cache_id") != cid or manifest.get("release_tag") != reuse_gate.release_tag(cid):
        raise ManifestError(
            f"{source}: cache id {ident.get('cache_id')!r} / release tag {manifest.get('release_tag')!r} do not "
            f"match its identity (which hashes to {cid}); the manifest was edited or corrupted")
    comp_spec = manifest.get("compression")
    if not isinstance(comp_spec, dict) or comp_spec.get("codec") != "zstd" or not (
            isinstance(comp_spec.get("window_log"), int) and 10 <= comp_spec["window_log"] <= 31):
        raise ManifestError(f"{source}: compression must be zstd with a window_log between 10 and 31")
    files = manifest.get("files")
    if not isinstance(files, list) or not files:
        raise ManifestError(f"{source}: no files listed")
    seen: set[str] = set()
    for i, f in enumerate(files):
        _check_entry(f, f"files[{i}]", source)
        comp = f.get("compressed")
        _check_entry(comp, f"files[{i}].compressed", source)
        parts = comp.get("parts")
        if not isinstance(parts, list) or not parts:
            raise ManifestError(f"{source}: files[{i}].compressed has no parts")
        for j, part in enumerate(parts):
            _check_entry(part, f"files[{i}].compressed.parts[{j}]", source)
        if sum(p["size"] for p in parts) != comp["size"]:
            raise ManifestError(f"{source}: the parts of {comp['name']} do not add up to its size {comp['size']}")
        names = [f["name"], *(p["name"] for p in parts)]
        if seen & set(names) or len(set(names)) != len(names) or MANIFEST_NAME in names:
            raise ManifestError(f"{source}: file or asset names repeat ({', '.join(names)})")
        seen.update(names)
    return manifest


def parse(data: bytes | str, source: str) -> dict:
    """Decode and validate manifest bytes; `source` (a URL or path) is named in every error."""
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise ManifestError(f"{source} is not valid JSON ({e}); the download may be truncated or not a manifest")
    return validate(obj, source)


def dumps(manifest: dict) -> str:
    return json.dumps(manifest, indent=2, sort_keys=True) + "\n"


def select_files(manifest: dict, names: list[str] | tuple[str, ...] | None = None) -> list[dict]:
    """The manifest's file records, all or only `names` (each must be listed)."""
    files = manifest["files"]
    if names is None:
        return list(files)
    listed = {f["name"] for f in files}
    missing = [n for n in names if n not in listed]
    if missing:
        raise ManifestError(f"release {manifest['release_tag']} has no {', '.join(missing)} "
                            f"(it lists {', '.join(sorted(listed))})")
    return [f for f in files if f["name"] in names]


def raw_entries(files: list[dict]) -> list[dict]:
    """The raw {name, size, sha256} of file records, as integrity.verify_entries takes them."""
    return [{"name": f["name"], "size": f["size"], "sha256": f["sha256"]} for f in files]
