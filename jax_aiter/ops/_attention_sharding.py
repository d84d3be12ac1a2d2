"""How flash attention's FFI calls split over a device mesh: the planners and Shardy rules (_partition.py).

Every operand and result of ja_mha_fwd / ja_mha_bwd is named, and each of its
dimensions has a *role*:

    b   batch             sq  query sequence      sk  key sequence
    hq  query heads       hk  kv heads            d   head_dim of q, k     e  head_dim of v, o

The rule for an operand follows from its roles (ROLES), so an operand added to the
calls needs a line there and nothing else, unless the kernel must know where its
shard sits (below):

- a dimension whose size is the role's full size (q's batch, q's heads ...) is
  sharded as that role is; one of another size (1: broadcast, as rows [1,3,sq] or
  alibi [1,hq]) and every dimension of an absent operand (shape (0,)) stay
  replicated, as does every dimension without a role (rows' 3, the seed's 4);
- so an operand whose leading dim is the batch shards with the batch; one of batch
  size 1 or 0 is replicated.

To add an operand (attention-api): insert its name where it sits in the FFI call's
operand list (FWD_OPERANDS / BWD_OPERANDS; results: FWD_RESULTS / BWD_RESULTS) and
its roles in ROLES. Values that depend on the shard's position must be made local
in `_localise` (called on every shard with the shard's arrays): dropout's seed
words (batch offset += shard_index(batch) * local batch, head offset likewise for
the query heads), and the backward's cols [rb,2,sk] (query-row indices: minus the
shard's first row when the query sequence is split). Row-wise values (rows
[rb,3,sq]: key indices per query row) are global already and need nothing.

The layout, from q's proposed sharding (`_layout`):

- batch: kept sharded, for every operand with a full batch dimension.
- query heads split n ways (heads_q % n == 0; otherwise the heads are gathered):
  * n divides heads_kv: kv heads split with their query groups;
  * n is a multiple of heads_kv (MQA included): a shard's query heads all read one
    kv head. Auto axes: the devices are split into kv groups (a sub-axis where one
    mesh axis holds both), K/V split over the kv part, and dK/dV summed over each
    group: the all-reduce of one kv head's gradient plain JAX does. Explicit axes
    (no sub-axes there): K/V whole on every shard, each takes its kv head, and
    dK/dV are summed over all the heads' devices;
  * otherwise: K/V whole, each shard takes the kv head of each query head it holds
    and runs them as multi-head attention; dK/dV summed over the heads' devices.
- query sequence split (context parallelism): kept split; K/V are gathered along
  their sequence, q never is. Each shard attends its rows to every key, and dK/dV
  are summed over the sequence's devices. With a causal mask the shard's rows sit at
  an offset the kernel's bottom-right aligned mask does not know: the keys are taken
  in blocks of the shard's row count, blocks left of the shard's diagonal fully,
  the diagonal block causally, the rest not at all, merged by their log-sum-exp (and
  the backward per block with the merged lse, as ring attention does). That needs
  seq_k - seq_q to be a multiple of the block; otherwise the query sequence is
  gathered too (docs/transformations.md lists the cost).
- key sequence and head dims: gathered (a query's softmax needs every key).
- the features of attention v2 (_sequence_split): a mask given by rows, and a bias, split with the query rows;
  dropout gathers the query sequence (its draw is by global row); ALiBi does with the plain or causal mask (its
  diagonal is the row's global position), as a bias does with the causal one (no blockwise bias).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import jax
import jax.numpy as jnp
from jax.interpreters import mlir

from jax_aiter.ops import _partition, _sharding
from jax_aiter.ops._attn_mask import MASK_CAUSAL, MASK_NONE, MASK_ROWS
from jax_aiter.ops._partition import (
    Entry,
    Operand,
    Plan,
    axes_size,
    axis_names,
    entry_of,
    shard_index,
)

FWD_OPERANDS = ("q", "k", "v", "rows", "alibi", "bias", "seed")
FWD_RESULTS = ("o", "lse")
BWD_OPERANDS = ("q", "k", "v", "o", "do", "lse", "rows", "cols", "alibi", "bias", "seed")
BWD_RESULTS = ("dq", "dk", "dv", "dbias")

ROLES: dict[str, tuple] = {
    "q": ("b", "sq", "hq", "d"), "dq": ("b", "sq", "hq", "d"),
    "k": ("b", "sk", "hk", "d"), "dk": ("b", "sk", "hk", "d"),
    "v": ("b", "sk", "hk", "e"), "dv": ("b", "sk", "hk", "e"),
    "o": ("b", "sq", "hq", "e"), "do": ("b", "sq", "hq", "e"),
    "lse": ("b", "hq", "sq"),
    # attention v2 (attention.py): rows [1 or b, 3, sq] (key indices per query row: global already), cols
    # [1 or b, 2, sk] (query-row indices: made local in _localise), ALiBi [1 or b, hq], the bias and its gradient
    # [1 or b, 1 or hq, sq, sk], the dropout seed [4] (its batch and head offsets made local in _localise)
    "rows": ("b", None, "sq"), "cols": ("b", None, "sk"), "alibi": ("b", "hq"),
    "bias": ("b", "hq", "sq", "sk"), "dbias": ("b", "hq", "sq", "sk"), "seed": (None,),
}
# Shardy factor of each role; the roles never sharded (need_replication) are gathered before the kernel.
_FACTORS = {"b": "b", "sq": "s", "sk": "t", "hq": "h", "hk": "k", "d": "d", "e": "e"}
_REPLICATED = ("sk", "d", "e")


@dataclass(frozen=True)
class Layout:
    """One call's split: the entry of each shardable role, and what the body does about the heads and the
    sequence. kv_pick: None (K/V heads as given), "one" (take the one kv head of this shard's query heads)
    or "each" (take the kv head of every query head); kv_sum: the axes dK/dV are partial sums over;
    blockwise: causal with the query sequence split (per key block)."""
    entries: dict
    sizes: dict
    kv_pick: str | None
    kv_sum: tuple[str, ...]
    blockwise: bool

    def spec(self, name: str, shape: Sequence[int]) -> tuple:
        roles = ROLES[name]
        if len(shape) != len(roles):  # an absent operand, shape (0,)
            return (None,) * len(shape)
        return tuple(self.entries.get(r) if r is not None and n == self.sizes.get(r) else None
                     for r, n in zip(roles, shape))


def _heads(mesh, entry: Entry, heads_q: int, heads_kv: int, refine: bool):
    """(mesh, query heads entry, kv heads entry, kv_pick, axes of the kv groups) for q's heads entry."""
    n = axes_size(mesh, entry)
    if n == 1 or heads_q % n:
        return mesh, None, None, None, ()
    if heads_kv % n == 0:
        return mesh, entry, entry, None, ()
    if n % heads_kv == 0:
        split = _partition.split_entry(mesh, entry, heads_kv, refine)
        if split is not None:
            mesh, outer, inner = split
            return mesh, entry_of(axis_names(outer) + axis_names(inner)), outer, None, axis_names(inner)
        return mesh, entry, None, "one", axis_names(entry)
    return mesh, entry, None, "each", axis_names(entry)


def _sequence_split(cfg) -> str:
    """How a split query sequence runs with this call's features: "rows" (each shard its own rows: the mask,
    ALiBi's diagonal and the bias are given per row; cols are made local), "blockwise" (the causal mask, per key
    block), or "gather" (the sequence is gathered: dropout draws by global row index, which a shard does not know,
    and ALiBi or a bias with the causal mask, whose diagonal a block does not know)."""
    if cfg.dropout:
        return "gather"
    if cfg.mask == MASK_ROWS:
        return "rows"
    if cfg.mask == MASK_CAUSAL:
        return "gather" if cfg.alibi or cfg.bias else "blockwise"
    return "gather" if cfg.alibi else "rows"


def _layout(cfg, mesh, operands: dict[str, Operand], refine: bool):
    q, k = operands["q"], operands["k"]
    batch, seq_q, heads_q, _ = q.shape
    seq_k, heads_kv = k.shape[1], k.shape[2]
    b_entry, s_entry, h_entry, _ = q.spec
    mesh, qh, kvh, pick, groups = _heads(mesh, h_entry, heads_q, heads_kv, refine)
    ns = axes_size(mesh, s_entry)
    blockwise = False
    how = _sequence_split(cfg)
    if ns > 1 and how == "gather":
        s_entry, ns = None, 1
    if ns > 1 and how == "blockwise":
        rows = seq_q // ns
        blockwise = seq_k >= seq_q and (seq_k - seq_q) % rows == 0
        if not blockwise:
            s_entry, ns = None, 1
    if ns == 1:
        s_entry = None
    entries = {"b": b_entry, "sq": s_entry, "hq": qh, "hk": kvh}
    sizes = {"b": batch, "sq": seq_q, "hq": heads_q, "sk": seq_k, "hk": heads_kv}
    return mesh, Layout(entries, sizes, pick, groups + axis_names(s_entry), blockwise)


def _localise(layout: Layout, arrays: dict) -> dict:
    """The shard's operands as the kernel takes them: K/V's kv heads for this shard's query heads; the dropout
    seed's batch and head offsets moved to this shard's first batch row and query head (so a shard draws the
    whole array's mask); the backward's cols (query-row indices) relative to this shard's first row."""
    out = dict(arrays)
    q = arrays["q"]
    if arrays["seed"].shape[0]:
        first_b = shard_index(layout.entries["b"]) * q.shape[0]
        first_h = shard_index(layout.entries["hq"]) * q.shape[2]
        offsets = jnp.stack([jnp.zeros((), jnp.uint32), jnp.zeros((), jnp.uint32),
                             jnp.asarray(first_b, jnp.uint32), jnp.asarray(first_h, jnp.uint32)])
        out["seed"] = arrays["seed"] + offsets
    if "cols" in arrays and arrays["cols"].shape[0] and layout.entries["sq"] is not None:
        first = shard_index(layout.entries["sq"]) * q.shape[1]
        out["cols"] = jnp.clip(arrays["cols"] - first, 0, q.shape[1]).astype(jnp.int32)
    if layout.kv_pick is None:
        return out
    heads = _kv_index(layout, arrays["q"].shape[2])
    for name in ("k", "v"):
        x = arrays[name]
        out[name] = (jax.lax.dynamic_slice_in_dim(x, heads[0], 1, axis=2) if layout.kv_pick == "one"
                     else jnp.take(x, heads, axis=2))
    return out


def _kv_index(layout: Layout, local_heads_q: int):
    """The kv head each of this shard's query heads reads (global index)."""
    group = layout.sizes["hq"] // layout.sizes["hk"]
    first = shard_index(layout.entries["hq"]) * local_heads_q
    return (first + jnp.arange(local_heads_q)) // group


def _put_kv(layout: Layout, grad, like, local_heads_q: int):
    """dK or dV of the kv heads this shard took, scattered into zeros of the whole K/V (each shard then
    holds a partial sum over the query heads reading each kv head)."""
    if layout.kv_pick is None:
        return grad
    heads = _kv_index(layout, local_heads_q)
    zeros = jnp.zeros(like.shape, grad.dtype)
    if layout.kv_pick == "one":
        return jax.lax.dynamic_update_slice_in_dim(zeros, grad, heads[0], axis=2)
    return zeros.at[:, :, heads].add(grad)


def _blocks(layout: Layout, x, rows: int):
    """K or V of a causal split query sequence in key blocks of the shard's `rows` ([nb, b, rows, h, d]), and
    the index of this shard's diagonal block."""
    nb = x.shape[1] // rows
    diag = (layout.sizes["sk"] - layout.sizes["sq"]) // rows + shard_index(layout.entries["sq"])
    return x.reshape(x.shape[0], nb, rows, *x.shape[2:]).swapaxes(0, 1), diag


def _kind(j, diag):
    """0: the block is left of the diagonal (every row sees it), 1: the diagonal block (causal), 2: right of it."""
    return jnp.where(j < diag, 0, jnp.where(j == diag, 1, 2))


def _blockwise_fwd(fwd_call: Callable, cfg, layout: Layout, q, k, v, *absent):
    """The causal forward of a split query sequence: per key block, left of the diagonal without a mask, the
    diagonal block causal (absent: the other operands' empty placeholders: _sequence_split allows none)."""
    full, diagonal = replace(cfg, mask=MASK_NONE), replace(cfg, mask=MASK_CAUSAL)
    b, rows, h, _ = q.shape
    (kb, diag), (vb, _) = _blocks(layout, k, rows), _blocks(layout, v, rows)
    o_shape = q.shape[:3] + v.shape[3:]

    def step(carry, xs):
        acc, lse = carry
        j, kj, vj = xs
        o_j, lse_j = jax.lax.switch(_kind(j, diag), [
            lambda: tuple(fwd_call(full, q, kj, vj, *absent)),
            lambda: tuple(fwd_call(diagonal, q, kj, vj, *absent)),
            lambda: _sharding.vary_like(q, kj, vj, jnp.zeros(o_shape, q.dtype),
                                        jnp.full((b, h, rows), -jnp.inf, jnp.float32))[3:],
        ])
        new = jnp.logaddexp(lse, lse_j)
        safe = jnp.where(jnp.isfinite(new), new, 0.0)

        def weight(x):  # [b, h, rows] -> [b, rows, h, 1]
            return jnp.exp(x - safe).transpose(0, 2, 1)[..., None]
        return (acc * weight(lse) + o_j.astype(jnp.float32) * weight(lse_j), new), None

    init = _sharding.vary_like(q, k, v, jnp.zeros(o_shape, jnp.float32),
                               jnp.full((b, h, rows), -jnp.inf, jnp.float32))[3:]
    (acc, lse), _ = jax.lax.scan(step, init, (jnp.arange(kb.shape[0]), kb, vb))
    return acc.astype(q.dtype), lse


def _blockwise_bwd(bwd_call: Callable, cfg, layout: Layout, q, k, v, o, do, lse, *absent):
    full, diagonal = replace(cfg, mask=MASK_NONE), replace(cfg, mask=MASK_CAUSAL)
    rows = q.shape[1]
    (kb, diag), (vb, _) = _blocks(layout, k, rows), _blocks(layout, v, rows)

    def step(dq, xs):
        j, kj, vj = xs
        dq_j, dk_j, dv_j = jax.lax.switch(_kind(j, diag), [
            lambda: tuple(bwd_call(full, q, kj, vj, o, do, lse, *absent)[:3]),
            lambda: tuple(bwd_call(diagonal, q, kj, vj, o, do, lse, *absent)[:3]),
            lambda: _sharding.vary_like(q, kj, vj, o, do, lse, jnp.zeros(q.shape, q.dtype),
                                        jnp.zeros(kj.shape, kj.dtype), jnp.zeros(vj.shape, vj.dtype))[6:],
        ])
        return dq + dq_j.astype(jnp.float32), (dk_j, dv_j)

    init = _sharding.vary_like(q, k, v, o, do, lse, jnp.zeros(q.shape, jnp.float32))[6]
    dq, (dkb, dvb) = jax.lax.scan(step, init, (jnp.arange(kb.shape[0]), kb, vb))

    def unblock(x):  # [nb, b, rows, h, d] -> [b, nb * rows, h, d]
        return x.swapaxes(0, 1).reshape(x.shape[1], -1, *x.shape[3:])
    return dq.astype(q.dtype), unblock(dkb), unblock(dvb), jnp.zeros((0,), jnp.float32)


def planner(call: Callable, backward: bool) -> Callable[..., Plan]:
    """The planner (_partition.Planner) of the forward or backward FFI call `call(cfg, *operands)` (cfg:
    attention.Config, the calls' static arguments)."""
    names, results = (BWD_OPERANDS, BWD_RESULTS) if backward else (FWD_OPERANDS, FWD_RESULTS)

    def plan(cfg, mesh, operands: list[Operand], refine: bool) -> Plan:
        ops = dict(zip(names, operands))
        mesh, layout = _layout(cfg, mesh, ops, refine)
        arg_specs = [layout.spec(n, ops[n].shape) for n in names]
        shapes = _result_shapes(ops, backward, cfg.dbias)
        out_specs = [layout.spec(n, shapes[n]) for n in results]

        def body(*arrays):
            # an absent operand is made here, not taken from the caller: XLA's CPU compiler crashed (JAX 0.11)
            # on a shape-(0,) operand crossing the shard_map of Explicit axes
            given = {n: jnp.zeros((0,), a.dtype) if a.shape == (0,) else a for n, a in zip(names, arrays)}
            a = _localise(layout, given)
            args = [a[n] for n in names]
            if not backward:
                if layout.blockwise:
                    return _blockwise_fwd(call, cfg, layout, *args)
                return tuple(call(cfg, *args))
            if layout.blockwise:
                dq, dk, dv, dbias = _blockwise_bwd(call, cfg, layout, *args)
            else:
                dq, dk, dv, dbias = call(cfg, *args)
            heads = given["q"].shape[2]
            dk, dv = _put_kv(layout, dk, given["k"], heads), _put_kv(layout, dv, given["v"], heads)
            if layout.kv_sum:
                dk, dv = jax.lax.psum((dk, dv), layout.kv_sum)
            if dbias.shape == (0,):  # no bias gradient: an empty result, replicated (not the kernel's, per shard)
                dbias = jnp.zeros((0,), dbias.dtype)
            return dq, dk, dv, dbias

        return Plan(arg_specs, out_specs, body, mesh)
    return plan


def segment_rows_planner(rows_of: Callable) -> Callable[..., Plan]:
    """The planner of the ROWS mask from segment ids, `rows_of(left, right, ids)` ([batch, seq] -> [batch, 3, seq]):
    the batch and the sequence keep the ids' split, so each shard gets the rows of its own query rows, as the
    forward kernel takes them. A row's document bounds need the ids of the whole sequence: a split sequence is
    all-gathered in the body (one all-gather of the int32 ids, as plain JAX's mask `ids[:, :, None] == ids[:,
    None, :]` gathers them), and the shard keeps its rows. (Written in jax.numpy and left to XLA, the runs' bounds
    (a shift and a running max and min along the split axis) cost two all-gathers and two collective-permutes.)"""
    def plan(left: int, right: int, mesh, operands: list[Operand], refine: bool) -> Plan:
        b_entry, s_entry = operands[0].spec
        if axes_size(mesh, s_entry) == 1:
            s_entry = None

        def body(ids):
            if s_entry is None:
                return rows_of(left, right, ids)
            rows = rows_of(left, right, jax.lax.all_gather(ids, axis_names(s_entry), axis=1, tiled=True))
            return jax.lax.dynamic_slice_in_dim(rows, shard_index(s_entry) * ids.shape[1], ids.shape[1], axis=2)

        return Plan([(b_entry, s_entry)], [(b_entry, None, s_entry)], body)
    return plan


def segment_rows_rule(left: int, right: int, mesh, operand_types, result_types):
    """ids [b, s] -> rows [b, 3, s]: the rows follow the ids' batch and sequence (the kernel's query rows)."""
    return "b s -> b k s", {"need_replication_factors": ("k",)}


def cols_planner(cols_of: Callable) -> Callable[..., Plan]:
    """The planner of the backward's cols from the ROWS mask, `cols_of(seq_k, rows)` ([rb, 3, sq] -> [rb, 2, sk]):
    the batch keeps its split; cols are whole along the keys, as the backward kernel takes them (its key sequence is
    gathered). A key's query rows need every row's bounds: a split query sequence's lo and hi are all-gathered in the
    body (one all-gather of int32 [rb, 2, sq]). (Left to XLA, the scatter-add over the split rows costs two
    collective-permutes, and Explicit axes refuse it.)"""
    def plan(seq_k: int, mesh, operands: list[Operand], refine: bool) -> Plan:
        b_entry, _, s_entry = operands[0].spec
        if axes_size(mesh, s_entry) == 1:
            s_entry = None

        def body(rows):
            if s_entry is not None:
                rows = jax.lax.all_gather(rows[:, :2], axis_names(s_entry), axis=2, tiled=True)
            return cols_of(seq_k, rows)

        return Plan([(b_entry, None, s_entry)], [(b_entry, None, None)], body)
    return plan


def cols_rule(seq_k: int, mesh, operand_types, result_types):
    """rows [b, 3, sq] -> cols [b, 2, sk]: cols follow the rows' batch and are whole along their own axes."""
    return "b k s -> b m t", {"need_replication_factors": ("k", "m", "t")}


def _result_shapes(ops: dict[str, Operand], backward: bool, dbias: bool = False) -> dict[str, tuple]:
    q, k, v = ops["q"].shape, ops["k"].shape, ops["v"].shape
    if backward:
        return {"dq": q, "dk": k, "dv": v, "dbias": (q[0], q[2], q[1], k[1]) if dbias else (0,)}
    return {"o": q[:3] + v[3:], "lse": (q[0], q[2], q[1])}


def rule(backward: bool) -> Callable:
    """The Shardy rule of the forward or backward call, from the operands' shapes: every dimension's factor
    is its role's (ROLES), or a factor of its own where its size is not the role's full size; the key
    sequence and head dims need replication (they are gathered), as every dimension without a role. A
    result's such dimension has a factor of its own: the kernel makes it whole, so it takes no sharding from
    an operand (dK of a sequence-split K leaves replicated, as plain JAX's does)."""
    names, results = (BWD_OPERANDS, BWD_RESULTS) if backward else (FWD_OPERANDS, FWD_RESULTS)

    def make(cfg, mesh, operand_types, result_types):
        shapes = [tuple(mlir.ir.RankedTensorType(t).shape) for t in operand_types]
        out_shapes = [tuple(mlir.ir.RankedTensorType(t).shape) for t in result_types]
        q, k = shapes[0], shapes[1]
        sizes = {"b": q[0], "sq": q[1], "hq": q[2], "d": q[3], "sk": k[1], "hk": k[2], "e": shapes[2][3]}
        order: list[str] = []
        replicated: set[str] = set()

        def factors(name: str, shape: tuple, result: bool = False) -> str:
            roles = ROLES[name] if len(ROLES[name]) == len(shape) else (None,) * len(shape)
            out = []
            for r, n in zip(roles, shape):
                if r is not None and n == sizes[r] and not (result and r in _REPLICATED):
                    f = _FACTORS[r]
                    if r in _REPLICATED:
                        replicated.add(f)
                else:
                    f = f"x{len(order)}"
                    replicated.add(f)
                if f not in order:
                    order.append(f)
                out.append(f)
            return " ".join(out)

        text = ", ".join(factors(n, s) for n, s in zip(names, shapes)) + " -> " + \
            ", ".join(factors(n, s, True) for n, s in zip(results, out_shapes))
        return text, {"need_replication_factors": tuple(f for f in order if f in replicated)}
    return make
