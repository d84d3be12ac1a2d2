"""The JIT-library steps the release runs as commands (implementation; the doors are `invoke jit.fetch` and
`invoke verify`):

    python -m jatools.jitlibs fetch [--base-url URL] [--pins-from URL]
    python -m jatools.jitlibs verify
"""
from __future__ import annotations

import argparse
import sys

from jatools import config
from jatools.jitlibs import download, record
from jatools.jitlibs.errors import CLI_ERRORS


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m jatools.jitlibs", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="step", required=True)
    fetch = sub.add_parser("fetch", help="fetch this checkout's JIT libraries into build/aiter_build; a miss fails")
    fetch.add_argument("--base-url", help="where releases live (default JA_FETCH_BASE_URL, else pyproject)")
    fetch.add_argument("--pins-from", help="accept only the libraries the producer published at this base URL")
    sub.add_parser("verify", help="check build/aiter_build against its build record and the op table")
    a = p.parse_args(argv)
    try:
        if a.step == "fetch":
            download.run_fetch(config.load(), base_url=a.base_url, pins_from=a.pins_from)
        else:
            print(record.verify_build(config.load()), flush=True)
    except CLI_ERRORS as e:
        raise SystemExit(f"jatools.jitlibs {a.step}: error: {e}") from None  # exit status 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
