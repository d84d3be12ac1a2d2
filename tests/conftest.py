"""Test-suite wiring: the one pytest plugin (device guards, GPU-slot pinning for xdist workers, the run
report, longest-first ordering).

The logic lives in jatools (repo-only tooling); see docs/testing.md. Nothing
here imports JAX: an xdist worker must take its GPU slot before JAX starts.
"""
import sys
from pathlib import Path

# jatools is not installed (it is not shipped); appended, so an installed jax_aiter still wins.
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.append(_ROOT)

pytest_plugins = ["jatools.testing.pytest_plugin"]
