"""`python -m jax_aiter info`: what is installed and where each native library loads from.

Reads the build identity baked into the wheel and asks the loader where it would
find each library, without importing JAX, so it works (and is quick) even when
JAX itself is broken, which is when people run it.
"""
from __future__ import annotations

import json
import sys
from importlib import metadata

from jax_aiter import __version__, _loader

DIST = "jax-aiter"
IDENTITY_ORDER = ("version", "variant", "backend", "gpu_archs", "wheel_arch", "kernel_source_revision",
                  "recipe_hash", "cache_id", "ffi_api_version", "toolchain")


def collect() -> dict:
    """Everything `info` prints, as one JSON-ready dict."""
    identity = _loader.build_identity()
    try:
        dist_version = metadata.version(DIST)
    except metadata.PackageNotFoundError:
        dist_version = None
    return {
        "version": (identity or {}).get("version") or dist_version or __version__,
        "variant": (identity or {}).get("variant") or "source checkout",
        "package_dir": str(_loader.PACKAGE_DIR),
        "identity": identity,
        "fetch_cache": str(_loader.fetch_cache_dir(identity) or "") or None,
        "libraries": _loader.library_report(),
    }


def render(info: dict) -> str:
    lines = [f"jax-aiter {info['version']} ({info['variant']})", f"  {'package:':<24} {info['package_dir']}"]
    ident = info["identity"]
    if ident:
        for key in IDENTITY_ORDER:
            if key in ident and key not in ("version", "variant"):
                value = ident[key]
                if isinstance(value, (list, dict)):
                    value = json.dumps(value, sort_keys=True)
                lines.append(f"  {key + ':':<24} {value}")
    else:
        lines.append("  identity: none baked in (a source checkout; libraries come from its build tree)")
    if info["fetch_cache"]:
        lines.append(f"  {'fetch cache:':<24} {info['fetch_cache']}")
    lines.append("  libraries:")
    for lib in info["libraries"]:
        where = lib["path"] or "NOT FOUND: " + lib["error"].split("; ", 1)[-1]
        lines.append(f"    {lib['library']:<20} {where}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    info = collect()
    print(json.dumps(info, indent=2, sort_keys=True) if "--json" in argv else render(info))
    return 0
