"""`python -m jax_aiter info [--verify] [--json]`: what is installed and where each native library loads from.

Each library found is checked as the loader checks it before loading (its size
against its record or the wheel's pins, its SONAME against its name); `--verify`
also hashes it. Exit status 1 when any library found is wrong (the line names
the file, what is wrong and the fix), else 0; a library not found (the attention
libraries of a lite wheel before `jax-aiter-fetch-mha`) is reported, not an error.

Reads the build identity baked into the wheel and asks the loader where it would
find each library, without importing JAX, so it works (and is quick) even when
JAX itself is broken, which is when people run it.
"""
from __future__ import annotations

import json
import sys

from jax_aiter import __version__, _loader

IDENTITY_ORDER = ("version", "variant", "backend", "gpu_archs", "wheel_arch", "kernel_source_revision",
                  "recipe_hash", "cache_id", "ffi_api_version", "toolchain")


def collect(verify: bool = False) -> dict:
    """Everything `info` prints, as one JSON-ready dict."""
    identity = _loader.build_identity()
    return {
        "version": __version__,
        "variant": (identity or {}).get("variant") or "source checkout",
        "package_dir": str(_loader.PACKAGE_DIR),
        "identity": identity,
        "fetch_cache": str(_loader.fetch_cache_dir(identity) or "") or None,
        "libraries": _loader.library_report(verify),
        "verified": verify,
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
        for problem in lib.get("problems", []):
            lines.append(f"      PROBLEM: {problem}; {lib['fix']}")
    bad = [lib["library"] for lib in info["libraries"] if lib.get("problems")]
    checked = "size, sha256 and SONAME" if info.get("verified") else "size and SONAME (--verify: sha256 too)"
    lines.append(f"  {len(bad)} librar{'y' if len(bad) == 1 else 'ies'} with a problem: {', '.join(bad)}" if bad
                 else f"  every library found is sound ({checked} checked)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    unknown = [a for a in argv if a not in ("--json", "--verify")]
    if unknown:
        print(f"python -m jax_aiter info: unknown option {unknown[0]!r}; options are --verify and --json",
              file=sys.stderr)
        return 2
    info = collect(verify="--verify" in argv)
    print(json.dumps(info, indent=2, sort_keys=True) if "--json" in argv else render(info))
    return 1 if any(lib.get("problems") for lib in info["libraries"]) else 0
