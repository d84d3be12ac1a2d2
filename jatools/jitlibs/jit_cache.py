"""The JIT libraries in build/aiter_build: decide (reuse or rebuild), fetch, verify, and what a wheel expects.

Reuse is hard-gated (jax_aiter.reuse_gate): the producer job asks `decide`
whether a release for this checkout's identity exists; consumer jobs `fetch`
it and fail at once on a miss, naming the reason; they never start a build.

The wheel build trusts no JIT library it finds on disk: it checks each against
`expectations()` (sha256/size and build identity from the record written with
the libraries) before staging and again after reading it back from the wheel.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from jatools import atomic_write, config, steps
from jatools.native import jit_build
from jax_aiter import fetch, reuse_gate
from jax_aiter import manifest as mf
from jax_aiter.integrity import (
    RECORD_NAME,
    IntegrityError,
    diff_entries,
    read_record,
    verify_entries,
)

Log = Callable[[str], None]
FIX = ("rebuild the JIT libraries with `python3 jax_aiter/jit/build_jit.py` or fetch published ones with "
       "`invoke jit.fetch`")
CHANGED = f"the JIT library changed after its record was written. {FIX[0].upper()}{FIX[1:]}."


class JitCacheError(RuntimeError):
    """A decision, fetch or verification that failed; the message names the cause and the fix."""


def default_base_url(settings: config.Settings, flag: str | None = None) -> str:
    """--base-url, else JA_FETCH_BASE_URL, else pyproject's jit_libs_base_url."""
    return fetch.resolve_base_url(flag, settings.raw.get("jit_libs_base_url"))


def strict_toolchain(settings: config.Settings, flag: bool | None) -> bool:
    return settings.toolchain_strict if flag is None else flag


# --- decide -------------------------------------------------------------------------------

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


def found_identity(settings: config.Settings, want: dict, base_url: str | None, against: Path | None,
                   opts: fetch.FetchOptions, log: Log) -> tuple[dict | None, str]:
    """The identity to compare with: a local manifest or build record (`against`), else the published release."""
    if against is not None:
        try:
            data = json.loads(against.read_text())
        except (OSError, ValueError) as e:
            raise JitCacheError(f"cannot read {against}: {e}") from None
        if data.get("kind") == mf.KIND:
            return mf.validate(data, str(against))["identity"], str(against)
        if "modules" in data:  # a build record
            if data.get("identity") is None:
                return None, f"{against} (its modules were built with different identities)"
            missing = diff_entries(against.parent, data.get("files", [])) if against.name == RECORD_NAME else []
            if missing:
                return None, f"{against} (its files are not intact: {'; '.join(missing)})"
            return data["identity"], str(against)
        raise JitCacheError(f"{against} is neither a JIT-library manifest nor a build record")
    base = default_base_url(settings, base_url)
    try:
        manifest, url = fetch.read_manifest(base, want["cache_id"], opts, log)
    except fetch.ReleaseNotFound:
        return None, f"{fetch.release_url(base, want['cache_id'])} (no such release)"
    return manifest["identity"], url


def run_decide(settings: config.Settings, *, base_url: str | None = None, against: Path | None = None,
               strict: bool | None = None, json_path: Path | None = None, log: Log = print) -> Decision:
    """Decide, log why, and write the decision as JSON (atomically) and, when set, as `decision=`/`rebuild=`
    lines in $GITHUB_OUTPUT."""
    want, notes = jit_build.checkout_identity(settings)
    for n in notes:
        log(f"decide: {n}")
    found, source = found_identity(settings, want, base_url, against, fetch.FetchOptions.from_env(), log)
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
            f"producer: `invoke jit.fetch` (release {d.release_tag}, published by .github/workflows/jit-libs.yml), "
            "or build them here with `nox -s jit` (or `make jit`)")
    print(f"native build: JIT libraries for cache id {d.cache_id} taken from {settings.jit_dir} "
          "(identity and every file's sha256 match)", flush=True)
    return d


def show(source: str) -> list[str]:
    """A manifest (path or URL), validated and summarised: release tag, identity, files."""
    data = (fetch.fetch_bytes(source, fetch.FetchOptions.from_env()) if "://" in source
            else Path(source).read_bytes())
    m = mf.parse(data, source)
    lines = [f"{m['release_tag']}  schema {m['schema']}  created {m.get('created_utc', '?')}"]
    lines += [f"  {key}: {json.dumps(m['identity'].get(key))}" for key in (*reuse_gate.GATED_FIELDS, "toolchain")]
    for f in m["files"]:
        c = f["compressed"]
        lines.append(f"  {f['name']:<20} {f['size']:>14,d} B  sha256 {f['sha256'][:16]}  -> {c['size']:>14,d} B "
                     f"in {len(c['parts'])} part(s)")
    return lines


# --- fetch into the build tree ---------------------------------------------------------------

def record_from_manifest(manifest: dict, url: str) -> dict:
    """A build record (schema 1, as build_jit.py writes) for fetched libraries, so every later step
    (verify, wheel staging) reads one format whether the libraries were built or fetched."""
    ident = manifest["identity"]
    modules = {f.get("module") or f["name"][3:-3]: {"identity": ident, "instances": f.get("instances"),
                                                    "file": {k: f[k] for k in ("name", "size", "sha256")}}
               for f in manifest["files"]}
    return {"schema": 1, "identity": ident, "modules": modules, "files": mf.raw_entries(manifest["files"]),
            "last_build": {"fetched_from": url, "release_tag": manifest["release_tag"], "modules": sorted(modules)}}


def write_json(path: Path, data: dict) -> None:
    """A record or report as sorted, indented JSON, written atomically."""
    atomic_write.write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def run_fetch(settings: config.Settings, *, base_url: str | None = None, strict: bool | None = None,
              force: bool = False, log: Log = print, pins_from: str | None = None) -> fetch.FetchResult:
    """Fetch this checkout's release into build/aiter_build; a miss raises, it never builds.

    `pins_from`: the base URL the producer published to (the release passes pyproject's jit_libs_base_url); the
    libraries it lists for this cache id are the pins, and a fetched set that differs is refused before download."""
    want, notes = jit_build.checkout_identity(settings)
    for n in notes:
        log(f"fetch: {n}")
    if want.get("kernel_source_dirty"):
        raise JitCacheError(
            f"the kernel sources ({settings.kernel_source_dir}) have uncommitted changes, so no published release "
            "matches them; commit them, or build locally with `python3 jax_aiter/jit/build_jit.py`")
    base, opts = default_base_url(settings, base_url), fetch.FetchOptions.from_env()
    strict = strict_toolchain(settings, strict)
    if pins_from and fetch.as_url(pins_from) != fetch.as_url(base):
        published, url = fetch.read_manifest(pins_from, want["cache_id"], opts, log)
        fetch.check_identity(want, published, url, strict)
        want = {**want, "pins": mf.raw_entries(published["files"])}
        log(f"fetch: pinned to the {len(published['files'])} libraries the producer published at {url}")
    result = fetch.fetch_release(base, want, settings.jit_dir, strict_toolchain=strict, force=force, opts=opts,
                                 log=log)
    write_json(settings.jit_dir / RECORD_NAME, record_from_manifest(result.manifest, result.url))
    write_json(settings.build_dir / "jit_libs_fetch.json", {
        "status": result.status, "release_tag": result.manifest["release_tag"], "url": result.url,
        "dest": str(result.dest), "files": result.files, "downloaded_bytes": result.downloaded_bytes,
        "seconds": round(result.seconds, 2), "warnings": result.warnings})
    return result


# --- what a wheel expects -------------------------------------------------------------------

class JitExpectationError(RuntimeError):
    """No usable record of the JIT libraries; the message says how to get one."""


@dataclass(frozen=True)
class JitExpectations:
    source: Path
    identity: dict
    entries: dict[str, dict]  # library file name -> {name, size, sha256}

    def entry(self, name: str) -> dict:
        if name not in self.entries:
            raise JitExpectationError(
                f"{name} has no entry in {self.source} (recorded: {', '.join(sorted(self.entries)) or 'none'}); "
                f"{FIX}")
        return self.entries[name]

    def check_digest(self, name: str, sha256: str, where: str) -> None:
        """Raise IntegrityError when `sha256` (of `name` as found at `where`) differs from the record."""
        want = self.entry(name)["sha256"]
        if sha256 != want:
            raise IntegrityError(f"{where}: sha256 {sha256} does not match {want} recorded in {self.source}; {CHANGED}")

    def verify_folder(self, folder: Path, names: list[str]) -> None:
        """Hash `names` in `folder` (in parallel) against the record; IntegrityError names any difference."""
        entries = [self.entry(n) for n in names]
        try:
            verify_entries(folder, entries)
        except IntegrityError as e:
            raise IntegrityError(f"{e} ({self.source}); {CHANGED}") from None


def expectations(settings: config.Settings, source: Path | None = None) -> JitExpectations:
    """The expected JIT libraries: `source` when given (a manifest with the same `identity` and `files` fields
    will do), else the build record in settings.jit_dir, written last, after the libraries."""
    path = source or settings.jit_dir / RECORD_NAME
    if not path.is_file():
        raise JitExpectationError(
            f"{path} is missing, so the JIT libraries in {settings.jit_dir} have no recorded hashes; {FIX}")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise JitExpectationError(f"{path} is not valid JSON ({e}); {FIX}") from e
    ident = data.get("identity")
    if not ident:
        modules = ", ".join(sorted(data.get("modules", {})))
        raise JitExpectationError(
            f"{path}: the JIT libraries ({modules}) come from builds with different identities, so no single "
            f"build identity can be baked into a wheel; {FIX}")
    entries = {e["name"]: e for e in data.get("files", [])}
    return JitExpectations(source=path, identity=ident, entries=entries)


# --- verify -------------------------------------------------------------------------------------

def verify(folder: Path, against: str | None = None, expected: list[str] | None = None) -> tuple[str, int]:
    """Check `folder` against a manifest (path or URL) or, by default, its build record (else its manifest copy);
    (what it was checked against, number of files), or an error naming every difference. `expected` (the op
    table's JIT libraries) makes the set strict: a table library the record lacks, a listed one the table
    lacks, or a library in the folder it does not list differs too."""
    try:
        if against and "://" in against:
            source = against
            entries = mf.raw_entries(mf.parse(fetch.fetch_bytes(against, fetch.FetchOptions.from_env()),
                                              source)["files"])
        else:
            path = Path(against) if against else next(
                (folder / n for n in (RECORD_NAME, mf.MANIFEST_NAME) if (folder / n).is_file()), None)
            if path is None:
                raise JitCacheError(f"{folder} has neither {RECORD_NAME} nor {mf.MANIFEST_NAME}: nothing to verify "
                                    "against; build (`python3 jax_aiter/jit/build_jit.py`) or fetch "
                                    "(`invoke jit.fetch`) first")
            source = against or str(path)
            # A given file is read as what it says it is; the folder's own files by their names.
            manifest = _json_kind(path) == mf.KIND if against else path.name == mf.MANIFEST_NAME
            entries = (mf.raw_entries(mf.parse(path.read_bytes(), source)["files"]) if manifest
                       else list(read_record(path, f"; {FIX}").values()))
    except (IntegrityError, mf.ManifestError, ValueError) as e:
        raise JitCacheError(str(e)) from None
    problems = []
    if expected is not None:
        listed = {e["name"] for e in entries}
        problems += [f"{n}: the op table names it, but {source} does not list it" for n in expected if n not in listed]
        problems += [f"{n}: listed in {source}, but the op table ({', '.join(expected)}) has no such library"
                     for n in sorted(listed - set(expected))]
        problems += [f"{p}: a library in the folder that {source} does not list" for p in sorted(folder.glob("lib*.so"))
                     if p.name not in listed and p.name not in expected]
    problems += diff_entries(folder, entries)
    if problems:
        raise JitCacheError(f"{len(problems)} difference(s) between {folder} and {source}:\n  " + "\n  ".join(problems))
    return source, len(entries)


def _json_kind(path: Path) -> str | None:
    try:
        obj = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None  # read_record says what is wrong with it
    return obj.get("kind") if isinstance(obj, dict) else None


def errors() -> tuple[type[BaseException], ...]:
    """The failures the command-line front ends (CLI, invoke) turn into a message and a non-zero exit."""
    from jatools.jitlibs import publish
    from jatools.native import toolchain
    from jax_aiter.blob import BlobError

    return (JitCacheError, publish.PublishError, fetch.FetchError, mf.ManifestError,
            toolchain.ToolchainError, IntegrityError, BlobError, OSError, ValueError)
