"""invoke tasks: hash verification, wheel checks, clean-room validation, JIT-library transport, release.

Tasks are thin: each parses its arguments, calls one jatools module, and turns
its errors into `Exit` with a message and a code. `invoke --list` shows them.
"""
from __future__ import annotations

from invoke import Collection

ns = Collection()


# --- JIT-library transport: jit.fetch / jit.publish / jit.verify / jit.decide, and `invoke verify` ---------
# (logic in jatools/jit_cache.py and jatools/publish.py; docs/jit-libs.md)
from pathlib import Path as _Path

from invoke import Exit, task

from jatools import config as _config
from jatools import jit_cache as _jit_cache
from jatools import publish as _publish


def _jit_run(name: str, fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except _jit_cache.errors() as e:
        raise Exit(f"jit.{name}: error: {e}", code=1) from None


@task(help={"base-url": "where releases live (default JA_FETCH_BASE_URL, else pyproject jit_libs_base_url)",
            "strict": "refuse a toolchain difference too", "force": "download even if a verified copy is present"})
def jit_fetch(c, base_url=None, strict=False, force=False):
    """Fetch this checkout's JIT libraries (release jit-libs-<cache-id>) into build/aiter_build; a miss fails."""
    _jit_run("fetch", _jit_cache.run_fetch, _config.load(), base_url=base_url, strict=strict or None, force=force)


@task(help={"to": "gh[:OWNER/REPO], http(s)://URL, file://URL or a folder (default pyproject jit_libs_publish_to)",
            "level": "zstd level", "window-log": "zstd window log", "asset-limit": "max bytes per asset",
            "stage-only": "compress, verify and write the manifest without uploading"})
def jit_publish(c, to=None, level=None, window_log=None, asset_limit=None, stage_only=False):
    """Publish build/aiter_build as jit-libs-<cache-id>: zstd, verify, split, upload, manifest last."""
    settings = _config.load()
    ints = {k: int(v) for k, v in {"level": level, "window_log": window_log, "asset_limit": asset_limit}.items()
            if v is not None}
    _jit_run("publish", _publish.publish, settings, to or settings.raw["jit_libs_publish_to"], stage_only=stage_only,
             runner=_publish.invoke_runner(c), **ints)


@task(help={"dir": "folder to check (default build/aiter_build)", "against": "manifest or record (path or URL)"})
def jit_verify(c, dir=None, against=None):
    """Check build/aiter_build against its build record (or a given manifest); names every differing file."""
    settings = _config.load()
    folder = _Path(dir) if dir else settings.jit_dir
    source, n = _jit_run("verify", _jit_cache.verify, folder, against)
    print(f"verify: {n} file(s) in {folder} match {source}")


@task(help={"base-url": "where releases live", "against": "compare with this manifest or build record instead",
            "strict": "a toolchain difference means rebuild", "json-out": "decision JSON path"})
def jit_decide(c, base_url=None, against=None, strict=False, json_out=None):
    """Reuse or rebuild the JIT libraries? Prints every reason; JSON file; decision=/rebuild= in $GITHUB_OUTPUT."""
    _jit_run("decide", _jit_cache.run_decide, _config.load(), base_url=base_url,
             against=_Path(against) if against else None, strict=strict or None,
             json_path=_Path(json_out) if json_out else None)


jit = Collection("jit")
jit.add_task(jit_fetch, "fetch")
jit.add_task(jit_publish, "publish")
jit.add_task(jit_verify, "verify")
jit.add_task(jit_decide, "decide")
ns.add_collection(jit)
ns.add_task(jit_verify, "verify")
