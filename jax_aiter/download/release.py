"""Fetch a `jit-libs-<cache-id>` release: download, verify every byte, install atomically.

One client serves CI (`invoke jit.fetch`, all libraries into build/aiter_build)
and users of the lite wheel (`jax-aiter-fetch-mha`, the attention libraries into
the per-install cache). The base URL may be https://, http://, file:// or a
plain folder; the release lives at `<base>/jit-libs-<cache-id>/` and its
manifest (jit-libs-manifest.json) says what to download.

Guarantees, because the libraries cost hours to rebuild and a wrong one gives
wrong answers:
- the manifest must be of a known schema and of exactly the wanted identity;
- every part, every compressed blob and every library is checked (size and
  sha256) before anything is installed; downloads stream through the
  decompressor and both hashes into the library file, so the compressed bytes
  are never stored, and each library is synced to the disk before the rename
  that makes it visible (the runtime loader trusts any library it finds);
- the transfers time out, retry, resume and report as jax_aiter/download/transfer.py says;
- work happens in a staging folder beside the destination, under a lock on its folder:
  a fresh destination appears by one rename, an existing one gets each library
  replaced by rename and the manifest copy last, so a killed or failed fetch
  leaves the previous good state; the next fetch clears its leftovers.

Runs at runtime, so it must not import JAX.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from jax_aiter import remedies
from jax_aiter.download import blob, folder_lock, provenance, reuse_gate, trust
from jax_aiter.download import manifest as mf
from jax_aiter.download.progress import Progress
from jax_aiter.download.transfer import (
    LIB_MODE,
    FetchError,
    FetchOptions,
    LibraryFile,
    Log,
    PartSink,
    ReleaseNotFound,
    _stderr,
    as_url,
    byte_text,
    download,
    fetch_bytes,
    release_url,
)
from jax_aiter.integrity import diff_entries

# --- release --------------------------------------------------------------------------

@dataclass
class FetchResult:
    status: str                    # "fetched" or "present" (already installed and verified)
    dest: Path
    url: str                       # the release URL
    manifest: dict
    files: list[str]
    downloaded_bytes: int = 0
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)


def read_manifest(base_url: str, cache_id: str, opts: FetchOptions, log: Log = _stderr) -> tuple[dict, str]:
    """The release's manifest, parsed and schema-checked; ReleaseNotFound when there is none."""
    url = f"{release_url(base_url, cache_id)}/{mf.MANIFEST_NAME}"
    log(f"fetch: reading the manifest {url}")
    try:
        data = fetch_bytes(url, opts, log)
    except ReleaseNotFound:
        raise ReleaseNotFound(
            f"no release {reuse_gate.release_tag(cache_id)} at {as_url(base_url)} ({url} not found): no JIT "
            f"libraries were published for this identity. Build them (`{remedies.door('jit')}`) "
            f"and publish them (`{remedies.door('jit_publish')}`), or use a base URL that has them") from None
    return mf.parse(data, url), url


def check_identity(want: dict, manifest: dict, source: str, strict_toolchain: bool) -> list[str]:
    """Refuse a manifest of another identity (naming every differing field); return the advisory warnings."""
    cmp = reuse_gate.compare(want, manifest["identity"], strict_toolchain)
    cid = want.get("cache_id") or reuse_gate.cache_id(want)
    if manifest["release_tag"] != reuse_gate.release_tag(cid):
        cmp.mismatches.insert(0, f"release tag: wanted {reuse_gate.release_tag(cid)}, found {manifest['release_tag']}")
    if cmp.mismatches:
        raise FetchError(f"{source} is for another build identity: {'; '.join(cmp.mismatches)}. These libraries "
                         "would not match this checkout or install; nothing was installed")
    return cmp.warnings


def _lock(dest: Path, opts: FetchOptions, log: Log) -> folder_lock.FolderLock:
    """The lock on the destination's parent (jax_aiter/folder_lock.py: the JIT build of a build tree takes the same
    one, so a fetch into build/aiter_build and a build there take turns)."""
    try:
        lock = folder_lock.FolderLock(dest.parent)
    except OSError as e:
        raise FetchError(f"cannot lock {dest.parent} for the fetch: {e.strerror or e} (it must be a real folder, "
                         "not a symlink); choose another destination (--dest)") from None
    if not folder_lock.take(lock, "fetch", log, timeout=opts.lock_timeout_s):  # a run above this one: goes on
        lock.release()
        raise FetchError(f"another fetch into {dest.parent} held its lock for more than "
                         f"{opts.lock_timeout_s:g} s; wait for it or stop it, then run again")
    return lock



def _prepare_parent(dest: Path) -> None:
    try:
        trust.make_folders(dest.parent)  # mode 755 whatever the umask: the loader refuses a folder others may write
        for folder, parent in ((dest.parent, True), (dest, False)):
            why = trust.others_can_write(folder, parent)
            if why:
                raise FetchError(f"refusing to install libraries {'beside' if parent else 'into'} {folder}: {why}, "
                                 "so another user could swap them for code that runs as whoever loads them (and the "
                                 f"loader would refuse them). Fix it ({trust.fix(folder)}) or choose a folder of "
                                 "your own (--dest, JAX_AITER_LIB_DIR or XDG_CACHE_HOME). Nothing was downloaded")
        probe = dest.parent / f".{dest.name}.probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
        if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
            raise FetchError(f"the destination {dest} is {'a symlink' if dest.is_symlink() else 'not a folder'}; "
                             "choose a folder (--dest, JAX_AITER_LIB_DIR or XDG_CACHE_HOME) or remove it. "
                             "Nothing was downloaded")
        if dest.exists() and not os.access(dest, os.W_OK):
            raise PermissionError(13, "Permission denied", str(dest))
    except OSError as e:
        raise FetchError(f"cannot write to {e.filename or dest.parent}: {e.strerror or e}; choose a writable "
                         "destination (--dest, JAX_AITER_LIB_DIR or XDG_CACHE_HOME) or fix its permissions. "
                         "Nothing was changed") from None


def check_pins(files: list[dict], want: dict, source: str) -> None:
    """Refuse files that differ from the pins of identity `want` (the sha256 and size of every library a wheel
    may load, baked in at its build): the manifest only says where the bytes are, the pins say which."""
    pins = {p["name"]: p for p in want.get("pins") or []}
    if not pins:
        return
    bad = []
    for f in files:
        pin = pins.get(f["name"])
        if pin is None:
            bad.append(f"{f['name']} has no pin")
        elif (pin["size"], pin["sha256"]) != (f["size"], f["sha256"]):
            bad.append(f"{f['name']} is {f['size']} bytes with sha256 {f['sha256']}, but the pin is "
                       f"{pin['size']} bytes with sha256 {pin['sha256']}")
    if bad:
        raise FetchError(f"{source} offers libraries other than the pinned ones: {'; '.join(bad)}. Only the "
                         "pinned bytes are installed, however consistent the release is; nothing was installed. "
                         "Fetch from the base URL the producer published to, or use the wheel that matches "
                         "this release")


def installed(dest: Path, cache_id: str, names: list[str] | None) -> list[str] | None:
    """The problems that stop `dest` counting as a verified install of this release ([] when none), or None
    when it holds no manifest copy of this release."""
    copy = dest / mf.MANIFEST_NAME
    if not copy.is_file():
        return None
    try:
        have = mf.parse(copy.read_bytes(), str(copy))
    except mf.ManifestError as e:
        return [str(e)]
    if have["identity"]["cache_id"] != cache_id:
        return None
    try:
        files = mf.select_files(have, names)
    except mf.ManifestError as e:
        return [str(e)]
    return diff_entries(dest, mf.raw_entries(files))


def _fetch_file(f: dict, release: str, staging: Path, window_log: int, opts: FetchOptions,
                progress: Progress, log: Log, stop: threading.Event) -> int:
    """Download the blob's parts straight through the decoder into the library file (one pass, no
    compressed copy on disk), verify parts, blob and library, and sync the library to the disk."""
    comp = f["compressed"]
    with contextlib.closing(LibraryFile(staging / f["name"])) as lib:
        decoder = blob.Decoder(window_log, f["size"], lib, label=comp["name"])
        whole = hashlib.sha256() if len(comp["parts"]) > 1 else None  # one part: the blob's hash is the part's
        for part in comp["parts"]:
            show = progress.task(part["name"], part["size"])

            def advance(n: int, show=show) -> None:
                if stop.is_set():
                    raise _Stopped("stopped: another file of this fetch failed")
                show(n)
            sink = PartSink(decoder, whole)
            try:
                download(f"{release}/{part['name']}", sink, part["size"], part["sha256"], opts, advance, log)
            except ReleaseNotFound as e:
                raise FetchError(f"{e}: the manifest lists {part['name']} but the release does not have it; the "
                                 "release is incomplete. Nothing was installed; republish it (`invoke jit.publish`)"
                                 ) from None
        comp_sha = (whole or sink.hash).hexdigest()
        if comp_sha != comp["sha256"]:
            raise FetchError(f"{comp['name']}: the parts join to sha256 {comp_sha}, not the manifest's "
                             f"{comp['sha256']}; nothing was installed; republish the release (`invoke jit.publish`)")
        try:
            size, sha = decoder.result()
        except blob.BlobError as e:
            raise FetchError(f"{e}; nothing was installed; republish the release (`invoke jit.publish`)") from None
        if size != f["size"] or sha != f["sha256"]:
            raise FetchError(f"{f['name']}: unpacked to {size} bytes with sha256 {sha}, but the manifest says "
                             f"{f['size']} bytes with sha256 {f['sha256']}; nothing was installed; republish the "
                             "release (`invoke jit.publish`)")
        lib.sync()
    lib.path.chmod(LIB_MODE)
    return comp["size"]


def _fetch_all(files: list[dict], release: str, staging: Path, window_log: int, opts: FetchOptions,
               log: Log) -> int:
    """Fetch the files in parallel; the first failure stops the others (no point finishing them)."""
    stop = threading.Event()

    def one(f: dict) -> int:
        try:
            return _fetch_file(f, release, staging, window_log, opts, progress, log, stop)
        except BaseException:
            stop.set()
            raise

    with Progress(opts.progress, log) as progress, ThreadPoolExecutor(max_workers=min(len(files), 4)) as pool:
        jobs = [pool.submit(one, f) for f in files]
        errors = [j.exception() for j in jobs]
    first = next((e for e in errors if e is not None and not isinstance(e, _Stopped)), None)
    if first is not None:
        raise first
    return sum(j.result() for j in jobs)


class _Stopped(FetchError):
    """Another file of the same fetch failed; this one stopped early."""


def install_staged(staging: Path, dest: Path, names: list[str], last: str = mf.MANIFEST_NAME) -> None:
    """Move the verified files `names` and then `last` from `staging` into `dest`.

    `last` (the manifest copy, or a build record) goes last: it marks the install complete, so an
    interrupted install leaves no complete-looking folder. A missing `dest` appears by one rename.
    The one install step of a fetch and of the build tooling's shard merge.
    """
    if not dest.exists():
        os.replace(staging, dest)
        return
    for name in names:
        os.replace(staging / name, dest / name)
    os.replace(staging / last, dest / last)
    shutil.rmtree(staging, ignore_errors=True)


def _install_problems(dest: Path, cache_id: str, chosen: list[str], want: dict) -> list[str] | None:
    """installed()'s answer for `dest`, and with pins, whether its libraries are the pinned bytes too."""
    problems = installed(dest, cache_id, chosen)
    if problems == [] and want.get("pins"):  # installed and verified, but are they the pinned bytes?
        copy = dest / mf.MANIFEST_NAME
        try:
            check_pins(mf.select_files(mf.parse(copy.read_bytes(), str(copy)), chosen), want, str(copy))
        except FetchError as e:
            problems = [str(e)]
    return problems


def _staging(dest: Path, files: list[dict]) -> Path:
    """A fresh staging folder beside `dest`, once its disk holds the libraries (unpacked as they arrive)."""
    need = sum(f["size"] for f in files)
    free = shutil.disk_usage(dest.parent).free
    if free < need:
        raise FetchError(f"not enough disk space in {dest.parent}: {byte_text(need)} needed, {byte_text(free)} "
                         "free; free some space or choose another destination (--dest)")
    staging = dest.parent / f".{dest.name}.fetch-{os.getpid()}"
    try:
        staging.mkdir()
        staging.chmod(trust.SAFE_DIR_MODE)  # it becomes the destination: not the umask's mode
    except OSError as e:
        raise FetchError(f"cannot create {staging}: {e.strerror or e}; choose another destination (--dest)") from None
    return staging


def _install_verified(staging: Path, dest: Path, chosen: list[str], manifest: dict, base_url: str, log: Log) -> None:
    """The downloaded libraries in `staging`, their provenance verified, installed into `dest` with the manifest."""
    try:
        log(f"fetch: {provenance.verify([staging / n for n in chosen], base_url)}")
    except provenance.ProvenanceError as e:
        raise FetchError(f"{e}. Nothing was installed; fetch from the project's own release store") from None
    try:
        (staging / mf.MANIFEST_NAME).write_text(mf.dumps(manifest))
        (staging / mf.MANIFEST_NAME).chmod(trust.SAFE_FILE_MODE)
        install_staged(staging, dest, chosen)
    except OSError as e:
        raise FetchError(f"cannot write {e.filename or staging}: {e.strerror or e}; free disk space or choose another "
                         "destination (--dest). The previous install is unchanged") from None


def fetch_release(base_url: str, want: dict, dest: Path, names: list[str] | None = None, *,
                  strict_toolchain: bool = False, force: bool = False, opts: FetchOptions | None = None,
                  log: Log = _stderr) -> FetchResult:
    """Fetch the release of identity `want` (its libraries `names`, default all) into `dest`."""
    opts = (opts or FetchOptions.from_env()).started()
    start = time.monotonic()
    cid = want.get("cache_id") or reuse_gate.cache_id(want)
    release = release_url(base_url, cid)
    dest = Path(dest)
    _prepare_parent(dest)
    manifest, url = read_manifest(base_url, cid, opts, log)
    warnings = check_identity(want, manifest, url, strict_toolchain)
    for w in warnings:
        log(f"fetch: warning: {w}")
    files = mf.select_files(manifest, names)
    check_pins(files, want, url)
    chosen = [f["name"] for f in files]
    if not want.get("pins"):
        log(f"fetch: no pins: the release's own manifest is all that vouches for these bytes, so the store at "
            f"{base_url} is trusted (a wheel's pins, or `{remedies.door('jit_fetch')} --pins-from URL`, hold a fetch "
            "to known bytes; docs/security.md)")
    waited = time.monotonic()
    lock = _lock(dest, opts, log)
    opts = replace(opts, deadline=opts.deadline + time.monotonic() - waited)  # the wait for another fetch is not ours
    try:
        folder_lock.remove_leftovers(dest.parent, f".{dest.name}.fetch-*", log, "fetch")  # a killed fetch's
        problems = _install_problems(dest, cid, chosen, want)
        if problems == [] and not force:
            log(f"fetch: {', '.join(chosen)} already in {dest}, verified against {manifest['release_tag']}")
            return FetchResult("present", dest, release, manifest, chosen, 0, time.monotonic() - start, warnings)
        for p in problems or []:
            log(f"fetch: replacing the install in {dest}: {p}")
        staging = _staging(dest, files)
        total = sum(f["compressed"]["size"] for f in files)
        log(f"fetch: {manifest['release_tag']} from {release}: {', '.join(chosen)} ({total / 1e6:.1f} MB compressed)")
        window_log = manifest["compression"]["window_log"]
        try:
            downloaded = _fetch_all(files, release, staging, window_log, opts, log)
            _install_verified(staging, dest, chosen, manifest, base_url, log)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    finally:
        lock.release()
    seconds = time.monotonic() - start
    against = "its pin and the release manifest" if want.get("pins") else "the release manifest (no pins)"
    log(f"fetch: installed {', '.join(chosen)} into {dest} ({downloaded / 1e6:.1f} MB in {seconds:.1f} s), "
        f"every file verified against {against}")
    return FetchResult("fetched", dest, release, manifest, chosen, downloaded, seconds, warnings)
