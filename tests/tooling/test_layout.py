"""The layout's rule that the runtime stands alone: nothing under jax_aiter/ names the build tooling."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_runtime_package_never_names_the_tooling() -> None:
    """jax_aiter/ ships in the wheels and the tooling does not: an import (or a mention that invites one) of
    jatools there would break an installed wheel."""
    hits = [f"{p.relative_to(ROOT)}:{n}" for p in sorted((ROOT / "jax_aiter").rglob("*"))
            if p.is_file() and p.suffix in (".py", ".json", ".toml")
            for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1) if "jatools" in line]
    assert not hits, f"jax_aiter/ names jatools at {hits}"
