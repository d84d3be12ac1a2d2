"""Atomic file writes: a temporary file beside the target, then rename.

A reader sees the old file or the new one, never half of either; an
interrupted write leaves the previous good state.
"""
from __future__ import annotations

import os
from pathlib import Path


def write_text(path: Path, text: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
