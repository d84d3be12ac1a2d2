"""A release store on 127.0.0.1 for `nox -s ci_local`: the stand-in for GitHub's release downloads and uploads.

It serves a folder over HTTP: GET and HEAD read `<folder>/<path>` (what `invoke jit.fetch` and `jit.decide` ask for
under JA_FETCH_BASE_URL), PUT writes it (what `invoke jit.publish --to http://...` sends: publish.HttpTarget), each
file to a temporary name and renamed, so a reader never sees half of one. A path that leaves the folder, names a
hidden file, or meets a symbolic link is refused.

    with LocalStore(folder) as store:
        store.url  # http://127.0.0.1:PORT
"""
from __future__ import annotations

import functools
import http.server
import io
import os
import threading
from pathlib import Path
from typing import Self
from urllib.parse import unquote, urlsplit

SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"  # PEP 691's media type of a simple index page in JSON


def _inside(root: Path, url_path: str) -> Path | None:
    """The file a request names, or None when the path leaves `root`, is hidden, or passes a symbolic link."""
    parts = [p for p in unquote(urlsplit(url_path).path).split("/") if p]
    if not parts or any(p in (".", "..") or p.startswith(".") or "\\" in p for p in parts):
        return None
    path = root
    for p in parts:
        path = path / p
        if path.is_symlink():
            return None
    return path


class _Handler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, fmt: str, *args) -> None:  # the jobs log what they fetch and publish
        pass

    def _refuse(self, code: int, why: str) -> None:
        self.send_error(code, why)

    def send_head(self):
        path = _inside(Path(self.directory), self.path)
        if path is None:
            self._refuse(404, "not in the store")
            return None
        # PEP 691: a folder of the simple index answers with its JSON page when the client prefers it (pip and uv
        # ask for it first); else the HTML page (index.html), as any static host serves it.
        page = path / "index.json"
        if SIMPLE_JSON in self.headers.get("Accept", "") and page.is_file() and not page.is_symlink():
            body = page.read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", SIMPLE_JSON)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            return io.BytesIO(body)
        return super().send_head()

    def do_PUT(self) -> None:
        target = _inside(Path(self.directory), self.path)
        length = self.headers.get("Content-Length")
        if target is None or length is None or not length.isdigit():
            self._refuse(400, "PUT needs a path inside the store and a Content-Length")
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.put-{threading.get_ident()}")
        left = int(length)
        with open(tmp, "wb") as out:
            while left and (chunk := self.rfile.read(min(left, 1 << 20))):
                out.write(chunk)
                left -= len(chunk)
        if left:
            tmp.unlink()
            self._refuse(400, f"the body ended {left} bytes short of its Content-Length")
            return
        os.replace(tmp, target)
        self.send_response(201)
        self.send_header("Content-Length", "0")
        self.end_headers()


class LocalStore:
    """The store's HTTP server on 127.0.0.1 (a free port), serving `root` in a thread while the block runs."""

    def __init__(self, root: Path):
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                                     functools.partial(_Handler, directory=str(root)))
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
