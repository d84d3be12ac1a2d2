"""Shared pieces of the JIT-library transport tests: a real HTTP server with faults, a throwaway git
checkout, generated libraries and releases. Small files only; no GPU, no native build."""
from __future__ import annotations

import gzip
import hashlib
import http.server
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Self

import pytest

from jatools import config
from jatools.jitlibs import publish
from jatools.native import jit_build
from jax_aiter import op_table
from jax_aiter.download import manifest as mf
from jax_aiter.download import reuse_gate

REPO = Path(__file__).resolve().parents[2]
FAST_FETCH_ENV = {"JA_FETCH_TIMEOUT_S": "0.5", "JA_FETCH_RETRIES": "2", "JA_FETCH_BACKOFF_S": "0.05",
                  "CI": "1"}


# --- the HTTP server -----------------------------------------------------------------------------------

class FaultServer:
    """http.server on 127.0.0.1 serving `root`, with per-asset faults and a request log.

    faults[name] is one of: "404", "stall" (half the body, then silence),
    "truncate" (full Content-Length, half the body, then close), "tamper" (one
    byte flipped), "slow" (small chunks with pauses), "trickle" (one byte every
    trickle_pause seconds: a server that never stalls long enough to time out), "gzip" (the body gzip-encoded,
    Content-Encoding: gzip, though the client asked for none), "html" (a sign-in page, Content-Type: text/html, as a
    captive portal or an expired login answers); a "_once" suffix applies it
    to the first request only; "huge" streams zeros (1 GiB, no Content-Length) until the client stops.
    Range requests get 206 (unless ignore_range: then 200 and the whole body, as some servers do;
    full_206: 206 carrying the whole body); redirect_to sends every GET there (302); PUT stores files.
    """

    def __init__(self, root: Path):
        self.root = root
        self.faults: dict[str, str] = {}
        self.requests: list[tuple[str, str, str | None]] = []
        self.sent: dict[str, int] = {}
        self.release = threading.Event()
        self.slow_chunk, self.slow_pause = 16 << 10, 0.02
        self.trickle_pause = 1.0
        self.ignore_range = False
        self.full_206 = False
        self.redirect_to: str | None = None
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _fault(self, name: str) -> str | None:
                mode = server.faults.get(name)
                if mode and mode.endswith("_once"):
                    del server.faults[name]
                    mode = mode[:-5]
                return mode

            def do_GET(self):
                name = self.path.rsplit("/", 1)[-1]
                rng = self.headers.get("Range")
                server.requests.append(("GET", self.path, rng))
                mode = self._fault(name)
                if server.redirect_to:
                    self.send_response(302)
                    self.send_header("Location", server.redirect_to + self.path)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if mode == "huge":
                    self.send_response(200)
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.close_connection = True
                    chunk = bytes(1 << 20)
                    try:
                        for _ in range(1024):
                            self.wfile.write(chunk)
                            server.sent[name] = server.sent.get(name, 0) + len(chunk)
                    except (BrokenPipeError, ConnectionResetError):
                        pass
                    return
                if mode == "html":
                    page = b"<!DOCTYPE html>\n<html><head><title>Sign in</title></head><body>Sign in</body></html>\n"
                    self.send_response(200)
                    self.send_header("Content-Type", "text/html; charset=utf-8")
                    self.send_header("Content-Length", str(len(page)))
                    self.end_headers()
                    self.wfile.write(page)
                    return
                path = server.root / self.path.lstrip("/")
                if mode == "404" or not path.is_file():
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = path.read_bytes()
                if mode == "tamper":
                    body = body[:-1] + bytes([body[-1] ^ 0xFF])
                start = int(rng[len("bytes="):].split("-")[0]) if rng and rng.startswith("bytes=") else 0
                start = 0 if server.ignore_range else start
                if start and server.full_206:
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes 0-{len(body) - 1}/{len(body)}")
                    start = 0
                elif start:
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                body = body[start:]
                if mode == "gzip":
                    body = gzip.compress(body)
                    self.send_header("Content-Encoding", "gzip")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    if mode in ("stall", "truncate"):
                        self.wfile.write(body[:len(body) // 2])
                        self.wfile.flush()
                        server.sent[name] = server.sent.get(name, 0) + len(body) // 2
                        if mode == "stall":
                            server.release.wait(30)
                        self.close_connection = True
                        return
                    step = {"slow": server.slow_chunk, "trickle": 1}.get(mode, len(body) or 1)
                    for i in range(0, len(body), step):
                        self.wfile.write(body[i:i + step])
                        self.wfile.flush()
                        server.sent[name] = server.sent.get(name, 0) + len(body[i:i + step])
                        if mode == "slow":
                            time.sleep(server.slow_pause)
                        elif mode == "trickle" and server.release.wait(server.trickle_pause):
                            break  # the server is shutting down
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True

            def do_PUT(self):
                server.requests.append(("PUT", self.path, None))
                data = self.rfile.read(int(self.headers["Content-Length"]))
                target = server.root / self.path.lstrip("/")
                target.parent.mkdir(parents=True, exist_ok=True)
                tmp = target.with_name(target.name + ".tmp")
                tmp.write_bytes(data)
                os.replace(tmp, target)
                self.send_response(201)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    def gets(self, name: str) -> list[tuple[str, str, str | None]]:
        return [r for r in self.requests if r[0] == "GET" and r[1].endswith("/" + name)]

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


# --- a checkout and its identity ----------------------------------------------------------------------

MODULES = op_table.jit_libraries(op_table.load())  # {module: library}, from the op table (its one home)


def git(root: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, text=True,
                          env=env).stdout


CHECKOUT_FILES = ("pyproject.toml", "README.md", "docs/build.md", "tests/ops/test_rmsnorm.py",
                  "jax_aiter/jit/optCompilerConfig.json", "jax_aiter/op_table.toml", "csrc/", "third_party/",
                  "jatools/")


def make_checkout(root: Path) -> Path:
    """A git checkout holding what the JIT identity reads (sources, headers, settings, build tooling) and a few
    files it must not read (a README, a doc, a test)."""
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-co", "--exclude-standard", *CHECKOUT_FILES],
                            capture_output=True, text=True, check=True).stdout.split()
    for rel in listed:
        if (REPO / rel).is_file():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(REPO / rel, root / rel)
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "init")
    return root


def settings_for(root: Path, **env) -> config.Settings:
    return config.load(backend="cpu", root=root, env={"JA_BACKEND": "cpu", **env})


def checkout_identity(root: Path) -> dict:
    return jit_build.checkout_identity(settings_for(root))[0]


def lib_bytes(name: str, size: int, seed: int = 0) -> bytes:
    """Deterministic, partly compressible bytes standing in for a shared library."""
    rnd = random.Random(f"{name}-{seed}")
    block = rnd.randbytes(4096)
    out = bytearray()
    while len(out) < size:
        out += block if rnd.random() < 0.6 else rnd.randbytes(512)
    return bytes(out[:size])


def write_build(jit_dir: Path, ident: dict, sizes: dict[str, int] | None = None, seed: int = 0) -> dict:
    """Libraries plus a build record in build_jit.py's format (schema 1)."""
    jit_dir.mkdir(parents=True, exist_ok=True)
    sizes = sizes or {lib: 200_000 for lib in MODULES.values()}
    modules = {}
    for module, lib in MODULES.items():
        if lib not in sizes:
            continue
        data = lib_bytes(lib, sizes[lib], seed)
        (jit_dir / lib).write_bytes(data)
        entry = {"name": lib, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        modules[module] = {"identity": ident, "instances": 3, "file": entry}
    record = {"schema": 1, "identity": ident, "modules": modules,
              "files": sorted((m["file"] for m in modules.values()), key=lambda e: e["name"]),
              "last_build": {"modules": sorted(modules), "seconds": 0.0}}
    (jit_dir / "build_record.json").write_text(json.dumps(record, indent=2, sort_keys=True))
    return record


def make_release(serve_root: Path, ident: dict, sizes: dict[str, int] | None = None, asset_limit: int = 1 << 30,
                 seed: int = 0, work: Path | None = None) -> dict:
    """Publish generated libraries of identity `ident` into `serve_root/<tag>/`; returns the manifest."""
    work = work or serve_root.parent / f"work-{ident['cache_id']}-{seed}"
    record = write_build(work / "aiter_build", ident, sizes, seed)
    comp = publish.Compression(level=3, window_log=20)
    manifest, folder = publish.stage(record, ident, work / "aiter_build", work / "stage", comp, asset_limit,
                                     lambda m: None)
    target = publish.FolderTarget(serve_root, manifest["release_tag"])
    target.upload([folder / p["name"] for f in manifest["files"] for p in f["compressed"]["parts"]])
    target.upload([folder / mf.MANIFEST_NAME])
    return manifest


def other_identity(ident: dict, **changes) -> dict:
    out = {**ident, **changes}
    out["cache_id"] = reuse_gate.cache_id(out)
    return out


def wheel_identity(ident: dict, base_url: str | None = None) -> dict:
    """What the wheel helper bakes into jax_aiter/_build_identity.json (the keys fetch_mha uses)."""
    out = {**ident, "version": "0.1.0", "variant": "lite"}
    if base_url:
        out["fetch_base_url"] = base_url
    return out


def snapshot(folder: Path) -> dict[str, tuple[str, int]]:
    """{name: (sha256, mtime_ns)} of every file, to prove a failed fetch changed nothing."""
    if not folder.exists():
        return {}
    return {p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(folder.iterdir()) if p.is_file()}


def hermetic_environ() -> dict[str, str]:
    """This process's environment less the store a CI job names: a workflow sets JA_FETCH_BASE_URL for every job
    (nox -s ci_local found pr_cpu's fetch tests reaching the job's store instead of their own server through it)."""
    return {k: v for k, v in os.environ.items() if k != "JA_FETCH_BASE_URL"}


def run_py(args: list[str], env: dict[str, str] | None = None, **kw) -> subprocess.CompletedProcess:
    full_env = {**hermetic_environ(), "PYTHONPATH": str(REPO), **FAST_FETCH_ENV, **(env or {})}
    return subprocess.run([sys.executable, *args], check=False, capture_output=True, text=True, env=full_env, cwd=REPO,
                          timeout=60, **kw)


def popen_py(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    full_env = {**hermetic_environ(), "PYTHONPATH": str(REPO), **FAST_FETCH_ENV, **(env or {})}
    return subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=full_env, cwd=REPO)


# --- fixtures (imported by the test modules as *_fixture; used by their names) -------------------------------

@pytest.fixture(name="checkout")
def checkout_fixture(tmp_path: Path) -> Path:
    return make_checkout(tmp_path / "checkout")


@pytest.fixture(name="server")
def server_fixture(tmp_path: Path):
    root = tmp_path / "served"
    root.mkdir()
    with FaultServer(root) as srv:
        yield srv


@pytest.fixture(name="tasks")
def tasks_fixture(checkout, monkeypatch):
    """tasks.py loaded for the checkout (JA_ROOT_DIR), CPU backend."""
    import importlib.util

    monkeypatch.setenv("JA_ROOT_DIR", str(checkout))
    monkeypatch.setenv("JA_BACKEND", "cpu")
    spec = importlib.util.spec_from_file_location("ja_tasks_under_test", REPO / "tasks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(name="fast_fetch_env")
def fast_fetch_env_fixture(monkeypatch):
    for k, v in FAST_FETCH_ENV.items():
        monkeypatch.setenv(k, v)

