"""jax.export support: register the FFI handlers up front, and the safety checks export must skip.

An exported program holds custom calls to the package's FFI targets. jax.export
refuses to serialize custom calls it does not know to be stable unless told to
(``disabled_checks``), and a process that deserializes the program and calls it
must have the handlers registered, though it never calls an op (which is what
registers them otherwise). Both lists come from the op table
(jax_aiter/op_table.toml).
"""
from __future__ import annotations

from collections.abc import Iterable

import jax

from jax_aiter import _loader


def _ops(ops: str | Iterable[str] | None) -> list[str]:
    """The op names asked for: every op for None, one op for a string (not its letters), else each one."""
    names = list(_loader.OPS) if ops is None else [ops] if isinstance(ops, str) else list(ops)
    unknown = [n for n in names if n not in _loader.OPS]
    if unknown:
        raise ValueError(f"jax_aiter: unknown op(s) {', '.join(unknown)}; the ops are {', '.join(_loader.OPS)} "
                         "(the keys of jax_aiter/op_table.toml)")
    return names


def register(ops: str | Iterable[str] | None = None) -> None:
    """Load the native libraries and register the FFI handlers of `ops` (default: every op).

    Call it before running a deserialized jax.export program in a process that has not called
    the ops itself. Registering is cheap and starts no JAX backend; it is done once per op per
    process, so calling it again is free.

    Parameters
    ----------
    ops : str or iterable of str, optional
        One key, or keys, of the op table: ``rmsnorm_fwd``, ``silu_and_mul``, ``mha_fwd``, ``mha_bwd``.
        A lite wheel whose attention libraries were not fetched can register the others
        with ``register(["rmsnorm_fwd", "silu_and_mul"])``.

    Raises
    ------
    jax_aiter._loader.LibraryNotFoundError
        A library is missing; the message names the command that provides it
        (``jax-aiter-fetch-mha`` for the attention libraries of a lite wheel).
    """
    for op in _ops(ops):
        _loader.ensure_registered(op)


def disabled_checks(ops: str | Iterable[str] | None = None) -> list[jax.export.DisabledSafetyCheck]:
    """What to pass as ``jax.export.export(f, disabled_checks=...)`` for a program that uses the ops.

    One ``DisabledSafetyCheck.custom_call`` per FFI target of `ops` (default: every op), so
    export accepts the package's custom calls and still refuses any other unknown one.
    The reloading process must have the same jax-aiter (the handlers' ABI) and call
    :func:`register` before it runs the program.
    """
    return [jax.export.DisabledSafetyCheck.custom_call(target)
            for op in _ops(ops) for target, _ in _loader.OPS[op].targets]
