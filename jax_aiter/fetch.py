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
- network stalls time out, and a server trickling bytes (slower than
  JA_FETCH_MIN_RATE over JA_FETCH_TIMEOUT_S) is abandoned; both are retried with
  exponential backoff, resuming with an HTTP range request where the server
  allows it; the whole fetch stops at JA_FETCH_DEADLINE_S; a 404 is a cache miss
  and is not retried;
- every download, the manifest's too, shows progress (a line at least every
  HEARTBEAT_S while it runs), and its errors name the host that failed when a
  redirect led elsewhere;
- work happens in a staging folder beside the destination, under a lock on its folder:
  a fresh destination appears by one rename, an existing one gets each library
  replaced by rename and the manifest copy last, so a killed or failed fetch
  leaves the previous good state; the next fetch clears its leftovers.

Runs at runtime, so it must not import JAX.
"""
from __future__ import annotations

import contextlib
import hashlib
import http.client
import io
import os
import shutil
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from jax_aiter import (
    blob,
    folder_lock,
    integrity,
    provenance,
    remedies,
    reuse_gate,
    settings,
    trust,
)
from jax_aiter import manifest as mf
from jax_aiter.integrity import diff_entries
from jax_aiter.progress import Progress

ENV_BASE_URL = "JA_FETCH_BASE_URL"
ENV_TIMEOUT = "JA_FETCH_TIMEOUT_S"
ENV_RETRIES = "JA_FETCH_RETRIES"
ENV_BACKOFF = "JA_FETCH_BACKOFF_S"
ENV_LOCK_TIMEOUT = "JA_FETCH_LOCK_TIMEOUT_S"
ENV_MIN_RATE = "JA_FETCH_MIN_RATE"
ENV_DEADLINE = "JA_FETCH_DEADLINE_S"
HEARTBEAT_S = 10.0  # a download still running says how far it got at least this often (less: the rate window)

MAX_MANIFEST_BYTES = integrity.MAX_RECORD_BYTES  # every small document (manifest, record) is capped while streaming
CHUNK = 1 << 20
LIB_MODE = 0o755

Log = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class FetchError(RuntimeError):
    """A fetch that did not install anything; the message says what, why and what to do."""


class ReleaseNotFound(FetchError):
    """The release or one of its assets does not exist at the base URL (a cache miss)."""


class _Transient(Exception):
    """A failure worth retrying (timeout, dropped connection, truncated body, 5xx)."""


@dataclass(frozen=True)
class FetchOptions:
    # defaults and bounds: jax_aiter.settings.NUMERIC
    timeout_s: float = settings.NUMERIC[ENV_TIMEOUT].default  # per socket operation: a stalled server fails then
    retries: int = settings.NUMERIC[ENV_RETRIES].default      # extra attempts after the first, backoff doubling
    backoff_s: float = settings.NUMERIC[ENV_BACKOFF].default  # first wait; doubles each retry, capped at 60 s
    lock_timeout_s: float = settings.NUMERIC[ENV_LOCK_TIMEOUT].default
    min_rate: int = settings.NUMERIC[ENV_MIN_RATE].default    # bytes/s over each timeout_s window; 0: none
    deadline_s: float = settings.NUMERIC[ENV_DEADLINE].default  # the whole fetch, retries included
    progress: bool | None = None  # None: a live bar on a terminal, plain lines otherwise
    deadline: float | None = None  # time.monotonic() when the fetch stops (set when a fetch starts)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> FetchOptions:
        """Defaults overridden by JA_FETCH_TIMEOUT_S, JA_FETCH_RETRIES, JA_FETCH_BACKOFF_S, JA_FETCH_LOCK_TIMEOUT_S,
        JA_FETCH_MIN_RATE, JA_FETCH_DEADLINE_S (each parsed and bounded by jax_aiter.settings; a bad value raises
        SettingError naming it)."""
        return cls(timeout_s=settings.from_env(ENV_TIMEOUT, env), retries=settings.from_env(ENV_RETRIES, env),
                   backoff_s=settings.from_env(ENV_BACKOFF, env),
                   lock_timeout_s=settings.from_env(ENV_LOCK_TIMEOUT, env),
                   min_rate=settings.from_env(ENV_MIN_RATE, env), deadline_s=settings.from_env(ENV_DEADLINE, env))

    def started(self) -> FetchOptions:
        """These options with the deadline running from now (kept when it runs already)."""
        return self if self.deadline is not None else replace(self, deadline=time.monotonic() + self.deadline_s)


# --- locations ----------------------------------------------------------------------

def resolve_base_url(flag: str | None, default: str | None, env: dict[str, str] | None = None) -> str:
    """--base-url, else JA_FETCH_BASE_URL, else the default (baked into the wheel or from pyproject)."""
    env = os.environ if env is None else env
    for value in (flag, env.get(ENV_BASE_URL), default):
        if value and value.strip():
            return value.strip()
    raise FetchError(f"no base URL to fetch from: pass --base-url URL or set {ENV_BASE_URL} "
                     "(https://, http://, file:// or a folder)")


def as_url(location: str) -> str:
    """A URL for a base location: URLs pass through, a folder becomes file://."""
    scheme = urllib.parse.urlsplit(location).scheme.lower()
    if scheme in ("http", "https", "file"):
        return location.rstrip("/")
    if scheme and len(scheme) > 1:
        raise FetchError(f"unsupported base URL scheme {scheme!r} in {location!r}; use https://, http://, "
                         "file:// or a folder")
    return Path(location).expanduser().resolve().as_uri()


def release_url(base: str, cache_id: str) -> str:
    return f"{as_url(base)}/{reuse_gate.release_tag(cache_id)}"


# --- transfer -------------------------------------------------------------------------

class _PartSink:
    """One part of a blob as it arrives: hashed and counted (the whole blob's hash too, when the blob
    has several parts), then handed on to the blob's decoder.

    A retry resumes after the bytes already taken. A server that ignores the range
    request sends the part from its start again; the bytes already taken are
    skipped, so the decoder never sees a byte twice (any difference in the skipped
    bytes shows up in the blob's and the library's hashes).
    """

    def __init__(self, decoder: blob.Decoder, whole=None):
        self.decoder, self.whole = decoder, whole
        self.hash = hashlib.sha256()
        self.size = 0
        self._skip = 0

    def begin(self, resumed: bool) -> _PartSink:
        self._skip = 0 if resumed else self.size
        return self

    def write(self, data) -> int:
        """Take `data`; the number of new bytes (a resent start is skipped, and not counted as progress)."""
        if self._skip:
            n = min(self._skip, len(data))
            data, self._skip = data[n:], self._skip - n
        if len(data):
            self.hash.update(data)
            if self.whole is not None:
                self.whole.update(data)
            self.size += len(data)
            self.decoder.feed(data)
        return len(data)


class _LibraryFile:
    """The library being unpacked into the staging folder; a failed write says what to do."""

    def __init__(self, path: Path):
        self.path = path
        try:
            self._fh = open(path, "wb")  # noqa: SIM115 (closed by close())
        except OSError as e:
            raise self._error(e) from None

    def _error(self, e: OSError) -> FetchError:
        return FetchError(f"cannot write {self.path}: {e.strerror or e}; free disk space or choose another "
                          "destination (--dest)")

    def write(self, data) -> int:
        try:
            return self._fh.write(data)
        except OSError as e:
            raise self._error(e) from None

    def sync(self) -> None:
        """On the disk before the rename that makes it visible: the loader trusts any file it finds."""
        try:
            self._fh.flush()
            os.fsync(self._fh.fileno())
        except OSError as e:
            raise self._error(e) from None

    def close(self) -> None:
        self._fh.close()


def _resumed(resp, offset: int) -> bool:
    """True when a ranged answer continues at `offset`; a 206 that starts elsewhere (some servers send the
    whole body as 206) is read from its start and the bytes already taken are skipped, as after a 200."""
    if not offset or getattr(resp, "status", None) != 206:
        return False
    rng = (resp.headers.get("Content-Range") or "").strip()
    if not rng.startswith("bytes ") or not rng[6:].split("-", 1)[0].isdigit():
        return False
    start = int(rng[6:].split("-", 1)[0])
    if start not in (0, offset):
        raise _Transient(f"asked for bytes from {offset}, the server answered from {start}")
    return start == offset


def _host(url: str) -> str:
    return urllib.parse.urlsplit(url).netloc or url


def _at(url: str, final: str) -> str:
    """Where a failure happened, when a redirect took the request to another host or port (else "")."""
    return "" if _host(final) == _host(url) else f" (at {_host(final)}, where {_host(url)} redirected: {final})"


class _Redirects(urllib.request.HTTPRedirectHandler):
    """urllib's redirect handling, noting where each redirect went: a redirect to a host or port that then cannot be
    reached failed naming only the first URL."""

    def __init__(self):
        self.went: list[str] = []

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        self.went.append(newurl)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


_HTML = (b"<!doctype html", b"<html", b"<head", b"<body")


def _html_answer(url: str, at: str, why: str) -> FetchError:
    return FetchError(f"{url}{at}: the server answered with an HTML page ({why}), not the release file: a login, proxy "
                      "or error page stands where the release should be. Nothing was installed; check the base URL "
                      f"({ENV_BASE_URL}, --base-url) and that this machine may read it")


def _announced_size(resp) -> int | None:
    """The size of the whole file as the answer announces it (a 206's Content-Range total, else the Content-Length of
    a whole-file answer: a 200, or a folder store's file); None when it does not say."""
    if getattr(resp, "status", None) == 206:
        total = (resp.headers.get("Content-Range") or "").rsplit("/", 1)[-1].strip()
        return int(total) if total.isdigit() else None
    length = (resp.headers.get("Content-Length") or "").strip()
    return int(length) if length.isdigit() else None


class _Deadline(FetchError):
    """The fetch ran past JA_FETCH_DEADLINE_S."""


def _past_deadline(opts: FetchOptions, what: str, why: str = "") -> _Deadline:
    return _Deadline(f"{what}: the fetch did not finish within {ENV_DEADLINE}={opts.deadline_s:g} s"
                     f"{f' ({why})' if why else ''}; nothing was installed. Fetch from a faster server, or allow more "
                     f"time with {ENV_DEADLINE}=<seconds>")


def _decoder(encoding: str, url: str):
    """A zlib decoder for a gzip- or deflate-encoded body (some servers encode JSON though asked not to), None for a
    plain one; another encoding is refused by name."""
    if encoding in ("", "identity"):
        return None
    if encoding in ("gzip", "x-gzip", "deflate"):
        return zlib.decompressobj(wbits=47)  # 32 + 15: a gzip or zlib header, whichever it has
    raise FetchError(f"{url}: the server sent the body {encoding}-encoded (Content-Encoding: {encoding}), which this "
                     "fetch cannot decode (it asks for none, and decodes gzip and deflate); serve the release files "
                     "as they are, or use another base URL")


def _attempt(url: str, begin: Callable[[bool], object], offset: int, opts: FetchOptions,
             advance: Callable[[int], None], log: Log | None = None, size: int | None = None) -> None:
    """One GET of `url` from byte `offset`; `begin(resumed)` returns the sink once the status is known.
    A redirect to another host is followed and logged (the pins and hashes, not the host, decide), and a failure
    after it names that host. A body arriving slower than opts.min_rate over each opts.timeout_s is abandoned; past
    opts.deadline the attempt stops for good (_Deadline). A line says how far it got at least every HEARTBEAT_S.
    An HTML page (a login or proxy page) is refused at once, and so is a file whose announced size is not `size`
    (the manifest's): the server's copy was replaced, which no retry mends."""
    name = url.rsplit("/", 1)[-1]
    left = None if opts.deadline is None else opts.deadline - time.monotonic()
    if left is not None and left <= 0:
        raise _past_deadline(opts, url)
    timeout = opts.timeout_s if left is None else max(0.05, min(opts.timeout_s, left))
    headers = {"User-Agent": "jax-aiter-fetch", "Accept-Encoding": "identity"}
    if offset:
        headers["Range"] = f"bytes={offset}-"
    redirects = _Redirects()
    try:
        resp = urllib.request.build_opener(redirects).open(urllib.request.Request(url, headers=headers),
                                                           timeout=timeout)
    except urllib.error.HTTPError as e:
        at = _at(url, e.url or url)
        if e.code in (404, 410):
            raise ReleaseNotFound(f"{url}: HTTP {e.code} (not found){at}") from None
        if e.code in (408, 425, 429) or e.code >= 500:
            raise _Transient(f"HTTP {e.code} {e.reason}{at}") from None
        raise FetchError(f"{url}: HTTP {e.code} {e.reason}{at}; check the base URL and access rights") from None
    except urllib.error.URLError as e:
        if isinstance(e.reason, (FileNotFoundError, NotADirectoryError)):
            raise ReleaseNotFound(f"{url}: not found") from None
        if isinstance(e.reason, PermissionError):
            raise FetchError(f"{url}: {e.reason}") from None
        went = _at(url, redirects.went[-1]) if redirects.went else ""
        if isinstance(e.reason, TimeoutError):
            raise _Transient(f"no response within {timeout:g} s{went}") from None
        raise _Transient(f"cannot connect ({e.reason}){went}") from None
    except TimeoutError:
        raise _Transient(f"no response within {timeout:g} s") from None
    except (ConnectionError, http.client.HTTPException) as e:
        raise _Transient(f"connection failed ({e!r})") from None
    final = resp.geturl()
    at = _at(url, final)
    if log is not None and at:
        log(f"  {name}: redirected to host {_host(final)} ({final})")
    with resp:
        decode = _decoder((resp.headers.get("Content-Encoding") or "").strip().lower(), f"{url}{at}")
        ctype = (resp.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if ctype in ("text/html", "application/xhtml+xml"):
            raise _html_answer(url, at, f"Content-Type: {ctype}")
        announced = _announced_size(resp) if decode is None else None

        def replaced() -> None:  # checked once the first bytes are known not to be an HTML page
            if size is not None and announced is not None and announced != size:
                raise FetchError(f"{name}: the server's copy is {announced} bytes, but the manifest says {size}: the "
                                 f"asset at {url}{at} was replaced (or cut short where it is stored), not cut short in "
                                 "transit. Nothing was installed; republish the release (`invoke jit.publish`) or "
                                 "fetch from another base URL")
        sink = begin(_resumed(resp, offset) if decode is None else False)  # an encoded body starts from 0 again
        start = mark = said = time.monotonic()
        got = marked = 0
        report = min(HEARTBEAT_S, opts.timeout_s)
        while True:
            try:
                data = resp.read1(CHUNK)  # what has arrived: a whole-buffer read waits for every byte of it
            except TimeoutError:
                raise _Transient(f"stalled: no data for {timeout:g} s after {got} bytes{at}") from None
            except http.client.IncompleteRead:
                raise _Transient(f"connection closed early after {got} bytes{at}") from None
            except (ConnectionError, http.client.HTTPException, OSError) as e:
                raise _Transient(f"connection lost after {got} bytes ({e!r}){at}") from None
            if not data:
                break
            if not got:
                if not offset and data.lstrip()[:16].lower().startswith(_HTML):
                    raise _html_answer(url, at, "its first bytes are HTML")
                replaced()
            got += len(data)
            if decode is not None:
                try:
                    data = decode.decompress(data)
                except zlib.error as e:
                    raise FetchError(f"{url}{at}: the server's {resp.headers['Content-Encoding']}-encoded body "
                                     f"cannot be decoded ({e}); nothing was installed") from None
            advance(sink.write(data))  # progress counts new bytes only: a resumed part never shows 150 %
            now = time.monotonic()
            if opts.deadline is not None and now > opts.deadline:
                raise _past_deadline(opts, url, f"{byte_text(got)} arrived in {now - start:.0f} s{at}")
            if log is not None and now - said >= report:
                log(f"  {name}: {byte_text(got)} in {now - start:.0f} s ({byte_text(int(got / (now - start)))}/s)"
                    f" from {_host(final)}")
                said = now
            if now - mark >= opts.timeout_s:
                rate = (got - marked) / (now - mark)
                if rate < opts.min_rate:
                    raise _Transient(f"too slow: {byte_text(got - marked)} in {now - mark:.1f} s "
                                     f"({byte_text(int(rate))}/s), under the {byte_text(opts.min_rate)}/s "
                                     f"{ENV_MIN_RATE} asks for{at}")
                mark, marked = now, got
        if not got:
            replaced()
        if decode is not None:
            advance(sink.write(decode.flush()))
            if not decode.eof:
                raise _Transient(f"the {resp.headers['Content-Encoding']}-encoded body ended early after {got} "
                                 f"bytes{at}")
    declared = resp.headers.get("Content-Length")
    if declared is not None and declared.isdigit() and got < int(declared):
        raise _Transient(f"connection closed early after {got} of {declared} bytes{at}")


def _retrying(what: str, opts: FetchOptions, log: Log, once: Callable[[], None]) -> None:
    attempts = opts.retries + 1
    for attempt in range(1, attempts + 1):
        try:
            once()
            return
        except _Transient as e:
            if attempt == attempts:
                raise FetchError(
                    f"{what}: {e}; gave up after {attempts} attempts. Check the network and the server"
                    f"{' it was redirected to' if 'redirected:' in str(e) else ''}, or allow more with "
                    f"{ENV_TIMEOUT}=<seconds> / {ENV_RETRIES}=<n> / {ENV_MIN_RATE}=<bytes/s>") from None
            wait = min(opts.backoff_s * 2 ** (attempt - 1), 60.0)
            if opts.deadline is not None and time.monotonic() + wait >= opts.deadline:
                raise _past_deadline(opts, what, f"attempt {attempt}: {e}") from None
            log(f"  {what}: {e}; retrying in {wait:g} s (attempt {attempt + 1} of {attempts})")
            time.sleep(wait)


def fetch_bytes(url: str, opts: FetchOptions, log: Log = _stderr, limit: int = MAX_MANIFEST_BYTES) -> bytes:
    """A small file (the manifest) into memory, with the same timeouts, rates, deadline, retries and progress."""
    opts = opts.started()
    out = io.BytesIO()

    class Capped:
        def write(self, data) -> int:
            if out.tell() + len(data) > limit:  # refused while streaming: never more than `limit` in memory
                raise FetchError(f"{url}: more than {limit} bytes; this is not a manifest or record (check the URL)")
            return out.write(data)

    def begin(resumed: bool) -> Capped:
        out.seek(0)
        out.truncate()
        return Capped()

    _retrying(url, opts, log, lambda: _attempt(url, begin, 0, opts, lambda n: None, log))
    return out.getvalue()


def download(url: str, sink: _PartSink, size: int, sha256: str, opts: FetchOptions,
             advance: Callable[[int], None] = lambda n: None, log: Log = _stderr) -> None:
    """Stream `url` into `sink` and prove it sent exactly `size` bytes with `sha256`.

    A retry resumes where the last attempt stopped (with a range request; see _PartSink).
    """
    name = url.rsplit("/", 1)[-1]

    def once() -> None:
        _attempt(url, sink.begin, sink.size, opts, advance, log, size=size)
        if sink.size < size:  # the answer said no size (or an encoded one), and ended early: cut short in transit
            raise _Transient(f"the answer ended after {sink.size} of {size} bytes (cut short in transit)")
        if sink.size > size:
            raise FetchError(f"{name}: {sink.size} bytes, but the manifest says {size}; the asset at {url} "
                             "was replaced or the manifest is wrong. Nothing was installed; republish the "
                             "release (`invoke jit.publish`)")

    _retrying(url, opts, log, once)
    got = sink.hash.hexdigest()
    if got != sha256:
        raise FetchError(f"{name}: sha256 {got} does not match the manifest's {sha256}; the asset at {url} was "
                         "altered or damaged. Nothing was installed; republish the release (`invoke jit.publish`) "
                         "or fetch from another base URL")


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


def byte_text(n: int) -> str:
    """A size people read: bytes, kB, MB or GB with three significant digits (a full disk is "0 bytes free",
    not "0.00 GB")."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} byte{'' if n == 1 else 's'}"


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
    with contextlib.closing(_LibraryFile(staging / f["name"])) as lib:
        decoder = blob.Decoder(window_log, f["size"], lib, label=comp["name"])
        whole = hashlib.sha256() if len(comp["parts"]) > 1 else None  # one part: the blob's hash is the part's
        for part in comp["parts"]:
            show = progress.task(part["name"], part["size"])

            def advance(n: int, show=show) -> None:
                if stop.is_set():
                    raise _Stopped("stopped: another file of this fetch failed")
                show(n)
            sink = _PartSink(decoder, whole)
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
            f"{base_url} is trusted (a wheel's pins, or `{remedies.door('jit_fetch')} --pins-from URL`, hold a fetch to known "
            "bytes; docs/security.md)")
    waited = time.monotonic()
    lock = _lock(dest, opts, log)
    opts = replace(opts, deadline=opts.deadline + time.monotonic() - waited)  # the wait for another fetch is not ours
    try:
        folder_lock.remove_leftovers(dest.parent, f".{dest.name}.fetch-*", log, "fetch")  # a killed fetch's
        problems = installed(dest, cid, chosen)
        if problems == [] and want.get("pins"):  # installed and verified, but are they the pinned bytes?
            copy = dest / mf.MANIFEST_NAME
            try:
                check_pins(mf.select_files(mf.parse(copy.read_bytes(), str(copy)), chosen), want, str(copy))
            except FetchError as e:
                problems = [str(e)]
        if problems == [] and not force:
            log(f"fetch: {', '.join(chosen)} already in {dest}, verified against {manifest['release_tag']}")
            return FetchResult("present", dest, release, manifest, chosen, 0, time.monotonic() - start, warnings)
        for p in problems or []:
            log(f"fetch: replacing the install in {dest}: {p}")
        need = sum(f["size"] for f in files)  # downloads are unpacked as they arrive
        free = shutil.disk_usage(dest.parent).free
        if free < need:
            raise FetchError(f"not enough disk space in {dest.parent}: {byte_text(need)} needed, {byte_text(free)} "
                             "free; free some space or choose another destination (--dest)")
        staging = dest.parent / f".{dest.name}.fetch-{os.getpid()}"
        try:
            staging.mkdir()
            staging.chmod(trust.SAFE_DIR_MODE)  # it becomes the destination: not the umask's mode
        except OSError as e:
            raise FetchError(f"cannot create {staging}: {e.strerror or e}; choose another destination (--dest)"
                             ) from None
        total = sum(f["compressed"]["size"] for f in files)
        log(f"fetch: {manifest['release_tag']} from {release}: {', '.join(chosen)} ({total / 1e6:.1f} MB compressed)")
        window_log = manifest["compression"]["window_log"]
        try:
            downloaded = _fetch_all(files, release, staging, window_log, opts, log)
            try:
                log(f"fetch: {provenance.verify([staging / n for n in chosen], base_url)}")
            except provenance.ProvenanceError as e:
                raise FetchError(f"{e}. Nothing was installed; fetch from the project's own release store") from None
            try:
                (staging / mf.MANIFEST_NAME).write_text(mf.dumps(manifest))
                (staging / mf.MANIFEST_NAME).chmod(trust.SAFE_FILE_MODE)
                install_staged(staging, dest, chosen)
            except OSError as e:
                raise FetchError(f"cannot write {e.filename or staging}: {e.strerror or e}; free disk space or "
                                 "choose another destination (--dest). The previous install is unchanged") from None
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
