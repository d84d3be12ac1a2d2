#!/usr/bin/env python3
"""CPU-only tests of the JIT-library transport: identity, recipe hash, decision, publish, fetch, faults, tasks.

    python3 ci/test_jit_libs_manifest.py [pytest args]   # runs tests/tooling/test_jit_libs_*.py
    pytest ci/test_jit_libs_manifest.py                  # the same suite, collected as one test

The tests themselves live once, in tests/tooling/ (where `nox -s ci_tooling`
collects them); this file is the self-runnable entry point the CI contract
names. Needs only the project's own dependencies (`pip install -e . --group tooling`):
no GPU, no native build, no network beyond 127.0.0.1.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = sorted((ROOT / "tests" / "tooling").glob("test_jit_libs_*.py"))
NEEDS = ("pytest", "zstandard", "filelock", "invoke")


def main(argv: list[str]) -> int:
    missing = []
    for name in NEEDS:
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    if missing:
        print(f"test_jit_libs_manifest: missing {', '.join(missing)}; install the project's tooling dependencies "
              f"with `{sys.executable} -m pip install -e '{ROOT}' --group '{ROOT}/pyproject.toml:tooling'`",
              file=sys.stderr)
        return 2
    if not TESTS:
        print(f"test_jit_libs_manifest: no tests found in {ROOT / 'tests' / 'tooling'}", file=sys.stderr)
        return 2
    import pytest

    return int(pytest.main(["-q", "--rootdir", str(ROOT), *map(str, TESTS), *argv]))


def test_jit_libs_tooling_suite() -> None:
    """Under pytest: run the suite in a child process (its own fixtures and servers); fail if it fails."""
    proc = subprocess.run([sys.executable, __file__, "-p", "no:cacheprovider"], check=False, capture_output=True,
                          text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stdout[-8000:] + proc.stderr[-4000:]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
