"""Ways to break a good wheel, each the way it breaks in real life, for the clean room to catch.

Every plant yields a real wheel (a real zip, a RECORD, real ELF libraries); only
the one defect differs from the good wheel.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

from elftools.elf.elffile import ELFFile

from tests.build import scratch


def set_runpath(lib: Path, new: str) -> str:
    """Overwrite DT_RUNPATH's string in place (the new one may not be longer); return the old one."""
    with open(lib, "rb") as f:
        elf = ELFFile(f)
        dynstr = elf.get_section_by_name(".dynstr")
        tag = next(t for t in elf.get_section_by_name(".dynamic").iter_tags() if t.entry.d_tag == "DT_RUNPATH")
        old, offset = tag.runpath, dynstr["sh_offset"] + tag.entry.d_val
    if len(new) > len(old):
        raise ValueError(f"new RUNPATH {new!r} is longer than the old {old!r}")
    with open(lib, "r+b") as f:
        f.seek(offset)
        f.write(new.encode() + b"\0")
    return old


def replace_member(wheel: Path, name: str, data: bytes, out: Path) -> Path:
    """A copy of `wheel` whose member `name` holds `data`, RECORD left as it was (a file edited after the build)."""
    out.mkdir(parents=True, exist_ok=True)
    dest = out / wheel.name
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info, data if info.filename == name else src.read(info.filename))
    return dest


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


def newer_ffi_shim(work: Path, jit_lib: Path) -> Path:
    """Build rmsnorm_fwd_ja.so in a scratch copy whose XLA FFI headers claim the next minor API version.

    That is what happens when a shim is compiled against a newer jaxlib's
    headers than the one installed. Returns the rebuilt shim.
    """
    root = scratch.make_scratch(work)
    header = root / "third_party/xla_ffi/include/xla/ffi/api/c_api.h"
    text = header.read_text()
    minor = int(re.search(r"#define XLA_FFI_API_MINOR (\d+)", text).group(1))
    header.write_text(text.replace(f"#define XLA_FFI_API_MINOR {minor}", f"#define XLA_FFI_API_MINOR {minor + 1}"))
    # Start from the checkout's build tree, so make recompiles only what includes the FFI headers.
    (root / "build").mkdir()
    for part in ("config.mk", "obj", "jax_aiter_build"):
        src = scratch.REPO / "build" / part
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, root / "build" / part)
    # The FFI headers are -isystem, so -MMD records no dependency on them: drop the shim's objects by hand.
    shutil.rmtree(root / "build/obj/cpu/csrc/ffi/rmsnorm_fwd")
    (root / "build/aiter_build").mkdir(parents=True)
    shutil.copy2(jit_lib, root / "build/aiter_build" / jit_lib.name)
    scratch.run(["make", "build/jax_aiter_build/rmsnorm_fwd_ja.so"], root)
    return root / "build/jax_aiter_build/rmsnorm_fwd_ja.so"


def run_from_checkout(venv: Path, checkout: Path, code: str) -> subprocess.CompletedProcess:
    """Run `code` with the room's interpreter the way a developer would: from the checkout, not isolated."""
    return subprocess.run([str(venv / "bin/python"), "-c", code], cwd=checkout, capture_output=True, text=True)
