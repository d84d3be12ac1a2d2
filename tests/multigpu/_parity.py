"""Sharding parity with plain JAX: every pattern, in one list (CASES), measured the same way everywhere.

Each Case is a small program written twice, with jax_aiter's ops and in plain JAX
(jax.nn.dot_product_attention, jax.numpy norms), placed on a 4-device mesh by a
pattern (batch, heads, GQA splits, MQA, sequence, hidden, FSDP). Each runs forward and
grad (of a fixed random projection of every output), under three modes:

- ``auto``: Auto mesh axes, NamedSharding inputs, plain ``jax.jit``;
- ``explicit``: Explicit mesh axes (``jax.make_mesh``'s default) inside ``jax.set_mesh``;
- ``shard_map``: the program's per-shard form inside ``jax.shard_map`` (where a pattern
  has one the same for both: the user's code, with the op swapped).

`measure` compiles a program and reads its collectives (count and bytes per kind, from
the compiled HLO text), its output shardings and values. test_sharding_parity.py asserts
ours <= plain per kind, equal output shardings and close values, and that the table in
docs/transformations.md is what it measures; `python tests/multigpu/_parity.py --write`
rewrites that table (on 4 CPU devices, which it forces).
"""
from __future__ import annotations

import contextlib
import functools
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

if __name__ == "__main__" and "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("JA_KERNEL_MIN_BYTES", "0")

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _mesh_cases import COLLECTIVES, collectives

import jax_aiter

MODES = ("auto", "explicit", "shard_map")
DOCS = Path(__file__).resolve().parents[2] / "docs" / "transformations.md"
TABLE_START, TABLE_END = "<!-- sharding-parity:start -->", "<!-- sharding-parity:end -->"
EPS = 1e-6


# --- the ops, ours and plain JAX's ----------------------------------------------------------------------

def plain_attention(q, k, v, causal: bool, segment_ids=None):
    """jax.nn.dot_product_attention with flash_attn_func's mask: causal aligned to the bottom-right corner; with
    segment ids, a query sees the keys of its own document (its run of equal ids), the mask a user writes."""
    sq, sk = q.shape[1], k.shape[1]
    if segment_ids is not None:
        same = segment_ids[:, None, :, None] == segment_ids[:, None, None, :]
        return jax.nn.dot_product_attention(q, k, v, mask=same, is_causal=causal)
    if causal and sq != sk:
        mask = jnp.arange(sk)[None, :] <= jnp.arange(sq)[:, None] + (sk - sq)
        return jax.nn.dot_product_attention(q, k, v, mask=mask)
    return jax.nn.dot_product_attention(q, k, v, is_causal=causal)


def plain_rms_norm(x, w, eps=EPS):
    """RMSNorm as a Flax user writes it: float32 inside, the activation's dtype out."""
    xf = x.astype(jnp.float32)
    return (xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps) * w.astype(jnp.float32)).astype(x.dtype)


def plain_rms_norm_with_add(x, residual, w, eps=EPS):
    summed = (x.astype(jnp.float32) + residual.astype(jnp.float32)).astype(x.dtype)
    return plain_rms_norm(summed, w, eps), summed


def plain_silu_and_mul(x):
    """SiLU-and-mul as its docstring defines it, silu(x[..., :d]) * x[..., d:], sliced. (jnp.split's form costs XLA
    three all-to-alls in the backward where the halves' slices cost collective-permutes: docs/transformations.md.)"""
    d = x.shape[-1] // 2
    xf = x.astype(jnp.float32)
    return (jax.nn.silu(xf[..., :d]) * xf[..., d:]).astype(x.dtype)


def plain_silu_gate_up(gate, up):
    return (jax.nn.silu(gate.astype(jnp.float32)) * up.astype(jnp.float32)).astype(gate.dtype)


def plain_paged_attention(q, k_pool, v_pool, cu_q, kv_indptr, kv_page_indices, kv_last_page_lens, causal=True):
    """Attention over a paged cache as a plain JAX user writes it: each sequence's pages gathered into a dense
    [num_seqs, max_pages * page_size] block (max_pages: the widest sequence of the cases), masked by its length (and,
    for prefill, bottom-right causal), then the softmax; GQA by grouping the query heads. q [total_q, heads, d] with
    the same number of query tokens per sequence (cu_q: even steps)."""
    n = kv_last_page_lens.shape[0]
    page, kv_heads, d = k_pool.shape[1], k_pool.shape[2], k_pool.shape[3]
    sq, heads = q.shape[0] // n, q.shape[1]
    max_pages = PAGED_MAX_PAGES
    pages = jnp.take(kv_page_indices, kv_indptr[:-1, None] + jnp.arange(max_pages)[None], mode="clip")
    k, v = (p[pages].reshape(n, max_pages * page, kv_heads, d) for p in (k_pool, v_pool))
    length = (kv_indptr[1:] - kv_indptr[:-1] - 1) * page + kv_last_page_lens
    key = jnp.arange(max_pages * page)
    row = length[:, None] - sq + jnp.arange(sq)[None]                                   # [n, sq]: each diagonal
    ok = (key[None, None] < length[:, None, None]) & ((not causal) | (key[None, None] <= row[..., None]))
    qg = q.reshape(n, sq, kv_heads, heads // kv_heads, d)
    s = jnp.einsum("ntkgd,nskd->nkgts", qg, k) * d ** -0.5
    p = jax.nn.softmax(jnp.where(ok[:, None, None], s, -jnp.inf), axis=-1)
    return jnp.einsum("nkgts,nskd->ntkgd", p, v).reshape(q.shape)


def plain_append_kv(k_new, v_new, slots, k_pool, v_pool):
    """append_kv as a scatter: token n to page slots // page_size, row slots % page_size; a negative slot dropped."""
    page = k_pool.shape[1]
    where = jnp.where(slots < 0, k_pool.shape[0], slots // page), slots % page
    return k_pool.at[where].set(k_new, mode="drop"), v_pool.at[where].set(v_new, mode="drop")


def _ours_paged(q, k_pool, v_pool, cu_q, kv_indptr, kv_page_indices, kv_last_page_lens):
    """paged_attention for one token a sequence (decode), else paged_prefill."""
    table = (kv_indptr, kv_page_indices, kv_last_page_lens)
    max_k = PAGED_MAX_PAGES * k_pool.shape[1]
    if q.shape[0] == kv_last_page_lens.shape[0]:
        return jax_aiter.paged_attention(q, k_pool, v_pool, *table, max_seq_len=max_k)
    return jax_aiter.paged_prefill(q, k_pool, v_pool, cu_q, *table, max_seqlen_q=q.shape[0], max_seqlen_k=max_k)


@dataclass(frozen=True)
class Ops:
    """The ops a program is written with: ours or plain JAX's, so the two programs differ only in them."""
    attention: Callable
    rms_norm: Callable
    rms_norm_with_add: Callable
    silu_and_mul: Callable
    silu_gate_up: Callable
    paged_attention: Callable
    append_kv: Callable


OURS = Ops(lambda q, k, v, causal, segment_ids=None: jax_aiter.flash_attn_func(q, k, v, causal=causal,
                                                                               segment_ids=segment_ids),
           jax_aiter.rms_norm, jax_aiter.rms_norm_with_add, jax_aiter.silu_and_mul, jax_aiter.silu_and_mul,
           _ours_paged, jax_aiter.append_kv)
PLAIN = Ops(plain_attention, plain_rms_norm, plain_rms_norm_with_add, plain_silu_and_mul, plain_silu_gate_up,
            plain_paged_attention, plain_append_kv)


# --- cases -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    """One pattern. `program(ops)`: the program on whole arrays; `local(ops)`: its per-shard form for shard_map,
    or a string saying why there is none; `exceeds`: the (mode, "forward"/"grad") where ours has more
    collectives than plain JAX; `shardings_differ`: those where an output's sharding differs from plain JAX's
    (the docs say how)."""
    name: str
    what: str
    axes: tuple[str, ...]
    mesh_shape: tuple[int, ...]
    shapes: tuple[tuple[int, ...], ...]
    specs: tuple[P, ...]
    program: Callable[[Ops], Callable]
    local: Callable[[Ops], Callable] | str
    out_specs: object = None  # shard_map's out_specs (default: the first input's spec)
    exceeds: frozenset = field(default_factory=frozenset)
    shardings_differ: frozenset = field(default_factory=frozenset)
    dtypes: tuple = ()  # each input's dtype (default float32)
    fixed: tuple = ()  # (index, array): inputs given as they are (segment ids), not drawn; no gradient is taken
    check_vma: bool = True  # shard_map's: False where an all-gathered parameter makes a replicated result look varying
    make_inputs: Callable | None = None  # the inputs where random normal floats are not (a page table)
    grad: bool = True  # False: an inference op (no gradient; its grad cells read n/a)

    @property
    def devices(self) -> int:
        return math.prod(self.mesh_shape)

    @property
    def differentiated(self) -> tuple[int, ...]:
        """The inputs a gradient is taken of: all but the fixed ones."""
        fixed = {i for i, _ in self.fixed}
        return tuple(i for i in range(len(self.shapes)) if i not in fixed)


def _attn_case(name, what, axes, mesh_shape, hq, hk, specs, causal, local=None, seq_k=32, exceeds=frozenset(),
               shardings_differ=frozenset()):
    b, seq_q, d = 4, 32, 64
    shapes = ((b, seq_q, hq, d), (b, seq_k, hk, d), (b, seq_k, hk, d))

    def program(ops):
        return lambda q, k, v: ops.attention(q, k, v, causal)
    return Case(name, what, axes, mesh_shape, shapes, specs, program, program if local is None else local,
                exceeds=exceeds, shardings_differ=shardings_differ)


def _kv_head_of_shard(axis, group_shards, causal):
    """Per shard: K/V are whole, this shard's query heads read kv head shard // group_shards."""
    def local(ops):
        def run(q, k, v):
            h = jax.lax.axis_index(axis) // group_shards
            k, v = (jax.lax.dynamic_slice_in_dim(x, h, 1, axis=2) for x in (k, v))
            return ops.attention(q, k, v, causal)
        return run
    return local


def _kv_heads_of_queries(axis, group, causal):
    """Per shard: K/V are whole, each query head takes its own kv head (a shard's heads span kv groups)."""
    def local(ops):
        def run(q, k, v):
            heads = (jax.lax.axis_index(axis) * q.shape[2] + jnp.arange(q.shape[2])) // group
            return ops.attention(q, jnp.take(k, heads, axis=2), jnp.take(v, heads, axis=2), causal)
        return run
    return local


def _gathered_kv(axis, causal):
    """Per shard: the keys and values of the whole sequence (all-gathered), this shard's queries."""
    def local(ops):
        def run(q, k, v):
            k, v = (jax.lax.all_gather(x, axis, axis=1, tiled=True) for x in (k, v))
            return ops.attention(q, k, v, causal)
        return run
    return local


HEADS, SEQ = P(None, None, "model"), P(None, "model")
LOCAL_CAUSAL = "flash_attn_func's causal mask is aligned to the shard's own rows"
CASES: list[Case] = [
    _attn_case("attn-batch", "attention, batch split 4 ways", ("data",), (4,), 8, 8, (P("data"),) * 3, True),
    _attn_case("attn-heads", "attention (MHA 8/8), heads split 4 ways", ("model",), (4,), 8, 8, (HEADS,) * 3, False),
    _attn_case("attn-gqa-kv-split", "GQA 8/4, heads split 4 ways (divides heads_kv: K/V split too)", ("model",), (4,),
               8, 4, (HEADS,) * 3, True),
    _attn_case("attn-gqa-kv-whole", "GQA 8/2, heads split 4 ways (does not divide heads_kv), K/V replicated",
               ("model",), (4,), 8, 2, (HEADS, P(), P()), True, local=_kv_head_of_shard("model", 2, True)),
    _attn_case("attn-gqa-uneven", "GQA 12/3, heads split 4 ways (a shard's heads span two kv heads), K/V replicated",
               ("model",), (4,), 12, 3, (HEADS, P(), P()), True, local=_kv_heads_of_queries("model", 4, True),
               exceeds=frozenset({("auto", "grad")}),
               shardings_differ=frozenset({("auto", "forward"), ("auto", "grad")})),
    _attn_case("attn-mqa", "MQA 8/1, heads split 4 ways, K/V replicated", ("model",), (4,), 8, 1, (HEADS, P(), P()),
               True),
    _attn_case("attn-batch-heads", "GQA 8/2, batch 2 ways x heads 2 ways", ("data", "model"), (2, 2), 8, 2,
               (P("data", None, "model"),) * 3, True),
    _attn_case("attn-seq", "attention, sequence split 4 ways (context parallel), no mask", ("model",), (4,), 8, 8,
               (SEQ,) * 3, False, local=_gathered_kv("model", False), shardings_differ=frozenset({("auto", "grad")})),
    _attn_case("attn-seq-causal", "attention, sequence split 4 ways, causal", ("model",), (4,), 8, 8, (SEQ,) * 3, True,
               local=LOCAL_CAUSAL, shardings_differ=frozenset({("auto", "grad")})),
    _attn_case("attn-seq-causal-offset", "causal, seq_q 32 split 4 ways, seq_k 36 (not a multiple of the 8 rows)",
               ("model",), (4,), 8, 8, (SEQ, P(), P()), True, seq_k=36, local=LOCAL_CAUSAL,
               exceeds=frozenset({("auto", "forward"), ("auto", "grad"), ("explicit", "forward"),
                                  ("explicit", "grad")})),
]
# Packed documents, four runs per row: runs within a shard, runs across shard boundaries, a row of one document
# (a tuple of rows: a Case is hashable, the reference values are cached by it)
SEGMENT_IDS = tuple(map(tuple, np.repeat([[0, 1, 2, 3], [3, 3, 4, 4], [5, 6, 6, 6], [7, 7, 7, 7]], 8, axis=1).tolist()))
CASES.append(Case(
    "attn-seq-segments", "attention with segment_ids (packed documents), causal, sequence split 4 ways", ("model",),
    (4,), ((4, 32, 8, 64),) * 3 + (np.shape(SEGMENT_IDS),), (SEQ,) * 4,
    lambda ops: lambda q, k, v, seg: ops.attention(q, k, v, True, segment_ids=seg),
    "segment_ids need seq_q == seq_k: a shard's rows are not the whole sequence", exceeds=frozenset({("auto", "grad")}),
    dtypes=(jnp.float32,) * 3 + (jnp.int32,), fixed=((3, SEGMENT_IDS),)))
B, S, HIDDEN = 4, 16, 256
ROWS, HIDDEN_SPLIT = P("data", "model"), P(None, None, "model")
NO_LOCAL_HIDDEN = "the op normalises the rows it is given; a split hidden axis needs every shard's partial sums"


def _case(name, what, axes, mesh_shape, shapes, specs, program, local=None, **kw):
    return Case(name, what, axes, mesh_shape, shapes, specs, program, program if local is None else local, **kw)


def _gathered_weight(ops):
    """Per shard: whole rows, the weight all-gathered (FSDP written by hand)."""
    return lambda x, w: ops.rms_norm(x, jax.lax.all_gather(w, "model", tiled=True))


CASES += [
    _case("rms-rows", "rms_norm, rows split over both axes", ("data", "model"), (2, 2), ((B, S, HIDDEN), (HIDDEN,)),
          (ROWS, P()), lambda ops: ops.rms_norm),
    _case("rms-hidden", "rms_norm, hidden split 4 ways, weight split with it", ("model",), (4,),
          ((B, S, HIDDEN), (HIDDEN,)), (HIDDEN_SPLIT, P("model")), lambda ops: ops.rms_norm, NO_LOCAL_HIDDEN),
    _case("rms-hidden-rows", "rms_norm, batch 2 ways x hidden 2 ways, weight replicated", ("data", "model"), (2, 2),
          ((B, S, HIDDEN), (HIDDEN,)), (P("data", None, "model"), P()), lambda ops: ops.rms_norm, NO_LOCAL_HIDDEN),
    _case("rms-weight-split", "rms_norm, batch 2 ways, weight split 2 ways over the other axis (FSDP's weight)",
          ("data", "model"), (2, 2), ((B, S, HIDDEN), (HIDDEN,)), (P("data"), P("model")), lambda ops: ops.rms_norm,
          lambda ops: _gathered_weight(ops), check_vma=False),
    _case("rms-add-hidden", "rms_norm_with_add, hidden split 4 ways", ("model",), (4,),
          ((B, S, HIDDEN), (B, S, HIDDEN), (HIDDEN,)), (HIDDEN_SPLIT, HIDDEN_SPLIT, P("model")),
          lambda ops: ops.rms_norm_with_add, NO_LOCAL_HIDDEN),
    _case("rms-mixed-dtype", "rms_norm, bfloat16 rows split over both axes, float32 weight (Flax's default)",
          ("data", "model"), (2, 2), ((B, S, HIDDEN), (HIDDEN,)), (ROWS, P()), lambda ops: ops.rms_norm,
          dtypes=(jnp.bfloat16, jnp.float32)),
    _case("silu-rows", "silu_and_mul, rows split over both axes", ("data", "model"), (2, 2), ((B, S, 2 * HIDDEN),),
          (ROWS,), lambda ops: ops.silu_and_mul),
    _case("silu-hidden", "silu_and_mul, last axis ([gate | up]) split 4 ways", ("model",), (4,), ((B, S, 2 * HIDDEN),),
          (HIDDEN_SPLIT,), lambda ops: ops.silu_and_mul, "a shard holds a slice of [gate | up], not a pair"),
    _case("silu-gate-up-hidden", "silu_and_mul(gate, up), the last axis of both split 4 ways", ("model",), (4,),
          ((B, S, HIDDEN), (B, S, HIDDEN)), (HIDDEN_SPLIT, HIDDEN_SPLIT), lambda ops: ops.silu_gate_up),
]


# The paged KV cache (inference: no gradient). Four sequences of 5, 16, 23 and 9 tokens (the last page partly
# filled), pages of 8 tokens scattered over a pool of 16; a prefill of 2 new tokens a sequence (decode: 1), GQA 8/4.
PAGED_MAX_PAGES, PAGED_SEQS, PAGED_LENS, PAGED_PAGE = 3, 4, (5, 16, 23, 9), 8
PAGED_POOL = (16, PAGED_PAGE, 4, 32)
HEADS_POOL, HEADS_TOKENS = P(None, None, "model"), P(None, "model")


def _paged_inputs(new_tokens: int):
    """q [4 * new_tokens, 8, 32], the pools, cu_seqlens_q and the page table (int32)."""
    rng = np.random.default_rng(0)
    pages = [int(np.ceil(n / PAGED_PAGE)) for n in PAGED_LENS]
    order = rng.permutation(PAGED_POOL[0])[:sum(pages)]
    indptr = np.cumsum([0, *pages])
    last = [(n - 1) % PAGED_PAGE + 1 for n in PAGED_LENS]
    q = rng.standard_normal((PAGED_SEQS * new_tokens, 8, 32))
    k, v = (rng.standard_normal(PAGED_POOL) for _ in range(2))
    floats = [jnp.asarray(x, jnp.float32) for x in (q, k, v)]
    ints = [jnp.asarray(x, jnp.int32) for x in (np.arange(PAGED_SEQS + 1) * new_tokens, indptr, order, last)]
    return floats + ints


def _append_inputs():
    """k_new, v_new [6, 4, 32], the slots (one skipped, one the last of the pool), the pools."""
    rng = np.random.default_rng(1)
    k_new, v_new = (jnp.asarray(rng.standard_normal((6, 4, 32)), jnp.float32) for _ in range(2))
    slots = jnp.asarray([3, 17, -1, 64, 127, 90], jnp.int32)
    k, v = (jnp.asarray(rng.standard_normal(PAGED_POOL), jnp.float32) for _ in range(2))
    return [k_new, v_new, slots, k, v]


def _paged_case(name, what, new_tokens, q_spec, **kw):
    pages = sum(-(-n // PAGED_PAGE) for n in PAGED_LENS)
    shapes = ((PAGED_SEQS * new_tokens, 8, 32), PAGED_POOL, PAGED_POOL, (5,), (5,), (pages,), (4,))
    specs = (q_spec, HEADS_POOL, HEADS_POOL, P(), P(), P(), P())
    return _case(name, what, ("model",), (4,), shapes, specs, lambda ops: ops.paged_attention, grad=False,
                 make_inputs=lambda: _paged_inputs(new_tokens), out_specs=HEADS_TOKENS, **kw)


CASES += [
    _paged_case("paged-decode-kv-heads", "paged decode (GQA 8/4), query and pools split over the heads 4 ways", 1,
                HEADS_TOKENS),
    _paged_case("paged-prefill-kv-heads", "paged prefill of 2 tokens a sequence, causal over each history, query and "
                "pools split over the heads 4 ways", 2, HEADS_TOKENS),
    _paged_case("paged-decode-pools-split", "paged decode, the pools split over the kv heads 4 ways, the query "
                "replicated (each shard takes its heads' queries)", 1, P(),
                local="the query is replicated: a shard_map user slices it to the shard's heads first (the "
                      "paged-decode-kv-heads pattern)", shardings_differ=frozenset({("explicit", "forward")})),
    _case("append-kv-heads", "append_kv, the pools and the new tokens split over the kv heads 4 ways", ("model",),
          (4,), ((6, 4, 32), (6, 4, 32), (6,), PAGED_POOL, PAGED_POOL),
          (P(None, "model"), P(None, "model"), P(), HEADS_POOL, HEADS_POOL), lambda ops: ops.append_kv, grad=False,
          make_inputs=_append_inputs, out_specs=(HEADS_POOL, HEADS_POOL)),
    _case("append-kv-pages", "append_kv, the pools split over their pages 4 ways (each shard writes the tokens of "
          "its own pages), the new tokens replicated", ("model",), (4,), ((6, 4, 32), (6, 4, 32), (6,), PAGED_POOL,
                                                                           PAGED_POOL),
          (P(), P(), P(), P("model"), P("model")), lambda ops: ops.append_kv,
          "a shard's slots are the pool's: the op shifts them to the shard's pages", grad=False,
          make_inputs=_append_inputs),
]


# An FSDP transformer block: norm, attention (GQA 4/2, causal) with its projections, fused-add norm, SwiGLU MLP.
MODEL, HQ, HK, HD, FF = 128, 4, 2, 32, 256
BLOCK_SHAPES = ((B, S, MODEL), (MODEL,), (MODEL, HQ * HD), (MODEL, HK * HD), (MODEL, HK * HD), (HQ * HD, MODEL),
                (MODEL,), (MODEL, 2 * FF), (FF, MODEL))


def _whole_under_explicit(w):
    """Under Explicit axes a parameter split over the contracted axis must be gathered by the program (JAX refuses
    the ambiguous dot), FSDP's all-gather written out; under Auto axes propagation decides, as in a plain jit."""
    mesh = jax.sharding.get_abstract_mesh()
    explicit = not mesh.empty and AxisType.Explicit in mesh.axis_types
    return jax.sharding.reshard(w, P()) if explicit else w


def _block(ops, x, n1, wq, wk, wv, wo, n2, w_up, w_down, gather=_whole_under_explicit):
    b, s, _ = x.shape
    n1, wq, wk, wv, wo, n2, w_up, w_down = map(gather, (n1, wq, wk, wv, wo, n2, w_up, w_down))
    y = ops.rms_norm(x, n1)
    q, k, v = ((y @ w).reshape(b, s, -1, HD) for w in (wq, wk, wv))
    a = ops.attention(q, k, v, True).reshape(b, s, HQ * HD) @ wo
    y, resid = ops.rms_norm_with_add(a, x, n2)
    return ops.silu_and_mul(y @ w_up) @ w_down + resid


def _block_case(name, what, batch, **kw):
    params = (P("fsdp"), *(P("fsdp", None),) * 4, P("fsdp"), *(P("fsdp", None),) * 2)

    def local(ops):  # FSDP by hand: each parameter all-gathered where it is used
        return partial(_block, ops, gather=lambda w: jax.lax.all_gather(w, "fsdp", axis=0, tiled=True))
    return _case(name, what, ("data", "fsdp"), (2, 2), BLOCK_SHAPES, (batch, *params),
                 lambda ops: partial(_block, ops), local, check_vma=False, **kw)


CASES += [
    _block_case("fsdp-block-data", "a transformer block (norm, GQA attention 4/2, fused-add norm, SwiGLU MLP), "
                "batch on `data`, every parameter split over `fsdp`", P("data")),
    _block_case("fsdp-block-2axes", "the same block, batch on `data` and `fsdp` together", P(("data", "fsdp")),
                exceeds=frozenset({("auto", "grad")}), shardings_differ=frozenset({("auto", "grad")})),
]
BY_NAME = {c.name: c for c in CASES}


# --- measuring ---------------------------------------------------------------------------------------

@dataclass
class Measured:
    """One compiled program: collectives {kind: (count, bytes)}, output shardings and values; or why it failed."""
    collectives: dict = field(default_factory=dict)
    shardings: list = field(default_factory=list)
    values: list = field(default_factory=list)
    error: str | None = None


def _mesh(case: Case, mode: str) -> jax.sharding.Mesh:
    kind = AxisType.Auto if mode == "auto" else AxisType.Explicit
    return jax.make_mesh(case.mesh_shape, case.axes, devices=jax.devices()[:case.devices],
                         axis_types=(kind,) * len(case.axes))


def inputs(case: Case) -> list[jax.Array]:
    if case.make_inputs is not None:
        return case.make_inputs()
    dtypes = case.dtypes or (jnp.float32,) * len(case.shapes)
    fixed = dict(case.fixed)
    return [jnp.asarray(fixed[i], t) if i in fixed else
            (jax.random.normal(jax.random.key(i), s, jnp.float32) * (0.1 if len(s) == 2 else 1)).astype(t)
            for i, (s, t) in enumerate(zip(case.shapes, dtypes))]


def _cotangents(fn, args) -> list[jax.Array]:
    outs = jax.eval_shape(fn, *args)
    return [jax.random.normal(jax.random.key(100 + i), o.shape, jnp.float32)
            for i, o in enumerate(jax.tree.leaves(outs))]


def with_grad(case: Case, fn, args):
    """The gradient of fn (the case's program, ours or plain) of a fixed random projection of its outputs, with
    respect to every input but the fixed ones."""
    cts = _cotangents(case.program(PLAIN), args)

    def loss(*a):
        return sum(jnp.sum(o.astype(jnp.float32) * c) for o, c in zip(jax.tree.leaves(fn(*a)), cts))
    return lambda *a: jax.grad(loss, argnums=case.differentiated)(*a)


def program(case: Case, impl: str, mode: str, mesh) -> Callable | None:
    """The program of `impl` ("ours"/"plain") under `mode`, or None (no shard_map form)."""
    ops = OURS if impl == "ours" else PLAIN
    if mode != "shard_map":
        return case.program(ops)
    if isinstance(case.local, str):
        return None
    out_specs = case.out_specs if case.out_specs is not None else case.specs[0]
    return jax.shard_map(case.local(ops), mesh=mesh, in_specs=case.specs, out_specs=out_specs,
                         check_vma=case.check_vma)


def measure(case: Case, impl: str, mode: str, grad: bool) -> Measured | None:
    """Compile and run one program; None where the mode has no form of it."""
    mesh = _mesh(case, mode)
    fn = program(case, impl, mode, mesh)
    if fn is None or (grad and not case.grad):
        return None
    args = inputs(case)
    if grad:
        fn = with_grad(case, fn, args)
    placed = [jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(args, case.specs)]
    ctx = jax.set_mesh(mesh) if mode == "explicit" else contextlib.nullcontext()
    try:
        with ctx:
            compiled = jax.jit(fn).lower(*placed).compile()
            out = jax.tree.leaves(compiled(*placed))
    except Exception as e:  # plain JAX refuses some patterns under Explicit axes (ShardingTypeError)
        if impl == "ours":
            raise
        return Measured(error=type(e).__name__)
    return Measured(collectives(compiled.as_text()), [o.sharding for o in out], out)


@functools.cache
def reference(case: Case, grad: bool) -> list[jax.Array]:
    """Plain JAX on one device: what every sharded program's values are compared with (once per case)."""
    args = inputs(case)
    fn = case.program(PLAIN)
    fn = with_grad(case, fn, args) if grad else fn
    return jax.tree.leaves(jax.jit(fn)(*args))


# --- the docs table ----------------------------------------------------------------------------------

def cell(m: Measured | None) -> str:
    if m is None:
        return "n/a"
    if m.error:
        return f"fails ({m.error})"
    if not m.collectives:
        return "none"
    return ", ".join(f"{n} {COLLECTIVES[k]} {_size(b)}" for k, (n, b) in sorted(m.collectives.items()))


def _size(nbytes: int) -> str:
    return f"{nbytes} B" if nbytes < 1024 else f"{nbytes / 1024:.1f}".removesuffix(".0") + " KiB"


def row(case: Case, mode: str, results: dict) -> str:
    """results[(impl, "forward"|"grad")] -> Measured."""
    cells = [cell(results[(impl, what)]) for what in ("forward", "grad") for impl in ("ours", "plain")]
    return f"| `{case.name}` | {mode} | " + " | ".join(cells) + " |"


HEADER = ("| pattern | mode | forward: ours | forward: plain JAX | grad: ours | grad: plain JAX |\n"
          "|---|---|---|---|---|---|")


def documented_rows() -> dict[tuple[str, str], str]:
    """The table in docs/transformations.md: {(pattern, mode): row}."""
    text = DOCS.read_text()
    if TABLE_START not in text:
        return {}
    body = text.split(TABLE_START, 1)[1].split(TABLE_END, 1)[0]
    rows = {}
    for line in body.splitlines():
        parts = [p.strip() for p in line.strip().strip("|").split("|")]
        if len(parts) == 6 and parts[0].startswith("`"):
            rows[(parts[0].strip("`"), parts[1])] = line.strip()
    return rows


def table(names: list[str] | None = None) -> str:
    lines = [HEADER]
    for case in (BY_NAME[n] for n in names) if names else CASES:
        for mode in MODES:
            results = {(impl, what): measure(case, impl, mode, what == "grad")
                       for impl in ("ours", "plain") for what in ("forward", "grad")}
            lines.append(row(case, mode, results))
    return "\n".join(lines)


def describe() -> str:
    return "\n".join(f"- `{c.name}`: {c.what}; mesh {dict(zip(c.axes, c.mesh_shape))}, inputs "
                     + ", ".join(f"{list(s)} {_spec(p)}" for s, p in zip(c.shapes, c.specs))
                     + ("" if not isinstance(c.local, str) else f"; no shard_map form: {c.local}")
                     for c in CASES)


def _spec(p: P) -> str:
    return "P(" + ", ".join(repr(e) for e in p) + ")"


def write_docs() -> None:
    text = DOCS.read_text()
    head, rest = text.split(TABLE_START, 1)
    _, tail = rest.split(TABLE_END, 1)
    DOCS.write_text(f"{head}{TABLE_START}\n{table()}\n\nThe patterns (float32):\n\n{describe()}\n{TABLE_END}{tail}")


if __name__ == "__main__":
    if "--write" in sys.argv:
        write_docs()
    else:  # the table (of the named patterns, or of all)
        print(table(sys.argv[1:]))
