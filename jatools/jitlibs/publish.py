"""Publish the JIT libraries of build/aiter_build as the immutable release `jit-libs-<cache-id>`.

Order of work, so that nothing half-made is ever visible:
1. check the build: one identity for all modules, a clean kernel tree, every
   configured module built, bytes equal to the build record;
2. compress each library with zstd (long-distance matching, all cores), split
   into parts of at most the per-asset limit, and hash each part and the blob;
3. prove each blob by decompressing it and re-hashing the output;
4. write the manifest (in a staging folder that appears by one rename);
5. upload the parts, then the manifest last; a release whose manifest exists
   is complete and is never overwritten.

The upload target is swappable: a folder, a file:// URL, an HTTP(S) server that
takes PUT, or a GitHub release (named as gh[:OWNER/REPO] or by its release-download URL) (`gh release upload`,
run through a runner the
caller may replace, e.g. invoke's context). Each has a `description`,
`existing_manifest()` (the published manifest, else None) and `upload(paths)`
(called for the parts, then for the manifest alone).

The shard merge before publishing is jatools/jitlibs/merge.py.
"""
from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from jatools import atomic_write, config
from jatools.native import jit_build
from jax_aiter import __version__, remedies
from jax_aiter.download import blob, folder_lock, provenance, reuse_gate, transfer
from jax_aiter.download import manifest as mf
from jax_aiter.download.progress import Progress
from jax_aiter.integrity import (
    RECORD_NAME,
    RECORD_SCHEMA,
    IntegrityError,
    diff_entries,
    file_entry,
    verify_entries,
)

Log = Callable[[str], None]
Runner = Callable[[list[str]], tuple[int, str, str]]


class PublishError(RuntimeError):
    """Publishing refused or failed; the message says why and what to do. Nothing partial is visible."""


@dataclass(frozen=True)
class Compression:
    level: int
    window_log: int
    threads: int = -1  # all cores
    long_distance_matching: bool = True

    @classmethod
    def from_settings(cls, settings: config.Settings, level: int | None = None,
                      window_log: int | None = None) -> Compression:
        return cls(level if level is not None else int(settings.raw["jit_libs_zstd_level"]),
                   window_log if window_log is not None else int(settings.raw["jit_libs_zstd_window_log"]))

    def describe(self) -> dict:
        return {"codec": "zstd", "level": self.level, "window_log": self.window_log,
                "long_distance_matching": self.long_distance_matching}


# --- the build to publish -------------------------------------------------------------

def load_record(jit_dir: Path) -> dict:
    path = jit_dir / RECORD_NAME
    if not path.is_file():
        raise PublishError(f"{path} does not exist: nothing was built here; run `{remedies.door('jit')}`")
    try:
        record = json.loads(path.read_text())
    except ValueError as e:
        raise PublishError(f"{path} is not valid JSON ({e}); rebuild with `{remedies.door('jit')}`")
    if record.get("schema") != RECORD_SCHEMA:
        raise PublishError(f"{path} has build-record schema {record.get('schema')!r}; this tool reads schema "
                           f"{RECORD_SCHEMA}")
    return record


def publishable_identity(record: dict, jit_dir: Path, settings: config.Settings) -> dict:
    """The record's identity, after proving the build may be published as one release."""
    ident = record.get("identity")
    if ident is None:
        per = {n: m["identity"].get("cache_id") for n, m in record["modules"].items()}
        raise PublishError(
            f"the modules in {jit_dir / RECORD_NAME} were built with different identities "
            f"({', '.join(f'{n}: {c}' for n, c in sorted(per.items()))}); rebuild all of them with "
            f"`{remedies.door('jit')}`")
    if ident.get("kernel_source_dirty"):
        raise PublishError(
            f"the libraries were built from kernel sources with uncommitted changes (revision "
            f"{ident['kernel_source_revision']} plus edits), which no identity describes; commit the changes, "
            f"rebuild (`{remedies.door('jit')}`) and publish again")
    configured = jit_build.libraries(settings)
    missing = sorted(set(configured) - set(record["modules"]))
    if missing:
        raise PublishError(f"modules {', '.join(missing)} are configured but not built; run "
                           f"`{remedies.door('jit', missing)}`")
    try:
        verify_entries(jit_dir, record["files"])
    except IntegrityError as e:
        raise PublishError(f"the libraries differ from their build record: {e}; rebuild "
                           f"(`{remedies.door('jit')}`) before publishing") from None
    return ident


# --- compression ----------------------------------------------------------------------

class _CountingReader:
    """A file reader that reports how much has been read (compression progress)."""

    def __init__(self, fh, advance: Callable[[int], None]):
        self._fh, self._advance = fh, advance

    def read(self, n: int = -1) -> bytes:
        data = self._fh.read(n)
        self._advance(len(data))
        return data


class _HashingWriter:
    """A write sink that passes the compressed stream on and hashes it as it goes (no second read)."""

    def __init__(self, fh):
        self._fh, self.sha = fh, hashlib.sha256()

    def write(self, data) -> int:
        self.sha.update(data)
        return self._fh.write(data)


def compress(src: Path, out_dir: Path, comp: Compression, asset_limit: int,
             advance: Callable[[int], None] = lambda n: None) -> dict:
    """Compress `src` to `<name>.zst` in `out_dir`: {name, size, sha256, parts: [{name, size, sha256}, ...]}.

    A blob over `asset_limit` is split into `<name>.partNNN` files; one that fits stays one plainly named asset.
    """
    zstd = blob.zstd_module()
    size = src.stat().st_size
    params = zstd.ZstdCompressionParameters.from_level(
        comp.level, source_size=size, window_log=comp.window_log, enable_ldm=comp.long_distance_matching,
        threads=comp.threads)
    dest = out_dir / f"{src.name}.zst"
    with open(src, "rb") as fh, open(dest, "wb") as out:
        sink = _HashingWriter(out)
        zstd.ZstdCompressor(compression_params=params).copy_stream(_CountingReader(fh, advance), sink, size=size,
                                                                   read_size=4 << 20, write_size=4 << 20)
    whole = file_entry(dest, sink.sha.hexdigest())
    if whole["size"] <= asset_limit:
        return {**whole, "parts": [dict(whole)]}
    parts = []
    with open(dest, "rb") as fh:
        for i in range(-(-whole["size"] // asset_limit)):
            part = out_dir / f"{dest.name}.part{i:03d}"
            with open(part, "wb") as out:
                sink, left = _HashingWriter(out), asset_limit
                while left and (chunk := fh.read(min(left, 4 << 20))):
                    sink.write(chunk)
                    left -= len(chunk)
            parts.append(file_entry(part, sink.sha.hexdigest()))
    dest.unlink()
    return {**whole, "parts": parts}


def verify_blob(out_dir: Path, raw: dict, comp: Compression) -> None:
    """Decompress the staged blob and prove it yields exactly the library (size and sha256)."""
    c = raw["compressed"]
    verify_entries(out_dir, c["parts"])
    size, sha, comp_sha = blob.decode([out_dir / p["name"] for p in c["parts"]], comp.window_log, raw["size"],
                                      label=c["name"])
    if (size, sha, comp_sha) != (raw["size"], raw["sha256"], c["sha256"]):
        raise PublishError(f"{c['name']} decompresses to {size} bytes with sha256 {sha} (blob sha256 {comp_sha}); "
                           f"expected {raw['size']} bytes with sha256 {raw['sha256']} (blob {c['sha256']}); "
                           "nothing was uploaded")


def _complete_stage(folder: Path, ident: dict, raw: list[dict], comp: Compression, asset_limit: int) -> dict | None:
    """The manifest of an earlier, complete staging of exactly these libraries (so a failed upload can be
    retried without compressing again), or None."""
    done = folder / mf.MANIFEST_NAME
    try:
        staged = mf.parse(done.read_bytes(), str(done))
    except (OSError, mf.ManifestError):
        return None
    if (staged["identity"] != ident or mf.raw_entries(staged["files"]) != raw
            or staged["compression"] != comp.describe() or staged.get("asset_limit") != asset_limit):
        return None
    parts = [p for f in staged["files"] for p in f["compressed"]["parts"]]
    return None if diff_entries(folder, parts) else staged


def stage(record: dict, ident: dict, jit_dir: Path, stage_root: Path, comp: Compression, asset_limit: int,
          log: Log) -> tuple[dict, Path]:
    """Compressed, verified blobs and the manifest in `stage_root/<tag>/` (reused when already complete)."""
    tag = reuse_gate.release_tag(ident["cache_id"])
    folder = stage_root / tag
    raw = {f["name"]: f for f in record["files"]}
    staged = _complete_stage(folder, ident, [raw[n] for n in sorted(raw)], comp, asset_limit)
    if staged is not None:
        log(f"publish: reusing the staged, verified blobs in {folder}")
        return staged, folder
    stage_root.mkdir(parents=True, exist_ok=True)
    tmp = stage_root / f".{tag}.tmp-{os.getpid()}"
    tmp.mkdir()
    modules = {m["file"]["name"]: (name, m.get("instances")) for name, m in record["modules"].items()}
    files = []
    try:
        with Progress(None, log) as progress:
            for name in sorted(raw):
                start = time.monotonic()
                entry = dict(raw[name])
                entry["module"], entry["instances"] = modules[name]
                entry["compressed"] = compress(jit_dir / name, tmp, comp, asset_limit,
                                               progress.task(f"compress {name}", entry["size"]))
                took = time.monotonic() - start
                verify_blob(tmp, entry, comp)
                c = entry["compressed"]
                log(f"publish: {name} {entry['size'] / 1e6:.1f} MB -> {c['size'] / 1e6:.1f} MB "
                    f"({100 * c['size'] / max(entry['size'], 1):.1f}%, {len(c['parts'])} part(s)) in {took:.1f} s "
                    f"({entry['size'] / 1e6 / max(took, 1e-9):.0f} MB/s); decompressed and verified")
                files.append(entry)
        manifest = {"kind": mf.KIND, "schema": mf.SCHEMA, "release_tag": tag, "identity": ident,
                    "compression": comp.describe(), "asset_limit": asset_limit, "files": files,
                    "created_utc": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                    "producer": {"jax_aiter_version": __version__, "tool": "jatools.jitlibs.publish"}}
        mf.validate(manifest, "the new manifest")
        (tmp / mf.MANIFEST_NAME).write_text(mf.dumps(manifest))
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest, folder


# --- upload targets ---------------------------------------------------------------------

class FolderTarget:
    """A folder (or file:// URL): `<folder>/<tag>/<asset>`, each written to a temporary name and renamed."""

    def __init__(self, root: Path, tag: str, log: Log = print):
        self.folder = root / tag
        self.description = str(self.folder)
        self.log = log

    def existing_manifest(self) -> bytes | None:
        path = self.folder / mf.MANIFEST_NAME
        return path.read_bytes() if path.is_file() else None

    def upload(self, paths: list[Path]) -> None:
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            with folder_lock.hold(self.folder, "publish", self.log):  # one publish at a time writes here
                atomic_write.remove_dead_temps(self.folder, lambda m: self.log(f"publish: {m}"))
                for p in paths:
                    tmp = self.folder / f".{p.name}.tmp-{os.getpid()}"
                    shutil.copyfile(p, tmp)
                    os.replace(tmp, self.folder / p.name)
        except OSError as e:
            raise PublishError(f"cannot write to {e.filename or self.folder}: {e.strerror or e}; "
                               "choose a writable target (--to)") from None


class HttpTarget:
    """An HTTP(S) server that stores what is PUT to `<base>/<tag>/<asset>` (an artifact store, a test server)."""

    def __init__(self, base_url: str, tag: str, opts: transfer.FetchOptions):
        self.url = self.description = f"{base_url.rstrip('/')}/{tag}"
        self.opts = opts

    def existing_manifest(self) -> bytes | None:
        try:
            return transfer.fetch_bytes(f"{self.url}/{mf.MANIFEST_NAME}", self.opts)
        except transfer.ReleaseNotFound:
            return None
        except transfer.FetchError as e:
            raise PublishError(f"cannot ask {self.url} whether the release exists: {e}") from None

    def upload(self, paths: list[Path]) -> None:
        for p in paths:
            with open(p, "rb") as fh:
                req = urllib.request.Request(f"{self.url}/{p.name}", data=fh, method="PUT", headers={
                    "Content-Length": str(p.stat().st_size), "Content-Type": "application/octet-stream"})
                try:
                    with urllib.request.urlopen(req, timeout=self.opts.timeout_s) as resp:
                        resp.read()
                except (urllib.error.URLError, OSError) as e:
                    raise PublishError(f"uploading {p.name} to {self.url} failed: {e}; the release has no "
                                       "manifest yet, so consumers ignore it; run the publish again") from None


def subprocess_runner(cmd: list[str]) -> tuple[int, str, str]:
    try:
        out = subprocess.run(cmd, check=False, capture_output=True, text=True)
    except FileNotFoundError:
        raise PublishError(f"{cmd[0]} not found; install the GitHub CLI (https://cli.github.com) and run "
                           "`gh auth login`, or publish to a folder or URL with --to") from None
    return out.returncode, out.stdout, out.stderr


def invoke_runner(ctx) -> Runner:
    """Run the gh commands through an invoke Context (so tasks can be tested with MockContext)."""
    def run(cmd: list[str]) -> tuple[int, str, str]:
        result = ctx.run(shlex.join(cmd), warn=True, hide=True)
        return result.exited, result.stdout, result.stderr
    return run


class GhReleaseTarget:
    """A GitHub release `<tag>` (of `repo`, or the checkout's), through the GitHub CLI."""

    def __init__(self, tag: str, repo: str | None, runner: Runner = subprocess_runner, notes: str = ""):
        self.tag, self.repo, self.run, self.notes = tag, repo, runner, notes
        self.description = f"GitHub release {tag}" + (f" of {repo}" if repo else "")

    def _gh(self, *args: str) -> list[str]:
        return ["gh", "release", *args] + (["--repo", self.repo] if self.repo else [])

    def existing_manifest(self) -> bytes | None:
        rc, out, err = self.run(self._gh("download", self.tag, "--pattern", mf.MANIFEST_NAME, "--output", "-"))
        if rc == 0:
            return out.encode()
        if "not found" in err.lower() or "no assets match" in err.lower():
            return None
        raise PublishError(f"`{shlex.join(self._gh('download', self.tag))}` failed (exit {rc}): {err.strip()}; "
                           "check `gh auth status` and the repository")

    def upload(self, paths: list[Path]) -> None:
        rc, _, _ = self.run(self._gh("view", self.tag, "--json", "tagName"))
        if rc != 0:
            rc, _, err = self.run(self._gh("create", self.tag, "--title", f"JIT libraries {self.tag}",
                                           "--notes", self.notes or self.tag))
            if rc != 0:
                raise PublishError(f"`gh release create {self.tag}` failed (exit {rc}): {err.strip()}")
        cmd = self._gh("upload", self.tag, *map(str, paths), "--clobber")
        rc, _, err = self.run(cmd)
        if rc != 0:
            raise PublishError(f"`{shlex.join(cmd)}` failed (exit {rc}): {err.strip()}; the release has no "
                               "manifest yet, so consumers ignore it; run the publish again")


def target_for(spec: str, tag: str, runner: Runner | None = None, notes: str = "",
               log: Log = print) -> FolderTarget | HttpTarget | GhReleaseTarget:
    """`gh` or `gh:OWNER/REPO`, a GitHub repository's release-download URL (JA_FETCH_BASE_URL on GitHub: its
    releases, through gh), another http(s):// URL, a file:// URL, or a folder: so a job can publish to the base URL
    its consumers fetch from."""
    repo = provenance.github_repo(spec)
    if spec == "gh" or spec.startswith("gh:") or repo:
        return GhReleaseTarget(tag, repo or spec[3:] or None, runner or subprocess_runner, notes)
    if spec.startswith(("http://", "https://")):
        return HttpTarget(spec, tag, transfer.FetchOptions.from_env())
    return FolderTarget(Path(urllib.request.url2pathname(transfer.as_url(spec)[len("file://"):])), tag, log)


# --- the whole step -----------------------------------------------------------------------

def publish(settings: config.Settings, to: str, *, level: int | None = None, window_log: int | None = None,
            asset_limit: int | None = None, stage_only: bool = False, runner: Runner | None = None,
            log: Log = print) -> dict:
    """Publish build/aiter_build; returns a summary (also written as JSON next to the staged release)."""
    start = time.monotonic()
    jit_dir = settings.jit_dir
    record = load_record(jit_dir)
    ident = publishable_identity(record, jit_dir, settings)
    tag = reuse_gate.release_tag(ident["cache_id"])
    comp = Compression.from_settings(settings, level, window_log)
    limit = asset_limit or int(settings.raw["jit_libs_asset_limit"])
    notes = "jax-aiter JIT libraries. Identity:\n\n```json\n" + json.dumps(ident, indent=2, sort_keys=True) + "\n```"
    target = None if stage_only else target_for(to, tag, runner, notes, log)
    existing = target.existing_manifest() if target else None
    if existing is not None:
        have = mf.parse(existing, f"{target.description}/{mf.MANIFEST_NAME}")
        if mf.raw_entries(have["files"]) == mf.raw_entries(sorted(record["files"], key=lambda f: f["name"])):
            log(f"publish: {tag} is already published at {target.description} with these exact libraries")
            return {"release_tag": tag, "target": target.description, "status": "already-published"}
        raise PublishError(
            f"{tag} is already published at {target.description} with other bytes; releases are immutable "
            "(consumers may have fetched it). Its libraries have the same identity, so reuse them "
            f"(`{remedies.door('jit_fetch')}`) instead of publishing")
    stage_root = settings.path("jit_publish")
    stage_root.mkdir(parents=True, exist_ok=True)
    with folder_lock.hold(stage_root, "publish", log):  # one publish at a time stages here
        atomic_write.remove_dead_temps(stage_root, lambda m: log(f"publish: {m}"))  # what killed ones left
        return _publish_staged(record, ident, jit_dir, stage_root, comp, limit, target, tag, start, log)


def _publish_staged(record: dict, ident: dict, jit_dir: Path, stage_root: Path, comp: Compression, limit: int,
                    target, tag: str, start: float, log: Log) -> dict:
    manifest, folder = stage(record, ident, jit_dir, stage_root, comp, limit, log)
    assets = [folder / p["name"] for f in manifest["files"] for p in f["compressed"]["parts"]]
    if target is not None:
        log(f"publish: uploading {len(assets)} asset(s) to {target.description}")
        target.upload(assets)
        target.upload([folder / mf.MANIFEST_NAME])  # last: its presence marks the release complete
    raw_total = sum(f["size"] for f in manifest["files"])
    comp_total = sum(f["compressed"]["size"] for f in manifest["files"])
    summary = {"release_tag": tag, "status": "staged" if target is None else "published",
               "target": target.description if target else None, "staged": str(folder),
               "files": len(manifest["files"]), "assets": len(assets), "raw_bytes": raw_total,
               "compressed_bytes": comp_total, "seconds": round(time.monotonic() - start, 2),
               "compression": comp.describe()}
    (stage_root / f"{tag}-summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    log(f"publish: {tag} {summary['status']}" + (f" to {summary['target']}" if target else f" in {folder}")
        + f": {len(manifest['files'])} library file(s), {raw_total / 1e6:.1f} MB -> {comp_total / 1e6:.1f} MB in "
        f"{len(assets)} asset(s), {summary['seconds']} s")
    return summary
