"""The ops (one module each) and, as upstream jax-aiter's `jax_aiter.ops` has them, their public functions:
`jax_aiter.ops.<name>` for each name of the op table's `api` (jax_aiter/op_table.toml), the same functions as
`jax_aiter.<name>`; among them upstream's serving API, `jax_aiter.ops.append_kv`, `paged_attention` and
`paged_prefill`. Loaded on first use, so importing one op's module loads no other."""
from __future__ import annotations

import importlib

TYPE_CHECKING = False
if TYPE_CHECKING:
    from jax_aiter.ops.paged import append_kv as append_kv
    from jax_aiter.ops.paged import paged_attention as paged_attention
    from jax_aiter.ops.paged import paged_prefill as paged_prefill


def __getattr__(name: str) -> object:
    op_table = importlib.import_module("jax_aiter.op_table")
    module = op_table.public_api(op_table.load()).get(name)
    if module is None or name.startswith("__"):
        raise AttributeError(f"module 'jax_aiter.ops' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
