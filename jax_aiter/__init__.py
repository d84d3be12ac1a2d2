"""jax-aiter: fused GPU kernels for JAX through XLA FFI.

The ops are imported lazily, so tooling such as ``python -m jax_aiter info``
and ``jax-aiter-fetch-mha`` starts without importing JAX. Type checkers see
the ops' real signatures through the ``TYPE_CHECKING`` imports below, and
only them: the module ``__getattr__`` is hidden from them, so a misspelt name
(``jax_aiter.rms_nrom``) is an error to mypy, not an ``Any``.

``import jax_aiter`` imports nothing but this file: the op table (TOML, dataclasses)
is read on the first public name asked for (tests/faults/test_faults_api.py keeps it so).

A program that uses the ops registers their FFI handlers on first use. A
program that only runs an exported computation (``jax.export.deserialize``)
never calls an op: where jax-aiter is installed, JAX's plugin hook
(jax_aiter/_jax_plugin.py) registers what the program calls; from a source tree
that is not installed, call :func:`register` first.
"""
# No `from __future__ import annotations` and no `typing`: this file imports nothing at run time.

# typing.TYPE_CHECKING without importing typing; type checkers take any name TYPE_CHECKING as true.
TYPE_CHECKING = False
if TYPE_CHECKING:  # the names of _LAZY and _SUBMODULES (a test keeps them equal); `as` marks a re-export (PEP 484)
    from jax_aiter import activation as activation  # a facade module (_SUBMODULES)
    from jax_aiter import mha as mha  # a facade package (_SUBMODULES)
    from jax_aiter import rmsnorm as rmsnorm  # a facade module (_SUBMODULES)
    from jax_aiter.ops.activation import silu_and_mul as silu_and_mul
    from jax_aiter.ops.attention import flash_attn_func as flash_attn_func
    from jax_aiter.ops.export import disabled_checks as disabled_checks
    from jax_aiter.ops.export import register as register
    from jax_aiter.ops.paged import append_kv as append_kv
    from jax_aiter.ops.paged import paged_attention as paged_attention
    from jax_aiter.ops.paged import paged_prefill as paged_prefill
    from jax_aiter.ops.rmsnorm import rms_norm as rms_norm
    from jax_aiter.ops.rmsnorm import rms_norm_with_add as rms_norm_with_add

    __version__: str
    __all__: list[str]
    _LAZY: dict[str, str]

# The export helpers' module; the ops' public functions come from the op table (`api`).
_EXPORT = "jax_aiter.ops.export"
# upstream jax-aiter's facade modules (jax_aiter/rmsnorm.py ...): importable as jax_aiter.<name>, and reachable as
# an attribute after a bare `import jax_aiter`, as upstream's __init__ imports them (loaded on first use here)
_SUBMODULES = ("activation", "mha", "rmsnorm")


def _names() -> dict[str, str]:
    """name -> its module (_LAZY): the op table's public API, then the export helpers; read on first use."""
    table = globals().get("_LAZY")
    if table is None:  # import_module: `from jax_aiter import op_table` would ask __getattr__ first
        import importlib

        op_table = importlib.import_module("jax_aiter.op_table")
        table = globals()["_LAZY"] = {**op_table.public_api(op_table.load()), "register": _EXPORT,
                                      "disabled_checks": _EXPORT}
    return table


if not TYPE_CHECKING:  # hidden from type checkers: they see the imports above, and nothing else
    def __getattr__(name: str) -> object:
        if name == "__version__":  # derived (jax_aiter/_version.py): its one home is pyproject.toml
            from jax_aiter._version import version

            value = version()
        elif name == "_LAZY":
            return _names()
        elif name == "__all__":
            value = sorted(_names())
        elif name in _SUBMODULES:
            import importlib

            return importlib.import_module(f"jax_aiter.{name}")
        elif not name.startswith("__") and name in _names():
            import importlib

            value = getattr(importlib.import_module(_names()[name]), name)
        else:
            raise AttributeError(f"module 'jax_aiter' has no attribute {name!r}")
        globals()[name] = value
        return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_names(), *_SUBMODULES, "__version__", "__all__"})
