"""Build identity of the JIT libraries, derived at build time and never typed by hand.

The hard gate for reuse is (kernel-source revision, GPU arch set, recipe hash,
backend, FFI API version); the toolchain is recorded as advisory provenance.
The recipe hash itself is derived by jatools.native.jit_build.recipe.
"""
from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

from jatools import config
from jatools.native import toolchain
from jax_aiter.reuse_gate import GATED_FIELDS, cache_id  # noqa: F401  (re-exported: one definition)


class IdentityError(RuntimeError):
    pass


def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(root), *args], check=False, capture_output=True, text=True)


def kernel_source_revision(root: Path, kernel_dir: Path) -> tuple[str, bool]:
    """(revision, dirty): `git rev-parse HEAD:<dir>` (a tree id or a submodule commit).

    Outside a git checkout with that folder committed (a source tarball, a copied
    tree) the revision is a content hash, "content-sha256:<hex>", and the build
    counts as dirty: it builds and runs, but cannot be published.
    """
    rel = kernel_dir.resolve().relative_to(root.resolve()).as_posix()
    out = _git(root, "rev-parse", f"HEAD:{rel}")
    if out.returncode != 0:
        print(f"identity: `git rev-parse HEAD:{rel}` failed ({out.stderr.strip() or 'not a git checkout'}); "
              f"using a content hash of {rel} (such a build cannot be published)", file=sys.stderr)
        return content_revision(kernel_dir), True
    status = _git(root, "status", "--porcelain", "--", rel)
    return out.stdout.strip(), bool(status.stdout.strip())


def content_revision(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(q for q in folder.rglob("*") if q.is_file()):
        h.update(p.relative_to(folder).as_posix().encode() + b"\0" + hashlib.sha256(p.read_bytes()).digest())
    return "content-sha256:" + h.hexdigest()


def derive(settings: config.Settings, tc: toolchain.Toolchain, recipe_hash: str) -> dict:
    """The build identity; `recipe_hash` comes from jit_build.recipe (command lines + every file read)."""
    rev, dirty = kernel_source_revision(settings.root, settings.kernel_source_dir)
    major, minor = toolchain.ffi_api_version(settings.ffi_include_dir)
    ident = {
        "kernel_source_revision": rev,
        "kernel_source_dirty": dirty,
        "gpu_archs": sorted(tc.archs),
        "recipe_hash": recipe_hash,
        "backend": tc.backend,
        "ffi_api_version": f"{major}.{minor}",
        "toolchain": tc.identity(),
    }
    ident["cache_id"] = cache_id(ident)
    return ident
