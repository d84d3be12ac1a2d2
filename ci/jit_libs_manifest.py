#!/usr/bin/env python3
"""JIT-library manifest tooling: identity, reuse decision, publish, fetch, verify (see docs/jit-libs.md).

    python3 ci/jit_libs_manifest.py identity                  # this checkout's build identity (JSON)
    python3 ci/jit_libs_manifest.py decide [--against FILE]   # reuse or rebuild; JSON + $GITHUB_OUTPUT
    python3 ci/jit_libs_manifest.py publish --to DEST         # compress, verify, upload, manifest last
    python3 ci/jit_libs_manifest.py fetch [--base-url URL]    # into build/aiter_build; a miss fails
    python3 ci/jit_libs_manifest.py verify [--against M]      # build/aiter_build vs record or manifest
    python3 ci/jit_libs_manifest.py show MANIFEST             # validate and summarise a manifest
    python3 ci/jit_libs_manifest.py hash FILE...              # sha256sum-style, parallel

A thin front end: the logic is in jatools/jitlibs/jit_cache.py, jatools/jitlibs/publish.py and
jax_aiter/{manifest,fetch,reuse_gate}.py; `invoke jit.*` calls the same functions.
Exit status: 0 done (for `decide`, either decision), 1 failed (the message says why), 2 bad usage.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the tooling's own checkout (JA_ROOT_DIR picks the one to work on)
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from jatools import config
from jatools.jitlibs import jit_cache, publish
from jatools.native import identity, jit_build
from jax_aiter import fetch
from jax_aiter import manifest as mf
from jax_aiter.integrity import sha256_files


def _show(source: str) -> dict:
    data = (fetch.fetch_bytes(source, fetch.FetchOptions.from_env()) if "://" in source
            else Path(source).read_bytes())
    m = mf.parse(data, source)
    print(f"{m['release_tag']}  schema {m['schema']}  created {m.get('created_utc', '?')}")
    for key in (*identity.GATED_FIELDS, "toolchain"):
        print(f"  {key}: {json.dumps(m['identity'].get(key))}")
    for f in m["files"]:
        c = f["compressed"]
        print(f"  {f['name']:<20} {f['size']:>14,d} B  sha256 {f['sha256'][:16]}  -> {c['size']:>14,d} B "
              f"in {len(c['parts'])} part(s)")
    return m


def _hash(files: list[str]) -> None:
    start = time.monotonic()
    digests = sha256_files(files)
    took = time.monotonic() - start
    for f in files:
        print(f"{digests[str(f)]}  {f}")
    total = sum(os.path.getsize(f) for f in files)
    print(f"hashed {total / 1e6:.1f} MB in {took:.3f} s ({total / 1e6 / max(took, 1e-9):.0f} MB/s, "
          f"{len(files)} file(s) in parallel)", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="jit_libs_manifest.py", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("identity", help="print this checkout's build identity as JSON")
    d = sub.add_parser("decide", help="reuse or rebuild: JSON file, and decision=/rebuild= in $GITHUB_OUTPUT")
    d.add_argument("--base-url", help="where releases live (default JA_FETCH_BASE_URL, else pyproject)")
    d.add_argument("--against", type=Path, help="compare with this manifest or build record instead")
    d.add_argument("--strict", action="store_true", default=None, help="a toolchain difference means rebuild")
    d.add_argument("--json-out", type=Path, help="decision JSON (default build/jit_libs_decision.json)")
    pub = sub.add_parser("publish", help="publish build/aiter_build as release jit-libs-<cache-id>")
    pub.add_argument("--to", help="gh[:OWNER/REPO], http(s)://URL, file://URL or a folder (default: pyproject)")
    pub.add_argument("--level", type=int, help="zstd level (default: pyproject jit_libs_zstd_level)")
    pub.add_argument("--window-log", type=int, help="zstd window log (default: pyproject)")
    pub.add_argument("--asset-limit", type=int, help="max bytes per asset; larger blobs are split")
    pub.add_argument("--stage-only", action="store_true", help="compress, verify and write the manifest; no upload")
    f = sub.add_parser("fetch", help="fetch this checkout's release into build/aiter_build (never builds)")
    f.add_argument("--base-url")
    f.add_argument("--strict", action="store_true", default=None, help="refuse a toolchain difference")
    f.add_argument("--force", action="store_true", help="download even if a verified copy is present")
    v = sub.add_parser("verify", help="check a folder against its build record, or a given manifest")
    v.add_argument("--dir", type=Path, help="folder (default build/aiter_build)")
    v.add_argument("--against", help="manifest or record (path or URL)")
    s = sub.add_parser("show", help="validate and summarise a manifest (path or URL)")
    s.add_argument("manifest")
    h = sub.add_parser("hash", help="sha256 of files, in parallel (sha256sum output format)")
    h.add_argument("files", nargs="+")
    args = p.parse_args(argv)
    try:
        settings = config.load()
        if args.cmd == "identity":
            ident, notes = jit_build.checkout_identity(settings)
            for n in notes:
                print(f"note: {n}", file=sys.stderr)
            print(json.dumps(ident, indent=2, sort_keys=True))
        elif args.cmd == "decide":
            jit_cache.run_decide(settings, base_url=args.base_url, against=args.against, strict=args.strict,
                                 json_path=args.json_out)
        elif args.cmd == "publish":
            publish.publish(settings, args.to or settings.raw["jit_libs_publish_to"], level=args.level,
                            window_log=args.window_log, asset_limit=args.asset_limit, stage_only=args.stage_only)
        elif args.cmd == "fetch":
            jit_cache.run_fetch(settings, base_url=args.base_url, strict=args.strict, force=args.force)
        elif args.cmd == "verify":
            source, n = jit_cache.verify(args.dir or settings.jit_dir, args.against)
            print(f"verify: {n} file(s) in {args.dir or settings.jit_dir} match {source}")
        elif args.cmd == "show":
            _show(args.manifest)
        elif args.cmd == "hash":
            _hash(args.files)
    except jit_cache.errors() as e:
        print(f"jit_libs_manifest {args.cmd}: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
