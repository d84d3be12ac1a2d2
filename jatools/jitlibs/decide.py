"""Reuse or rebuild the JIT libraries: this checkout's identity against a published release or a local record.

Reuse is hard-gated (jax_aiter.download.reuse_gate): the producer job asks `run_decide` whether a release for this
checkout's identity exists; a consumer's `require_built` fails at once on a miss, naming the reason; it never
starts a build.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from jatools import config, steps
from jatools.jitlibs.record import JitCacheError, write_json
from jatools.native import jit_build
from jax_aiter import remedies
from jax_aiter.download import manifest as mf
from jax_aiter.download import release, reuse_gate, transfer
from jax_aiter.integrity import RECORD_NAME, diff_entries

Log = Callable[[str], None]


def default_base_url(settings: config.Settings, flag: str | None = None) -> str:
    """--base-url, else JA_FETCH_BASE_URL, else pyproject's jit_libs_base_url."""
    return transfer.resolve_base_url(flag, settings.raw.get("jit_libs_base_url"))


def strict_toolchain(settings: config.Settings, flag: bool | None) -> bool:
    return settings.toolchain_strict if flag is None else flag


@dataclass
class Decision:
    decision: str  # "reuse" | "rebuild"
    cache_id: str
    release_tag: str
    source: str
    reasons: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    wanted: dict = field(default_factory=dict)
    found: dict | None = None

    @property
    def rebuild(self) -> bool:
        return self.decision == "rebuild"

    def to_json(self) -> dict:
        return {**asdict(self), "rebuild": self.rebuild}


def decide(want: dict, found: dict | None, source: str, strict: bool = False) -> Decision:
    """`reuse` only when every gated field matches (and, if strict, the toolchain); every reason is kept."""
    cid = want["cache_id"]
    d = Decision("rebuild", cid, reuse_gate.release_tag(cid), source, wanted=want, found=found)
    if want.get("kernel_source_dirty"):
        d.reasons.append(f"the kernel sources have uncommitted changes: revision {want['kernel_source_revision']} "
                         "does not describe them, so no published build matches")
    if found is None:
        d.reasons.append(f"no build found at {source}")
        return d
    cmp = reuse_gate.compare(want, found, strict)
    d.warnings += cmp.warnings
    d.reasons += cmp.mismatches
    if not d.reasons:
        d.decision = "reuse"
        d.reasons.append(f"{', '.join(cmp.matched)} match {source}")
    return d


def _local_identity(against: Path) -> tuple[dict | None, str]:
    """The identity a local manifest or build record holds (None, and why, when it has none that counts)."""
    try:
        data = json.loads(against.read_text())
    except (OSError, ValueError) as e:
        raise JitCacheError(f"cannot read {against}: {e}") from None
    if data.get("kind") == mf.KIND:
        return mf.validate(data, str(against))["identity"], str(against)
    if "modules" not in data:
        raise JitCacheError(f"{against} is neither a JIT-library manifest nor a build record")
    if data.get("identity") is None:
        return None, f"{against} (its modules were built with different identities)"
    missing = diff_entries(against.parent, data.get("files", [])) if against.name == RECORD_NAME else []
    if missing:
        return None, f"{against} (its files are not intact: {'; '.join(missing)})"
    return data["identity"], str(against)


def found_identity(settings: config.Settings, want: dict, base_url: str | None, against: Path | None,
                   opts: transfer.FetchOptions, log: Log) -> tuple[dict | None, str]:
    """The identity to compare with: a local manifest or build record (`against`), else the published release."""
    if against is not None:
        return _local_identity(against)
    base = default_base_url(settings, base_url)
    try:
        manifest, url = release.read_manifest(base, want["cache_id"], opts, log)
    except transfer.ReleaseNotFound:
        return None, f"{transfer.release_url(base, want['cache_id'])} (no such release)"
    return manifest["identity"], url


def run_decide(settings: config.Settings, *, base_url: str | None = None, against: Path | None = None,
               strict: bool | None = None, json_path: Path | None = None, log: Log = print) -> Decision:
    """Decide, log why, and write the decision as JSON (atomically) and, when set, as `decision=`/`rebuild=`
    lines in $GITHUB_OUTPUT."""
    want, notes = jit_build.checkout_identity(settings)
    for n in notes:
        log(f"decide: {n}")
    found, source = found_identity(settings, want, base_url, against, transfer.FetchOptions.from_env(), log)
    d = decide(want, found, source, strict_toolchain(settings, strict))
    log(f"decide: {d.decision} ({d.release_tag})")
    for line in [f"  reason: {r}" for r in d.reasons] + [f"  warning: {w}" for w in d.warnings]:
        log(line)
    write_json(json_path or settings.build_dir / "jit_libs_decision.json", d.to_json())
    steps.github_output({"decision": d.decision, "rebuild": str(d.rebuild).lower(), "cache_id": d.cache_id,
                          "release_tag": d.release_tag})
    return d


def require_built(settings: config.Settings, strict: bool | None = None) -> Decision:
    """A consumer's check: build/aiter_build holds this checkout's JIT libraries, intact, or this fails at once
    (nothing is built or fetched), naming the cache id, why the libraries there do not do, and the producer."""
    record = settings.jit_dir / RECORD_NAME
    d = run_decide(settings, against=record, strict=strict, log=lambda m: None) if record.is_file() \
        else decide(jit_build.checkout_identity(settings)[0], None, str(record))
    if d.rebuild:
        raise JitCacheError(
            f"no JIT libraries for cache id {d.cache_id} in {settings.jit_dir} ({'; '.join(d.reasons)}). "
            "This run is a consumer (JA_JIT_LIBS=take, or CI=true): it never builds them. Get them from the "
            f"producer: `{remedies.door('jit_fetch')}` (release {d.release_tag}, published by "
            f".github/workflows/jit-libs.yml), or build them here with `{remedies.door('jit')}`")
    print(f"native build: JIT libraries for cache id {d.cache_id} taken from {settings.jit_dir} "
          "(identity and every file's sha256 match)", flush=True)
    return d


def show(source: str) -> list[str]:
    """A manifest (path or URL), validated and summarised: release tag, identity, files."""
    data = (transfer.fetch_bytes(source, transfer.FetchOptions.from_env()) if "://" in source
            else Path(source).read_bytes())
    m = mf.parse(data, source)
    lines = [f"{m['release_tag']}  schema {m['schema']}  created {m.get('created_utc', '?')}"]
    lines += [f"  {key}: {json.dumps(m['identity'].get(key))}" for key in (*reuse_gate.GATED_FIELDS, "toolchain")]
    for f in m["files"]:
        c = f["compressed"]
        lines.append(f"  {f['name']:<20} {f['size']:>14,d} B  sha256 {f['sha256'][:16]}  -> {c['size']:>14,d} B "
                     f"in {len(c['parts'])} part(s)")
    return lines
