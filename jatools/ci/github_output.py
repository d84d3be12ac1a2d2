"""Step outputs for GitHub Actions: `name=value` lines appended to the file $GITHUB_OUTPUT names.

Outside a workflow (the variable unset or empty) nothing is written.
"""
from __future__ import annotations

import os


def append(values: dict[str, str], path: str | None = None) -> None:
    """Append one `name=value` line per entry to `path` (default: $GITHUB_OUTPUT), when there is one."""
    target = path if path is not None else os.environ.get("GITHUB_OUTPUT")
    if not target:
        return
    with open(target, "a") as fh:
        fh.write("".join(f"{k}={v}\n" for k, v in values.items()))
