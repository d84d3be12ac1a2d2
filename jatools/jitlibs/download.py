"""Fetch this checkout's published JIT libraries (release jit-libs-<cache-id>) into build/aiter_build.

A miss raises; it never builds. The fetched set gets a build record, so every later step reads one format
whether the libraries were built or fetched.
"""
from __future__ import annotations

from jatools import config
from jatools.jitlibs.decide import Log, default_base_url, strict_toolchain
from jatools.jitlibs.record import JitCacheError, record_from_manifest, write_json
from jatools.native import jit_build
from jax_aiter import remedies
from jax_aiter.download import manifest as mf
from jax_aiter.download import release, transfer
from jax_aiter.integrity import RECORD_NAME


def run_fetch(settings: config.Settings, *, base_url: str | None = None, strict: bool | None = None,
              force: bool = False, log: Log = print, pins_from: str | None = None) -> release.FetchResult:
    """Fetch this checkout's release into build/aiter_build; a miss raises, it never builds.

    `pins_from`: the base URL the producer published to (the release passes pyproject's jit_libs_base_url); the
    libraries it lists for this cache id are the pins, and a fetched set that differs is refused before download."""
    want, notes = jit_build.checkout_identity(settings)
    for n in notes:
        log(f"fetch: {n}")
    if want.get("kernel_source_dirty"):
        raise JitCacheError(
            f"the kernel sources ({settings.kernel_source_dir}) have uncommitted changes, so no published release "
            f"matches them; commit them, or build locally with `{remedies.door('jit')}`")
    base, opts = default_base_url(settings, base_url), transfer.FetchOptions.from_env()
    strict = strict_toolchain(settings, strict)
    if pins_from and transfer.as_url(pins_from) != transfer.as_url(base):
        published, url = release.read_manifest(pins_from, want["cache_id"], opts, log)
        release.check_identity(want, published, url, strict)
        want = {**want, "pins": mf.raw_entries(published["files"])}
        log(f"fetch: pinned to the {len(published['files'])} libraries the producer published at {url}")
    result = release.fetch_release(base, want, settings.jit_dir, strict_toolchain=strict, force=force, opts=opts,
                                 log=log)
    write_json(settings.jit_dir / RECORD_NAME, record_from_manifest(result.manifest, result.url))
    write_json(settings.build_dir / "jit_libs_fetch.json", {
        "status": result.status, "release_tag": result.manifest["release_tag"], "url": result.url,
        "dest": str(result.dest), "files": result.files, "downloaded_bytes": result.downloaded_bytes,
        "seconds": round(result.seconds, 2), "warnings": result.warnings})
    return result
