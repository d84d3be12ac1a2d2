"""The JIT-library steps the release runs, as the functions `invoke jit.fetch` and `invoke verify` call:

    python -m jatools.jitlibs fetch [--base-url URL] [--pins-from URL] [--strict] [--force]
    python -m jatools.jitlibs verify [--dir DIR] [--against MANIFEST]

The release (jatools/release.py) composes these modules' functions through their mains, never through invoke:
the tasks are the command line people type, this is the same call without the task runner.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from jatools import config
from jatools.jitlibs import download, record
from jatools.jitlibs.errors import CLI_ERRORS


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m jatools.jitlibs", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="action", required=True)
    f = sub.add_parser("fetch", help="fetch this checkout's JIT libraries into build/aiter_build (a miss fails)")
    f.add_argument("--base-url", help="where releases live (default JA_FETCH_BASE_URL, else pyproject's)")
    f.add_argument("--pins-from", help="accept only the libraries the producer published at this base URL")
    f.add_argument("--strict", action="store_true", help="refuse a toolchain difference too")
    f.add_argument("--force", action="store_true", help="download even if a verified copy is present")
    v = sub.add_parser("verify", help="check build/aiter_build against its build record (or --against)")
    v.add_argument("--dir", type=Path, help="folder to check (default build/aiter_build)")
    v.add_argument("--against", help="manifest or record (path or URL)")
    a = p.parse_args(argv)
    try:
        if a.action == "fetch":
            download.run_fetch(config.load(), base_url=a.base_url, strict=a.strict or None, force=a.force,
                               pins_from=a.pins_from)
        else:
            print(record.verify_build(config.load(), a.dir, a.against), flush=True)
    except CLI_ERRORS as e:
        print(f"jit.{a.action}: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
