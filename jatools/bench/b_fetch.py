"""fetch: download from an HTTP server on 127.0.0.1, decompress, verify and install the published
assets by the fetch client (jax_aiter.fetch.fetch_release: `invoke jit.fetch`, `jax-aiter-fetch-mha`),
against `curl` + `zstd -d` + `sha256sum -c` in sequence.

The release is staged once by jatools.jitlibs.publish.stage (level 3, the project's
window: decompression speed hardly depends on the level, and level 19 would
spend minutes making the input). The server is Python's http.server in its
own process, so it does not share a GIL with the client being timed.

Goal: at least 2x faster.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from jatools.bench import tools
from jatools.bench.b_publish import corpus_build
from jatools.bench.harness import Context, Result
from jatools.bench.timing import alternate
from jatools.jitlibs import publish
from jax_aiter import fetch

GOAL = ">=2x curl+zstd -d+sha256sum"
STAGE_LEVEL = 3


@contextlib.contextmanager
def http_server(folder: Path):
    """`python -m http.server` on 127.0.0.1 serving `folder`; yields its base URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "--directory", str(folder),
                             str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                urllib.request.urlopen(url + "/", timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        else:
            raise RuntimeError(f"the benchmark's HTTP server on port {port} did not answer")
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def stage_release(ctx: Context, serve: Path) -> tuple[dict, dict]:
    """(manifest, identity) of a release of the corpus, staged into `serve/<tag>/` (reused when complete)."""
    _, jit_dir, ident, record, settings = corpus_build(ctx, "fetch", ctx.scale)
    comp = publish.Compression(level=STAGE_LEVEL, window_log=int(settings.raw["jit_libs_zstd_window_log"]))
    manifest, _ = publish.stage(record, ident, jit_dir, serve, comp, int(settings.raw["jit_libs_asset_limit"]),
                                ctx.log)
    return manifest, ident


def run(ctx: Context) -> Result:
    tools.require("curl", "zstd", "sha256sum")
    work = ctx.work("fetch")
    serve = work / "serve"
    manifest, ident = stage_release(ctx, serve)
    tag, window_log = manifest["release_tag"], manifest["compression"]["window_log"]
    dest, anchor_dir = work / "dest", work / "anchor"
    sums = work / "SHA256SUMS"
    sums.write_text("".join(f"{f['sha256']}  {f['name']}\n" for f in manifest["files"]))
    opts = fetch.FetchOptions(progress=False)
    raw = sum(f["size"] for f in manifest["files"])
    compressed = sum(f["compressed"]["size"] for f in manifest["files"])

    def prepare() -> None:
        shutil.rmtree(dest, ignore_errors=True)
        shutil.rmtree(anchor_dir, ignore_errors=True)
        (anchor_dir / "dl").mkdir(parents=True)
        (anchor_dir / "lib").mkdir()

    with http_server(serve) as base:
        def ours() -> None:
            fetch.fetch_release(base, ident, dest, opts=opts, log=lambda m: None)

        script = ["set -e"]
        for f in manifest["files"]:
            blob = f["compressed"]["name"]
            script.append(f"curl -sSf -o dl/{blob} {base}/{tag}/{blob}")
        for f in manifest["files"]:
            script.append(f"zstd -d -q --long={window_log} dl/{f['compressed']['name']} -o lib/{f['name']}")
        script.append(f"cd lib && sha256sum -c --quiet {sums}")

        def anchor() -> None:
            tools.run(["bash", "-c", "\n".join(script)], cwd=anchor_dir)

        t = alternate(ours, anchor, ctx.runs, ctx.warmup, prepare=prepare, log=ctx.log, label="fetch")
    speedup = t.anchor_s / t.ours_s
    short = "" if speedup >= 2 else (
        f"{speedup:.2f}x of the 2x goal: ours streams each download through zstd and sha256 (of the parts and "
        "of the library) into the library file and fsyncs it, files in parallel; the cores bound it "
        f"({os.cpu_count()}, shared with the HTTP server), the anchor is bounded by curl, zstd -d and sha256sum "
        "one after another")
    return Result("fetch", t.ours_s, t.anchor_s, GOAL, speedup >= 2, raw,
                  ours="jax_aiter.fetch.fetch_release (invoke jit.fetch)",
                  anchor="curl; zstd -d --long; sha256sum -c (in sequence)", shortfall=short,
                  runs={"ours": t.ours, "anchor": t.anchor},
                  extra={"compressed_bytes": compressed, "stage_level": STAGE_LEVEL, "window_log": window_log})
