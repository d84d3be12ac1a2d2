"""Interim test wheels: the checkout's runtime and CPU libraries packed with `wheel.wheelfile.WheelFile`.

Stands in for the wheels branch's builder until it is merged; the layout is the
contract's (libraries in jax_aiter/_lib/, identity in jax_aiter/_build_identity.json).
"""
from __future__ import annotations

import json
from pathlib import Path

from wheel.wheelfile import WheelFile

from jatools import config

REPO = Path(__file__).resolve().parents[2]
MHA = ("libmha_fwd.so", "libmha_bwd.so")


def metadata(version: str) -> str:
    return "\n".join([
        "Metadata-Version: 2.1", "Name: jax-aiter", f"Version: {version}",
        "Requires-Python: >=3.10", "Requires-Dist: jax>=0.11.0", "Requires-Dist: jaxlib>=0.11.0",
        "Requires-Dist: numpy>=1.26", "Provides-Extra: fetch",
        'Requires-Dist: zstandard>=0.22; extra == "fetch"', 'Requires-Dist: filelock>=3.12; extra == "fetch"', "",
    ])


def build(out: Path, variant: str, libs: list[Path], py_root: Path = REPO / "jax_aiter",
          skip_py: tuple[str, ...] = (), extra: dict[str, bytes] | None = None) -> Path:
    """A wheel of `variant` holding the Python runtime (minus skip_py) and `libs` in jax_aiter/_lib."""
    record = json.loads((REPO / "build/aiter_build/build_record.json").read_text())
    base = config.project_version(REPO)
    version = f"{base}+full" if variant == "full" else base
    ident = {**record["identity"], "version": base, "variant": variant}
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"jax_aiter-{version}-py3-none-linux_x86_64.whl"
    dist = f"jax_aiter-{version}.dist-info"
    with WheelFile(path, "w") as wf:
        for f in sorted(py_root.rglob("*.py")):
            rel = f.relative_to(py_root.parent).as_posix()
            if "__pycache__" not in rel and not any(rel.startswith(s) for s in skip_py):
                wf.write(str(f), rel)
        for lib in libs:
            wf.write(str(lib), f"jax_aiter/_lib/{lib.name}")
        wf.writestr("jax_aiter/_build_identity.json", json.dumps(ident, indent=1))
        for name, data in (extra or {}).items():
            wf.writestr(name, data)
        wf.writestr(f"{dist}/METADATA", metadata(version))
        wf.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: false\n"
                                     "Tag: py3-none-linux_x86_64\n")
        wf.writestr(f"{dist}/entry_points.txt", "[console_scripts]\njax-aiter-fetch-mha = jax_aiter.fetch_mha:main\n")
    return path


def checkout_libs(variant: str) -> list[Path]:
    """The CPU libraries of this checkout's build tree that a `variant` wheel ships."""
    libs = sorted((REPO / "build/jax_aiter_build").glob("*.so")) + sorted((REPO / "build/aiter_build").glob("lib*.so"))
    return [p for p in libs if variant == "full" or p.name not in MHA]
