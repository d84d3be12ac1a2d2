"""What the JIT libraries must be: their sha256/size and build identity, from the record written with them.

The wheel build trusts no JIT library it finds on disk: it checks each against
these entries before staging and again after reading it back from the finished
wheel. `load()` is the single place that decides where the expectations come
from; today that is build_jit.py's `build/aiter_build/build_record.json`, which
is written last, after the libraries. A manifest with the same `identity` and
`files` ({name, size, sha256}) fields can be pointed at with `source=`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from jatools import config
from jax_aiter.integrity import RECORD_NAME, IntegrityError, verify_entries

FIX = "rebuild the JIT libraries with `python3 jax_aiter/jit/build_jit.py` or fetch published ones with `invoke jit.fetch`"


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
                f"{FIX}")
        return self.entries[name]

    def check_digest(self, name: str, sha256: str, where: str) -> None:
        """Raise IntegrityError when `sha256` (of `name` as found at `where`) differs from the record."""
        want = self.entry(name)["sha256"]
        if sha256 != want:
            raise IntegrityError(
                f"{where}: sha256 {sha256} does not match {want} recorded in {self.source}; the JIT library "
                f"changed after its record was written. {FIX[0].upper()}{FIX[1:]}.")

    def verify_folder(self, folder: Path, names: list[str]) -> None:
        """Hash `names` in `folder` (in parallel) against the record; IntegrityError names any difference."""
        entries = [self.entry(n) for n in names]
        try:
            verify_entries(folder, entries)
        except IntegrityError as e:
            raise IntegrityError(f"{e} ({self.source}); the JIT library changed after its record was written. "
                                 f"{FIX[0].upper()}{FIX[1:]}.") from None


def load(settings: config.Settings, source: Path | None = None) -> JitExpectations:
    """The expected JIT libraries: `source` when given, else the build record in settings.jit_dir."""
    path = source or settings.jit_dir / RECORD_NAME
    if not path.is_file():
        raise JitExpectationError(
            f"{path} is missing, so the JIT libraries in {settings.jit_dir} have no recorded hashes; {FIX}")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise JitExpectationError(f"{path} is not valid JSON ({e}); {FIX}") from e
    ident = data.get("identity")
    if not ident:
        modules = ", ".join(sorted(data.get("modules", {})))
        raise JitExpectationError(
            f"{path}: the JIT libraries ({modules}) come from builds with different identities, so no single "
            f"build identity can be baked into a wheel; {FIX}")
    entries = {e["name"]: e for e in data.get("files", [])}
    return JitExpectations(source=path, identity=ident, entries=entries)
