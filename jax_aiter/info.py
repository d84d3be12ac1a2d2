"""`python -m jax_aiter info [--verify] [--json]`: what is installed and where each native library loads from.

Each library found is checked as the loader checks it before loading (its size
against its record or the wheel's pins, its SONAME against its name); `--verify`
also hashes it. Exit status 1 when any library found is wrong (the line names
the file, what is wrong and the fix), else 0; a library not found (the attention
libraries of a lite wheel before `jax-aiter-fetch-mha`, or what a source checkout has
not built yet) is reported, not an error; a library the installed wheel ships that is
gone is an error (exit 1). A closed pipe (`info | head`) ends it quietly.

Reads the build identity baked into the wheel and asks the loader where it would
find each library, without importing JAX, so it works (and is quick) even when
JAX itself is broken, which is when people run it. The host's GPUs come from the
drivers' tools (nvidia-smi, rocminfo: jax_aiter/host_gpus.py); a lane they do not
fit (another backend's GPUs, or archs none of its code runs on: jax_aiter/lane.py)
is a problem too (exit 1), with the command that installs the right lane.
"""
from __future__ import annotations

import json
import os
import sys

from jax_aiter import __version__, _loader, host_gpus, lane, settings

IDENTITY_ORDER = ("version", "variant", "lane", "backend", "gpu_archs", "wheel_arch", "kernel_source_revision",
                  "recipe_hash", "cache_id", "ffi_api_version", "toolchain")


def collect(verify: bool = False) -> dict:
    """Everything `info` prints, as one JSON-ready dict."""
    identity = _loader.build_identity()
    gpus, unknown = host_gpus.present()
    return {
        "version": __version__,
        "variant": (identity or {}).get("variant") or "source checkout",
        "package_dir": str(_loader.PACKAGE_DIR),
        "identity": identity,
        "host_gpus": {"found": gpus, "probe_failures": unknown, "lane_problem": lane.host_mismatch(identity, gpus)},
        "fetch_cache": str(_loader.fetch_cache_dir(identity) or "") or None,
        "libraries": _loader.library_report(verify),
        "verified": verify,
    }


def render(info: dict) -> str:
    lane = (info["identity"] or {}).get("lane")
    lines = [f"jax-aiter {info['version']} ({info['variant']}{f', lane {lane}' if lane else ''})",
             f"  {'package:':<24} {info['package_dir']}"]
    ident = info["identity"]
    if ident:
        for key in IDENTITY_ORDER:
            if key in ident and key not in ("version", "variant", "lane"):
                value = ident[key]
                if isinstance(value, (list, dict)):
                    value = json.dumps(value, sort_keys=True)
                lines.append(f"  {key + ':':<24} {value}")
    else:
        lines.append("  identity: none baked in (a source checkout; libraries come from its build tree)")
    host = info["host_gpus"]
    seen = "; ".join(f"{b} {', '.join(a)}" for b, a in sorted(host["found"].items())) or "none found"
    lines.append(f"  {'host GPUs:':<24} {seen}" + "".join(f" ({f})" for f in host["probe_failures"]))
    if host["lane_problem"]:
        lines.append(f"  PROBLEM: {host['lane_problem']}")
    if info["fetch_cache"]:
        lines.append(f"  {'fetch cache:':<24} {info['fetch_cache']}")
    lines.append("  libraries:")
    for lib in info["libraries"]:
        where = lib["path"] or "NOT FOUND: " + lib["error"].split("; ", 1)[-1]
        lines.append(f"    {lib['library']:<20} {where}")
        for problem in lib.get("problems", []):
            lines.append(f"      PROBLEM: {problem}; {lib['fix']}")
    bad = [lib["library"] for lib in info["libraries"] if lib.get("problems")]
    gone = [lib["library"] for lib in info["libraries"] if lib.get("required")]
    checked = "size, sha256 and SONAME" if info.get("verified") else "size and SONAME (--verify: sha256 too)"
    if gone:
        lines.append(f"  {_count(gone)} the wheel ships {'is' if len(gone) == 1 else 'are'} missing: {', '.join(gone)} "
                     "(the install is damaged: `pip install --force-reinstall --no-deps jax-aiter`)")
    lines.append(f"  {_count(bad)} with a problem: {', '.join(bad)}" if bad
                 else f"  every library found is sound ({checked} checked)")
    return "\n".join(lines)


def _count(names: list[str]) -> str:
    return f"{len(names)} librar{'y' if len(names) == 1 else 'ies'}"


def failed(info: dict) -> bool:
    """A library found is wrong, one the wheel ships is gone, or the lane does not fit the host's GPUs."""
    return bool(info["host_gpus"]["lane_problem"]) or any(lib.get("problems") or lib.get("required")
                                                          for lib in info["libraries"])


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    unknown = [a for a in argv if a not in ("--json", "--verify")]
    if unknown:
        print(f"python -m jax_aiter info: unknown option {unknown[0]!r}; options are --verify and --json",
              file=sys.stderr)
        return 2
    try:
        settings.check_environment(group="runtime")
    except settings.SettingError as e:
        print(f"python -m jax_aiter info: {e}", file=sys.stderr)
        return 2
    info = collect(verify="--verify" in argv)
    text = json.dumps(info, indent=2, sort_keys=True) if "--json" in argv else render(info)
    try:
        print(text, flush=True)
    except BrokenPipeError:  # `info | head`: the reader has what it wanted; no traceback, no flush error at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 1 if failed(info) else 0
