"""The op table (jax_aiter/op_table.toml), read and checked: each op's FFI targets, shim, JIT modules and libraries.

The loader registers ops from it; the build derives the Makefile's shim targets, the JIT build's module
list and each wheel variant's libraries from it, so an op is named in one place. The names of the files
an op needs are derived here, and only here: the shim of op X is X_ja.so, the library of JIT module M
is libM.so.
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

TABLE_FILE = "op_table.toml"
SCHEMA = 1
_FIELDS = {"targets": dict, "jit": list, "mha": bool, "fetched": bool, "python": str, "api": list}


class OpTableError(ValueError):
    """The op table cannot be read or breaks a rule; the message names the file, the op and the fix."""


def library(module: str) -> str:
    """The file name of JIT module `module`'s library (so the linker finds it as -l<module>)."""
    return f"lib{module}.so"


@dataclass(frozen=True)
class Op:
    name: str
    targets: tuple[tuple[str, str], ...]  # (FFI target name, handler symbol prefix)
    modules: tuple[str, ...]  # JIT modules whose libraries the shim needs
    mha: bool  # only `make ja_mods` builds its shim (it needs the MHA JIT libraries)
    fetched: bool  # the lite wheel leaves its JIT libraries out; jax-aiter-fetch-mha downloads them
    python: str | None = None  # its public functions' module, jax_aiter/ops/<python>.py
    api: tuple[str, ...] = ()  # the public functions defined there: jax_aiter.<name>

    @property
    def shim(self) -> str:
        return f"{self.name}_ja.so"

    @property
    def jit(self) -> tuple[str, ...]:
        """The JIT libraries the shim names in DT_NEEDED, in load order."""
        return tuple(library(m) for m in self.modules)


def path(root: Path | None = None) -> Path:
    """The op table of the checkout at `root`; without one, the table beside this module (an installed wheel's)."""
    return (root / "jax_aiter" if root else Path(__file__).resolve().parent) / TABLE_FILE


def _op(name: str, row: object, where: Path) -> Op:
    fix = f"fix the row of {name} in {where} (its header says what each field means)"
    if not isinstance(row, dict) or set(row) - set(_FIELDS) or "targets" not in row:
        raise OpTableError(f"{where}: op {name}: a row is a table with `targets` and optionally "
                           f"{', '.join(f for f in _FIELDS if f != 'targets')}; got {row!r}; {fix}")
    wrong = [f for f, kind in _FIELDS.items() if f in row and not isinstance(row[f], kind)]
    targets, modules = row["targets"], row.get("jit", [])
    api = row.get("api", [])
    if wrong or not targets or not all(isinstance(v, str) for v in [*targets.values(), *modules, *api]):
        raise OpTableError(f"{where}: op {name}: {', '.join(wrong) or 'targets/jit/api'} has the wrong type "
                           "(targets: a non-empty table of strings, jit and api: lists of strings, python: a string, "
                           "mha and fetched: true or false); " + fix)
    if row.get("fetched") and not modules:
        raise OpTableError(f"{where}: op {name}: fetched = true but it names no JIT module to fetch; {fix}")
    if bool(api) != bool(row.get("python")):
        raise OpTableError(f"{where}: op {name}: `api` (the public functions) and `python` (their module under "
                           f"jax_aiter/ops) go together; {fix}")
    return Op(name, tuple(targets.items()), tuple(modules), row.get("mha", False), row.get("fetched", False),
              row.get("python"), tuple(api))


def load(root: Path | None = None) -> dict[str, Op]:
    """{op name: Op} in table order, from the checkout at `root` (default: the installed package's table)."""
    where = path(root)
    try:
        data = tomllib.loads(where.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise OpTableError(f"cannot read the op table {where}: {e}; restore it from the repository") from None
    if data.get("schema") != SCHEMA or not isinstance(data.get("ops"), dict):
        raise OpTableError(f"{where}: expected schema = {SCHEMA} and an [ops] table, found schema "
                           f"{data.get('schema')!r}; a newer jax-aiter wrote it, or it was edited by hand")
    ops = {name: _op(name, row, where) for name, row in data["ops"].items()}
    exported = [n for op in ops.values() for n in op.api]
    if twice := sorted({n for n in exported if exported.count(n) > 1}):
        raise OpTableError(f"{where}: {', '.join(twice)} is in the `api` of more than one op; a public name has "
                           "one home: keep it in one row")
    for module, users in _users(ops).items():
        if len({op.fetched for op in users}) > 1:
            raise OpTableError(f"{where}: JIT module {module} is fetched for "
                               f"{', '.join(o.name for o in users if o.fetched)}"
                               f" but packaged for {', '.join(o.name for o in users if not o.fetched)}; a library is "
                               "either in the lite wheel or not: give those rows the same `fetched`")
    return ops


def _users(ops: dict[str, Op]) -> dict[str, list[Op]]:
    out: dict[str, list[Op]] = {}
    for op in ops.values():
        for m in op.modules:
            out.setdefault(m, []).append(op)
    return out


def jit_libraries(ops: dict[str, Op]) -> dict[str, str]:
    """{JIT module: its library} of every module the ops name, in table order."""
    return {m: library(m) for m in _users(ops)}


def fetched_libraries(ops: dict[str, Op]) -> dict[str, str]:
    """{JIT module: its library} of those the lite wheel leaves out and jax-aiter-fetch-mha downloads."""
    return {m: library(m) for m, users in _users(ops).items() if users[0].fetched}


def public_api(ops: dict[str, Op]) -> dict[str, str]:
    """{public function name: the module that defines it}, in table order: what `jax_aiter.<name>` loads."""
    return {n: f"jax_aiter.ops.{op.python}" for op in ops.values() for n in op.api}
