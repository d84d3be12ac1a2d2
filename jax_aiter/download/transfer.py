"""The transfer of a JIT-library release's files: HTTP(S), file:// or a folder, streamed, retried and verified.

Network stalls time out, and a server trickling bytes (slower than JA_FETCH_MIN_RATE over JA_FETCH_TIMEOUT_S) is
abandoned; both are retried with exponential backoff, resuming with an HTTP range request where the server allows
it; the whole fetch stops at JA_FETCH_DEADLINE_S; a 404 is a cache miss and is not retried. Every download shows
progress (a line at least every HEARTBEAT_S while it runs), and its errors name the host that failed when a
redirect led elsewhere; a transfer cut short, a file replaced on the server and an HTML answer are told apart.
Downloads stream through the decompressor and both hashes into the library file (jax_aiter/download/release.py
installs what they wrote). Runs at runtime, so it must not import JAX.
"""
from __future__ import annotations

import hashlib
import http.client
import io
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from jax_aiter import integrity, settings
from jax_aiter.download import blob, reuse_gate

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

class PartSink:
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

    def begin(self, resumed: bool) -> PartSink:
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


class LibraryFile:
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
    left = None if opts.deadline is None else opts.deadline - time.monotonic()
    if left is not None and left <= 0:
        raise _past_deadline(opts, url)
    timeout = opts.timeout_s if left is None else max(0.05, min(opts.timeout_s, left))
    resp = _open(url, offset, timeout)
    final = resp.geturl()
    at = _at(url, final)
    if log is not None and at:
        log(f"  {url.rsplit('/', 1)[-1]}: redirected to host {_host(final)} ({final})")
    with resp:
        got = _stream(resp, url, at, begin, offset, opts, advance, log, size, timeout)
    declared = resp.headers.get("Content-Length")
    if declared is not None and declared.isdigit() and got < int(declared):
        raise _Transient(f"connection closed early after {got} of {declared} bytes{at}")


def _open(url: str, offset: int, timeout: float):
    """The response to a GET of `url` from byte `offset`, or the error: ReleaseNotFound (404, 410, no such file),
    _Transient (what a retry may mend: 408, 425, 429, 5xx, timeouts, refused or lost connections, naming where a
    redirect went) or FetchError."""
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
    return resp


class _Pace:
    """A body's pace, checked after each read: past opts.deadline the attempt stops for good; a line says how far
    it got at least every HEARTBEAT_S (or opts.timeout_s, if shorter); slower than opts.min_rate over a window of
    opts.timeout_s, it is abandoned (a retry may find a faster path)."""

    def __init__(self, url: str, at: str, name: str, final: str, opts: FetchOptions, log: Log | None):
        self.url, self.at, self.name, self.final, self.opts, self.log = url, at, name, final, opts, log
        self.start = self.mark = self.said = time.monotonic()
        self.marked = 0
        self.report = min(HEARTBEAT_S, opts.timeout_s)

    def after(self, got: int) -> None:
        now, opts, at = time.monotonic(), self.opts, self.at
        if opts.deadline is not None and now > opts.deadline:
            raise _past_deadline(opts, self.url, f"{byte_text(got)} arrived in {now - self.start:.0f} s{at}")
        if self.log is not None and now - self.said >= self.report:
            self.log(f"  {self.name}: {byte_text(got)} in {now - self.start:.0f} s "
                     f"({byte_text(int(got / (now - self.start)))}/s) from {_host(self.final)}")
            self.said = now
        if now - self.mark >= opts.timeout_s:
            rate = (got - self.marked) / (now - self.mark)
            if rate < opts.min_rate:
                raise _Transient(f"too slow: {byte_text(got - self.marked)} in {now - self.mark:.1f} s "
                                 f"({byte_text(int(rate))}/s), under the {byte_text(opts.min_rate)}/s "
                                 f"{ENV_MIN_RATE} asks for{at}")
            self.mark, self.marked = now, got


def _stream(resp, url: str, at: str, begin: Callable[[bool], object], offset: int, opts: FetchOptions,
            advance: Callable[[int], None], log: Log | None, size: int | None, timeout: float) -> int:
    """The body of `resp` into begin(resumed)'s sink, decoded, checked and paced as _attempt says; the bytes that
    arrived."""
    name, final = url.rsplit("/", 1)[-1], resp.geturl()
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
    pace = _Pace(url, at, name, final, opts, log)
    got = 0
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
        pace.after(got)
    if not got:
        replaced()
    if decode is not None:
        advance(sink.write(decode.flush()))
        if not decode.eof:
            raise _Transient(f"the {resp.headers['Content-Encoding']}-encoded body ended early after {got} "
                             f"bytes{at}")
    return got


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


def download(url: str, sink: PartSink, size: int, sha256: str, opts: FetchOptions,
             advance: Callable[[int], None] = lambda n: None, log: Log = _stderr) -> None:
    """Stream `url` into `sink` and prove it sent exactly `size` bytes with `sha256`.

    A retry resumes where the last attempt stopped (with a range request; see PartSink).
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

def byte_text(n: int) -> str:
    """A size people read: bytes, kB, MB or GB with three significant digits (a full disk is "0 bytes free",
    not "0.00 GB")."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} byte{'' if n == 1 else 's'}"
