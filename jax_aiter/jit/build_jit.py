#!/usr/bin/env python3
"""Build the JIT libraries into build/aiter_build/ (the reference recipe's command; checkout only).

    python3 jax_aiter/jit/build_jit.py [--module a,b] [--verbose] [--log FILE] [-j N]

An alias of `make jit` (the umbrella library first, then the JIT build of the
build tooling, docs/architecture.md): this file holds no logic, and wheels do
not carry it.
"""
import os
import shlex
import shutil
import sys
from pathlib import Path

if __name__ == "__main__":
    root = Path(__file__).resolve().parents[2]
    make = shutil.which("make") or sys.exit("build_jit.py: `make` is not on PATH; install it (apt-get install make)")
    os.execv(make, [make, "--no-print-directory", "-C", str(root), "jit", f"PYTHON={sys.executable}",
                    f"JIT_ARGS={shlex.join(sys.argv[1:])}"])
