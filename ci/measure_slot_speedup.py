#!/usr/bin/env python3
"""Time the pr tier's GPU tests with 2 xdist workers (one GPU each) against 1 worker; write JSON.

    python3 ci/measure_slot_speedup.py [--workers 2] [--repeats 1] [--out build/test-results/slot_speedup.json]

The logic is jatools/testing/speedup.py (main) (see its docstring and docs/testing.md).
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from jatools.testing.speedup import main

if __name__ == "__main__":
    sys.exit(main())
