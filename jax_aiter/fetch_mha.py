"""jax-aiter-fetch-mha: download the attention JIT libraries for this install of the lite wheel.

The lite wheel leaves out libmha_fwd.so and libmha_bwd.so (over 2 GB). This
command fetches exactly the ones built for the identity baked into the
installed wheel (jax_aiter/_build_identity.json), verifies every byte, and
installs them where the runtime loader looks:
$XDG_CACHE_HOME/jax-aiter/<version>/<cache-id>/ (JAX_AITER_LIB_DIR overrides,
--dest overrides both). It never builds anything.

Exit status: 0 installed or already present; 1 failed (the message says why and
what to do; nothing was changed); 2 bad usage.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from jax_aiter import _loader, op_table, remedies, settings
from jax_aiter.download.manifest import ManifestError
from jax_aiter.download.release import fetch_release
from jax_aiter.download.transfer import (
    ENV_BASE_URL,
    ENV_RETRIES,
    ENV_TIMEOUT,
    FetchError,
    FetchOptions,
    resolve_base_url,
)

BASE_URL_KEY = "fetch_base_url"  # the wheel's baked default base URL


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def local_gpu_archs(backend: str) -> tuple[list[str] | None, str]:
    """The GPU archs of this machine (None when they cannot be found) and how they were found."""
    if backend == "rocm":
        tool = shutil.which("rocminfo")
        if not tool:
            return None, "rocminfo not found"
        out = subprocess.run([tool], check=False, capture_output=True, text=True, timeout=60)
        archs = sorted(set(re.findall(r"\bgfx[0-9a-f]{2,}\b", out.stdout)) - {"gfx000"})
        return (archs or None), "rocminfo"
    if backend == "cuda":
        tool = shutil.which("nvidia-smi")
        if not tool:
            return None, "nvidia-smi not found"
        out = subprocess.run([tool, "--query-gpu=compute_cap", "--format=csv,noheader"],
                             check=False, capture_output=True, text=True, timeout=60)
        caps = re.findall(r"(\d+)\.(\d+)", out.stdout)
        return (sorted({f"sm_{a}{b}" for a, b in caps}) or None), "nvidia-smi"
    return [], "CPU build"


def check_arch(identity: dict) -> None:
    """Refuse libraries built for none of this machine's GPUs (before downloading gigabytes)."""
    built = identity.get("gpu_archs") or []
    if not built:
        return
    local, how = local_gpu_archs(identity.get("backend", ""))
    if local is None:
        _log(f"jax-aiter-fetch-mha: note: cannot tell this machine's GPU archs ({how}); arch check skipped")
        return
    if not set(local) & set(built):
        raise FetchError(
            f"this machine's GPUs are {', '.join(local)} ({how}), but this jax-aiter install's attention "
            f"libraries are built for {', '.join(built)}; install a jax-aiter wheel built for your GPU, "
            "or pass --skip-arch-check to fetch anyway")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="jax-aiter-fetch-mha", description=__doc__.split("\n\n")[0],
                                epilog=f"Environment: {ENV_BASE_URL}, JA_FETCH_TIMEOUT_S, JA_FETCH_RETRIES, "
                                       "JAX_AITER_LIB_DIR, XDG_CACHE_HOME.")
    p.add_argument("--base-url", help=f"where releases live (default: {ENV_BASE_URL}, else the wheel's baked URL)")
    p.add_argument("--dest", type=Path, help="install folder (default: the cache the runtime loader searches)")
    p.add_argument("--force", action="store_true", help="download again even if a verified copy is present")
    p.add_argument("--skip-arch-check", action="store_true",
                   help="fetch even if this machine's GPUs are not among the archs the libraries are built for")
    p.add_argument("--identity", type=Path, help="identity file to fetch for (default: the installed wheel's)")
    p.add_argument("--timeout", type=settings.flag_type(ENV_TIMEOUT, "--timeout"),
                   help="seconds without data before a retry (default JA_FETCH_TIMEOUT_S or 60)")
    p.add_argument("--retries", type=settings.flag_type(ENV_RETRIES, "--retries"),
                   help="retries after the first attempt (default JA_FETCH_RETRIES or 4)")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    args = p.parse_args(argv)
    try:
        if args.identity:
            identity = json.loads(args.identity.read_text())
        else:
            identity = _loader.build_identity()
        if identity and not (identity.get("cache_id") and identity.get("version")):
            raise FetchError(f"the build identity {args.identity or _loader.IDENTITY_FILE} has no cache_id or "
                             "version; reinstall jax-aiter (the wheel bakes both)")
        if not identity:
            raise FetchError(
                "this jax-aiter is not an installed wheel (no jax_aiter/_build_identity.json), so there is no "
                "identity to fetch for; in a source checkout "
                f"{remedies.build_or_fetch(op_table.fetched_libraries(_loader.OPS))}")
        # its pins name the shipped bytes (RUNPATHs made the wheel's), not a fetch's
        if identity.get("variant") == "full":
            print("jax-aiter-fetch-mha: nothing to fetch: this is the +full wheel, which ships the attention libraries")
            return 0
        if not args.skip_arch_check:
            check_arch(identity)
        base = resolve_base_url(args.base_url, identity.get(BASE_URL_KEY))
        dest = args.dest or _loader.fetch_cache_dir(identity, required=True)
        opts = FetchOptions.from_env()
        flags = {"timeout_s": args.timeout, "retries": args.retries, "progress": False if args.quiet else None}
        opts = dataclasses.replace(opts, **{k: v for k, v in flags.items() if v is not None})
        result = fetch_release(base, identity, dest, list(_loader.MHA_JIT_LIBS), force=args.force, opts=opts,
                               log=(lambda m: None) if args.quiet else _log)
    except (FetchError, ManifestError, OSError, ValueError) as e:
        _log(f"jax-aiter-fetch-mha: error: {e}")
        return 1
    print(f"jax-aiter-fetch-mha: {', '.join(result.files)} {result.status} in {result.dest}")
    if args.dest and args.dest != _loader.fetch_cache_dir(identity):
        print(f"jax-aiter-fetch-mha: set JAX_AITER_LIB_DIR={args.dest} so jax-aiter loads them from there")
    return 0


if __name__ == "__main__":
    sys.exit(main())
