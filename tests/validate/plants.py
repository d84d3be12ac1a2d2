"""Defects planted in copies of good wheels, each the way it happens in real life, for the clean room to catch.

The wheel surgery itself is the wheel tests' (tests/wheel/wheel_plant.py:
rewrite_wheel, patch_dynamic_string); this module adds what only the clean room
needs: a shim compiled against newer FFI headers, and short links into the
build tree for a RUNPATH that works on the build machine only.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from tests.build import scratch


def short_links(targets: list[Path], tag: str) -> list[Path]:
    """Short symlinks to `targets` (a RUNPATH rewritten in place must fit in the old string)."""
    links = []
    for i, target in enumerate(targets):
        link = Path("/tmp") / f"ja{tag}{i}"
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target)
        links.append(link)
    return links


def newer_ffi_shim(work: Path, build_dir: Path) -> Path:
    """Build rmsnorm_fwd_ja.so in a scratch copy whose XLA FFI headers claim the next minor API version.

    That is what happens when a shim is compiled against a newer jaxlib's
    headers than the one installed. Starts from `build_dir` (a built tree), so
    make recompiles only the shim. Returns the rebuilt shim.
    """
    root = scratch.make_scratch(work)
    header = root / "third_party/xla_ffi/include/xla/ffi/api/c_api.h"
    text = header.read_text()
    minor = int(re.search(r"#define XLA_FFI_API_MINOR (\d+)", text).group(1))
    header.write_text(text.replace(f"#define XLA_FFI_API_MINOR {minor}", f"#define XLA_FFI_API_MINOR {minor + 1}"))
    (root / "build").mkdir()
    for part in ("config.mk", "obj", "jax_aiter_build"):
        src = build_dir / part
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, root / "build" / part)
    # The FFI headers are -isystem, so -MMD records no dependency on them: drop the shim's objects by hand.
    shutil.rmtree(root / "build/obj/cpu/csrc/ffi/rmsnorm_fwd")
    (root / "build/aiter_build").mkdir()
    shutil.copy2(build_dir / "aiter_build/librmsnorm_fwd.so", root / "build/aiter_build")
    scratch.run(["make", "build/jax_aiter_build/rmsnorm_fwd_ja.so"], root)
    return root / "build/jax_aiter_build/rmsnorm_fwd_ja.so"


def run_from_checkout(venv: Path, checkout: Path, code: str) -> subprocess.CompletedProcess:
    """Run `code` with the room's interpreter the way a developer would: from the checkout, not isolated."""
    return subprocess.run([str(venv / "bin/python"), "-c", code], cwd=checkout, check=False, capture_output=True,
                          text=True)
