"""How the paged KV cache's FFI calls split over a device mesh (_partition.py): Shardy rules and planners.

The pools are the large arrays, so a plan never moves them: it follows their sharding.

- kv heads split n ways (n divides both the pools' kv heads and the query heads): every call runs on its shard's
  heads, with the query heads of those kv heads (GQA groups stay whole: a shard's query heads are the groups of
  its kv heads), and the outputs stay split by heads. No collective: each shard's pools, queries and outputs are
  its own. A query that is not split that way is sliced to the shard's heads (no data moves).
- pages split (append_kv only): each shard writes the tokens whose slot is in its pages, shifted to its own slots
  (the others skipped), so a pool split by pages is written in place with no collective either. Attention over a
  page-split pool gathers the pools (a query's softmax needs every key).
- everything else (tokens per page, head_dim, the query tokens, whose sequences the global page table and
  cu_seqlens_q describe) is gathered before the call, as for a custom call without a rule.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import jax.numpy as jnp
from jax.interpreters import mlir

from jax_aiter.ops._partition import Entry, Operand, Plan, axes_size, shard_index

# ja_paged_attn's operands and results and each dimension's role: t query tokens, h query heads, k kv heads, d
# head_dim, e head_dim of v, p pages, s tokens per page, n sequences; None: none (metadata, a one-value descale).
ATTN_OPERANDS = ("q", "k_pool", "v_pool", "cu_q", "indptr", "indices", "last", "qd", "kd", "vd")
ATTN_RESULTS = ("out", "lse")
APPEND_OPERANDS = ("k_new", "v_new", "slots", "k_scale", "v_scale", "k_pool", "v_pool")
APPEND_RESULTS = ("k_pool", "v_pool")
# The query heads h are the compound (k g) of Shardy's rule: kv head major, the GQA group minor (query head h reads
# kv head h // g), so a split of the pools' kv heads propagates to the query and the output, and back.
ROLES = {"q": ("t", "h", "d"), "k_pool": ("p", "s", "k", "d"), "v_pool": ("p", "s", "k", "e"),
         "qd": ("n", "k"), "kd": ("n", "k"), "vd": ("n", "k"), "out": ("t", "h", "e"), "lse": ("h", "t"),
         "k_new": ("t", "k", "d"), "v_new": ("t", "k", "e")}
_SHARDABLE = {"attn": ("k",), "append": ("p", "k")}


def _roles(name: str, shape: Sequence[int]) -> tuple:
    roles = ROLES.get(name, ())
    return roles if len(roles) == len(shape) else (None,) * len(shape)


def rule(kind: str) -> Callable:
    """The Shardy rule of ja_paged_attn (kind "attn") or ja_append_kv ("append"): heads (and for append_kv pages)
    may stay sharded; every other dimension needs replication. The planner decides which split runs."""
    names, results = (ATTN_OPERANDS, ATTN_RESULTS) if kind == "attn" else (APPEND_OPERANDS, APPEND_RESULTS)

    def make(*args):
        operand_types, result_types = args[-2], args[-1]
        shapes = [tuple(mlir.ir.RankedTensorType(t).shape) for t in operand_types]
        out_shapes = [tuple(mlir.ir.RankedTensorType(t).shape) for t in result_types]
        sizes: dict[str, int] = {}
        for name, shape in zip(names, shapes):
            for r, n in zip(_roles(name, shape), shape):
                if r is not None:
                    sizes.setdefault(r, n)
        order: list[str] = []
        replicated: set[str] = set()
        sizes_kw: dict[str, int] = {}
        group = sizes["h"] // sizes["k"] if kind == "attn" and sizes.get("k") else 0

        def factor(r, n) -> str:
            if r == "h" and n == sizes.get("h") and group and sizes["k"] * group == n:
                sizes_kw["g"] = group
                for f in ("k", "g"):
                    if f not in order:
                        order.append(f)
                replicated.add("g")
                return "(k g)"
            f = r if r is not None and n == sizes.get(r) else f"x{len(order)}"
            if f not in _SHARDABLE[kind]:
                replicated.add(f)
            if f not in order:
                order.append(f)
            return f

        def factors(name: str, shape: tuple) -> str:
            return " ".join(factor(r, n) for r, n in zip(_roles(name, shape), shape))

        text = ", ".join(factors(n, s) for n, s in zip(names, shapes)) + " -> " + \
            ", ".join(factors(n, s) for n, s in zip(results, out_shapes))
        return text, {**sizes_kw, "need_replication_factors": tuple(f for f in order if f in replicated)}
    return make


def _divides(mesh, entry: Entry, *sizes: int) -> bool:
    n = axes_size(mesh, entry) if entry is not None else 1
    return n > 1 and all(s % n == 0 for s in sizes)


def _spec(name: str, shape: Sequence[int], entries: dict) -> tuple:
    return tuple(entries.get(r) if r is not None else None for r in _roles(name, shape))


def attn_planner(call: Callable) -> Callable[..., Plan]:
    """The plan of ja_paged_attn: the pools' kv-head split where it divides the query heads too, else the query's
    head split where it divides the kv heads, else nothing split."""
    def plan(cfg, mesh, operands: list[Operand], refine: bool) -> Plan:
        q, pool = operands[0], operands[1]
        heads, kv_heads = q.shape[1], pool.shape[2]
        entry = next((e for e in (pool.spec[2], q.spec[1]) if e is not None and _divides(mesh, e, heads, kv_heads)),
                     None)
        entries = {"h": entry, "k": entry}
        specs = [_spec(n, o.shape, entries) for n, o in zip(ATTN_OPERANDS, operands)]
        out_shapes = [(q.shape[0], heads, operands[2].shape[3])] + ([(heads, q.shape[0])] if cfg.lse else [])
        results = [_spec(n, s, entries) for n, s in zip(ATTN_RESULTS, out_shapes)]
        return Plan(specs, results, lambda *args: call(cfg, *args))
    return plan


def append_planner(call: Callable) -> Callable[..., Plan]:
    """The plan of ja_append_kv: the pools' kv-head split (k_new and v_new follow it) and page split as they
    are; a shard of a page split writes the tokens of its own pages (slots shifted, the others skipped)."""
    def plan(mesh, operands: list[Operand], refine: bool) -> Plan:
        pool = operands[5]
        pages_entry, heads_entry = pool.spec[0], pool.spec[2]
        entries = {"p": pages_entry if _divides(mesh, pages_entry, pool.shape[0]) else None,
                   "k": heads_entry if _divides(mesh, heads_entry, pool.shape[2]) else None}
        specs = [_spec(n, o.shape, entries) for n, o in zip(APPEND_OPERANDS, operands)]
        results = [specs[5], specs[6]]
        if entries["p"] is None:
            return Plan(specs, results, call)

        def body(k_new, v_new, slots, k_scale, v_scale, k_pool, v_pool):
            local = k_pool.shape[0] * k_pool.shape[1]  # this shard's slots
            first = shard_index(entries["p"]) * local
            inside = (slots >= first) & (slots < first + local)
            slots = jnp.where(inside, slots - first, -1).astype(slots.dtype)
            return call(k_new, v_new, slots, k_scale, v_scale, k_pool, v_pool)
        return Plan(specs, results, body)
    return plan
