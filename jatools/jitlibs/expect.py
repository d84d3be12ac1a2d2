"""What a wheel expects of the JIT libraries: their sha256/size and build identity, from the record.

The wheel build trusts no JIT library it finds on disk: it checks each against `expectations()` (the record
written with the libraries) before staging and again after reading it back from the wheel. This module
imports no network, compiler or toolchain code: the wheel builder's import closure stays what it packs.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from jatools import config
from jax_aiter import remedies
from jax_aiter.integrity import RECORD_NAME, IntegrityError, verify_entries


def _changed() -> str:
    fix = remedies.build_or_fetch()
    return f"the JIT library changed after its record was written. {fix[0].upper()}{fix[1:]}."


class JitExpectationError(RuntimeError):
    """No usable record of the JIT libraries; the message says how to get one."""


@dataclass(frozen=True)
class JitExpectations:
    source: Path
    identity: dict
    entries: dict[str, dict]  # library file name -> {name, size, sha256}

    def entry(self, name: str) -> dict:
        if name not in self.entries:
            raise JitExpectationError(
                f"{name} has no entry in {self.source} (recorded: {', '.join(sorted(self.entries)) or 'none'}); "
                f"{remedies.build_or_fetch()}")
        return self.entries[name]

    def check_digest(self, name: str, sha256: str, where: str) -> None:
        """Raise IntegrityError when `sha256` (of `name` as found at `where`) differs from the record."""
        want = self.entry(name)["sha256"]
        if sha256 != want:
            raise IntegrityError(f"{where}: sha256 {sha256} does not match {want} recorded in {self.source}; "
                                 f"{_changed()}")

    def verify_folder(self, folder: Path, names: list[str]) -> None:
        """Hash `names` in `folder` (in parallel) against the record; IntegrityError names any difference."""
        entries = [self.entry(n) for n in names]
        try:
            verify_entries(folder, entries)
        except IntegrityError as e:
            raise IntegrityError(f"{e} ({self.source}); {_changed()}") from None


def expectations(settings: config.Settings, source: Path | None = None) -> JitExpectations:
    """The expected JIT libraries: `source` when given (a manifest with the same `identity` and `files` fields
    will do), else the build record in settings.jit_dir, written last, after the libraries."""
    path, fix = source or settings.jit_dir / RECORD_NAME, remedies.build_or_fetch()
    if not path.is_file():
        raise JitExpectationError(
            f"{path} is missing, so the JIT libraries in {settings.jit_dir} have no recorded hashes; {fix}")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise JitExpectationError(f"{path} is not valid JSON ({e}); {fix}") from e
    ident = data.get("identity")
    if not ident:
        modules = ", ".join(sorted(data.get("modules", {})))
        raise JitExpectationError(
            f"{path}: the JIT libraries ({modules}) come from builds with different identities, so no single "
            f"build identity can be baked into a wheel; {fix}")
    entries = {e["name"]: e for e in data.get("files", [])}
    return JitExpectations(source=path, identity=ident, entries=entries)
