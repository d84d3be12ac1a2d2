"""jax.export support: the safety checks export must skip, and what a process running a deserialized program needs.

An exported program holds custom calls to the package's FFI targets, and, where it spans several devices
under Auto mesh axes, to ``ja_partitioned`` (an op that the compiling process partitions:
_exported_partition.py). jax.export refuses to serialize custom calls it does not know to be stable unless
told to (`disabled_checks`), and the process that runs the deserialized program needs the FFI handlers and
that partitioner, though it never calls an op (which is what registers them otherwise): `register` does
it, and so does `register_used`, which JAX runs for an installed jax-aiter before it lowers a deserialized
program (jax_aiter/_jax_plugin.py). The lists of targets come from the op table (jax_aiter/op_table.toml).
This module does not import the native loader until it registers something: the plugin imports it in
every process that runs an exported program.
"""
from __future__ import annotations

import functools
from collections.abc import Iterable

import jax

from jax_aiter import op_table
from jax_aiter.ops import _exported_partition


@functools.cache
def _table() -> dict[str, op_table.Op]:
    return op_table.load()


def _ops(ops: str | Iterable[str] | None) -> list[str]:
    """The op names asked for: every op for None, one op for a string (not its letters), else each one."""
    table = _table()
    names = list(table) if ops is None else [ops] if isinstance(ops, str) else list(ops)
    unknown = [n for n in names if n not in table]
    if unknown:
        raise ValueError(f"jax_aiter: unknown op(s) {', '.join(unknown)}; the ops are {', '.join(table)} "
                         "(the keys of jax_aiter/op_table.toml)")
    return names


def register(ops: str | Iterable[str] | None = None) -> None:
    """Load the native libraries and register the FFI handlers of `ops` (default: every op), and the partitioner of
    ops exported for several devices.

    An installed jax-aiter does this by itself for a deserialized jax.export program: JAX calls
    jax-aiter's plugin hook, which registers the ops the program calls before JAX compiles it. Call
    ``register`` where that hook is absent (jax_aiter imported from a source tree that is not pip-installed),
    or to load the libraries up front and fail early. Without either, a reloaded program fails with XLA's
    ``No FFI handler registered for ja_...``. Registering is cheap and starts no JAX backend; it is done
    once per op per process, so calling it again is free.

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
    from jax_aiter import _loader

    names = _ops(ops)
    _exported_partition.install()
    for op in names:
        _loader.ensure_registered(op)


def disabled_checks(ops: str | Iterable[str] | None = None) -> list[jax.export.DisabledSafetyCheck]:
    """What to pass as ``jax.export.export(f, disabled_checks=...)`` for a program that uses the ops.

    One ``DisabledSafetyCheck.custom_call`` per FFI target of `ops` (default: every op), and one for
    ``ja_partitioned`` (an op of a program for several devices, partitioned where the program is compiled),
    so export accepts the package's custom calls and still refuses any other unknown one. The reloading
    process must have the same jax-aiter (the handlers' ABI and the ops' partitioning).
    """
    return [jax.export.DisabledSafetyCheck.custom_call(target)
            for op in _ops(ops) for target, _ in _table()[op].targets] + [
        jax.export.DisabledSafetyCheck.custom_call(_exported_partition.TARGET)]


def register_used(exported: jax.export.Exported) -> list[str]:
    """Register what a deserialized program calls: the FFI handlers of the ops whose targets it names and, if it
    holds exported partitioned ops, their partitioner. Returns the ops registered.

    JAX runs it (jax_aiter/_jax_plugin.py) before it lowers a deserialized program; for a program that names
    none of the package's targets it costs a search of the serialized module's bytes. A name found in the bytes
    that is no custom call of the program (a function's name in a location, say) is registered if it can be,
    and ignored if its library is missing; a library missing for a target the program does call raises
    LibraryNotFoundError naming the program, the op and the command that provides the library.
    """
    blob = exported.mlir_module_serialized
    if _exported_partition.TARGET.encode() in blob:
        _exported_partition.install()
    named = [op for op, spec in _table().items() if any(t.encode() in blob for t, _ in spec.targets)]
    if not named:
        return []
    from jax_aiter import _loader

    registered = []
    for op in named:
        try:
            _loader.ensure_registered(op)
        except _loader.LibraryNotFoundError as e:
            text = exported.mlir_module()
            called = [t for t, _ in _table()[op].targets if f"custom_call @{t}(" in text]
            if not called:
                continue
            raise _loader.LibraryNotFoundError(
                f"jax_aiter: the deserialized program {exported.fun_name!r} calls {', '.join(called)} "
                f"(jax_aiter's {op}), whose library is missing: {e}") from None
        registered.append(op)
    return registered
