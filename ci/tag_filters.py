#!/usr/bin/env python3
"""Print the pytest marker expression for a (platform, config) or a tier; keep the golden file.

    python3 -m ci.tag_filters --config single_gpu --platform rocm
    python3 -m ci.tag_filters --tier pr --platform cuda
    python3 -m ci.tag_filters --all              # the whole table
    python3 -m ci.tag_filters --update-golden    # rewrite ci/tag_filters_golden.txt

The table lives in jatools/testing/tag_filters.py; this script only prints it.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from jatools import atomic_write
from jatools.testing import tag_filters as tf

ROOT = Path(__file__).resolve().parent.parent

GOLDEN = ROOT / "ci" / "tag_filters_golden.txt"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m ci.tag_filters", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--platform", help=f"one of {', '.join(tf.PLATFORMS)}")
    p.add_argument("--config", help=f"one of {', '.join(tf.CONFIGS)}")
    p.add_argument("--tier", help=f"one of {', '.join(tf.TIERS)} (prints one line per pytest run)")
    p.add_argument("--all", action="store_true", help="print the whole table (the golden file's content)")
    p.add_argument("--update-golden", action="store_true", help=f"rewrite {GOLDEN.relative_to(ROOT)}")
    a = p.parse_args(argv)
    try:
        if a.update_golden:
            atomic_write.write_text(GOLDEN, tf.render_table())
            print(f"wrote {GOLDEN}")
        elif a.all:
            sys.stdout.write(tf.render_table())
        elif a.tier:
            for kind, config, f in tf.tier_runs(a.tier, a.platform or "cpu"):
                print(f"{kind} {config}: {f.expression()}")
        elif a.platform and a.config:
            f = tf.tag_filter(a.platform, a.config)
            if f.contradiction():
                print(f"# ({a.platform}, {a.config}) selects nothing: {f.contradiction()}", file=sys.stderr)
            print(f.expression())
        else:
            p.error("give --platform and --config, or --tier [--platform], or --all")
    except tf.TagFilterError as e:
        print(f"tag_filters: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
