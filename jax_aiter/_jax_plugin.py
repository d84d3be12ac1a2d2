"""JAX's plugin hook: a deserialized jax.export program that calls jax-aiter's ops runs without jax_aiter.register().

pyproject.toml names this module in the ``jax_plugins`` entry-point group. When JAX starts its backends
it imports every module of that group and calls its ``initialize()``, in every process where jax-aiter is
installed, whether or not the process uses it, so this one only wraps the lowering rule of
``call_exported`` (the primitive of ``Exported.call``) and imports nothing else. Before JAX lowers a
deserialized program, the wrapper has ``jax_aiter.ops.export.register_used`` register the FFI handlers
(and partitioner) of the ops the program calls; a program that calls none costs a search of its bytes.

Without it, such a program fails with XLA's bare ``No FFI handler registered for ja_...`` unless the process
called ``jax_aiter.register()``, which a process that only deserializes has no reason to know. JAX offers no
public hook at deserialization; this uses its lowering-rule table (``mlir.register_lowering``, the
interface custom_partitioning and every primitive use), for the JAX version jax-aiter pins.
tests/ops/test_export.py runs exported programs in fresh processes that never name jax_aiter.
"""


def _register_used(exported) -> None:
    from jax_aiter.ops import export

    export.register_used(exported)


def initialize() -> None:
    """Wrap call_exported's lowering rule (once) so that it registers what a program calls before lowering it."""
    from jax._src.export import _export
    from jax._src.interpreters import mlir

    entry = mlir._lowerings.get(_export.call_exported_p)
    if entry is None or hasattr(entry.rule, "jax_aiter_wraps"):
        return

    def rule(ctx, *args, exported, **params):
        _register_used(exported)
        return entry.rule(ctx, *args, exported=exported, **params)

    rule.jax_aiter_wraps = entry.rule  # type: ignore[attr-defined]
    mlir.register_lowering(_export.call_exported_p, rule, inline=entry.inline)
