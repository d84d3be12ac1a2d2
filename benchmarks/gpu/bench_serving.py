"""The serving section of bench_gpu.py (--only serving, issue 83's goal 3): the paged KV cache's kernels against
copy bandwidth, our dense kernels and FlashAttention-3's paged decode, in the same run, device-timed (time_cases).

Rows (bf16 unless named, GQA 32/8, head dim 128):
- paged decode: one query token per sequence over pools of 16- and 64-token pages scattered over the pool, batch 8
  at 1k, 8k and 32k keys and batch 64 of mixed contexts (1k to 32k in one batch). Ours (paged_attention) as a
  fraction of copy bandwidth on the K/V bytes read (goal >= 0.8); against our dense-cache decode
  (flash_attn_func over the same keys gathered into [batch, keys, heads, dim], equal contexts: goal >= 0.95 of its
  speed); FA3's flash_mha_with_kvcache over the same pools and pages (its page_table), with 1, 4 and 16 splits,
  the best one the anchor.
- FP8 KV decode: the same 32k decode with float8_e4m3fn pools (per-tensor scales) over the bf16 pools' time (goal:
  >= 1.8x their speed).
- paged prefill: 8 sequences of 2k tokens, causal, their keys in pages, against flash_attn_varlen over the same
  tokens packed (goal >= 0.9 of its speed).
- FP8 attention forward: flash_attn_func on float8_e4m3fn q, k, v with descales against bf16, 8k and 16k tokens
  (batch x length = 32k), full (goal >= 1.5x the bf16 speed).
A case that does not compile here (no GPU kernel of the paged ops in this build, an anchor that refuses a shape)
is left out with the reason in the row's "refused"; its ratios are then absent and the row is not met.
"""
from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

import jax_aiter as ja
from benchmarks.gpu.bench_attention import fa3
from benchmarks.gpu.gpu_timing import compile_refusal, median, n_sets, rand, time_cases
from jax_aiter.mha import flash_attn_varlen

HQ, HKV, D = 32, 8, 128
FP8 = jnp.float8_e4m3fn
DECODE_CASES = ((8, (1024,) * 8), (8, (8192,) * 8), (8, (32768,) * 8),
                (64, tuple(int(c) for c in np.geomspace(1024, 32768, 64).round())))
PAGE_SIZES = (16, 64)
FA3_SPLITS = (1, 4, 16)
GOALS = {"decode_frac_of_copy": 0.8, "decode_vs_dense": 0.95, "fp8_kv_speedup": 1.8, "prefill_vs_varlen": 0.9,
         "fp8_fwd_speedup": 1.5}


def page_set(contexts: tuple[int, ...], page_size: int, seed: int, fp8: bool = False, dtype=jnp.bfloat16) -> dict:
    """One input set of a paged case: q [b, hq, d], pools whose pages are scattered (a permutation), FlashInfer
    metadata, FA3's page table [b, most pages] and cache lengths, the keys gathered dense [b, keys, hkv, d] where
    every context is the same, and (fp8) the pools in float8_e4m3fn (scale 1: the values are normal samples)."""
    rng = np.random.default_rng(seed)
    pages = [math.ceil(c / page_size) for c in contexts]
    total = sum(pages)
    order = rng.permutation(total).astype(np.int32)
    ptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    table = np.zeros((len(contexts), max(pages)), np.int32)
    for i, n in enumerate(pages):
        table[i, :n] = order[ptr[i]:ptr[i + 1]]
    shape = (total, page_size, HKV, D)
    s = {"q": rand((len(contexts), HQ, D), dtype, seed), "k": rand(shape, dtype, seed + 1),
         "v": rand(shape, dtype, seed + 2), "indptr": jnp.asarray(ptr), "indices": jnp.asarray(order),
         "last": jnp.asarray([(c - 1) % page_size + 1 for c in contexts], jnp.int32), "table": jnp.asarray(table),
         "lens": jnp.asarray(contexts, jnp.int32)}
    if len(set(contexts)) == 1:
        s["k_dense"], s["v_dense"] = (x[s["table"]].reshape(len(contexts), -1, HKV, D)[:, :contexts[0]]
                                      for x in (s["k"], s["v"]))
    if fp8:
        s["k8"], s["v8"] = s["k"].astype(FP8), s["v"].astype(FP8)
    return s


def decode_cases(contexts: tuple[int, ...], fa3_mod, fp8: bool = False) -> dict:
    """name -> f(set): ours paged (and, fp8, ours over float8 pools), our dense decode, FA3 with each split count."""
    top = max(contexts)
    one = jnp.ones((1,), jnp.float32)

    def ours(s):
        return ja.paged_attention(s["q"], s["k"], s["v"], s["indptr"], s["indices"], s["last"], max_seq_len=top)

    cases = {"ours": ours}
    if fp8:
        cases["ours_fp8"] = lambda s: ja.paged_attention(
            s["q"], s["k8"], s["v8"], s["indptr"], s["indices"], s["last"], max_seq_len=top,
            kv_cache_dtype="fp8", k_scale=one, v_scale=one)
    if len(set(contexts)) == 1:
        cases["dense"] = lambda s: ja.flash_attn_func(s["q"][:, None], s["k_dense"], s["v_dense"])[:, 0]
    for n in FA3_SPLITS if fa3_mod is not None else ():
        cases[f"fa3_splits{n}"] = lambda s, n=n: fa3_mod.flash_mha_with_kvcache(
            s["q"][:, None], s["k"], s["v"], cache_seqlens=s["lens"], page_table=s["table"], num_splits=n)[:, 0]
    return cases


def timed(lib, cases: dict, sets: list, reps: int) -> tuple[dict, dict]:
    """({name: median ms} of the cases that compile, {name: why} of the others)."""
    refused = {n: why for n, f in cases.items() if (why := compile_refusal(f, sets[0]))}
    run = {n: (lambda *s, f=f: f(s[0])) for n, f in cases.items() if n not in refused}
    t = time_cases(lib, run, [(s,) for s in sets], reps) if run else {}
    return {n: median(v) for n, v in t.items()}, refused


def decode_row(lib, reps, copy_gbps, batch, contexts, page_size, fa3_mod, fp8) -> dict:
    kv_bytes = 2 * sum(contexts) * HKV * D * 2
    sets = [page_set(contexts, page_size, 100 * i + page_size, fp8) for i in range(n_sets(kv_bytes))]
    t, refused = timed(lib, decode_cases(contexts, fa3_mod, fp8), sets, reps)
    row = {"name": "paged_decode" + ("+fp8" if fp8 else ""), "batch": batch, "page_size": page_size,
           "contexts": [min(contexts), max(contexts)], "kv_bytes": kv_bytes, "refused": refused,
           **{f"{k}_ms": v for k, v in t.items()}}
    goals = {}
    if "ours" in t:
        row["ours_frac_of_copy"] = kv_bytes / t["ours"] / 1e6 / copy_gbps
        goals["of copy"] = row["ours_frac_of_copy"] >= GOALS["decode_frac_of_copy"]
    if "ours" in t and "dense" in t:
        row["vs_dense"] = t["dense"] / t["ours"]
        goals["vs dense"] = row["vs_dense"] >= GOALS["decode_vs_dense"]
    if fa3_ms := [v for k, v in t.items() if k.startswith("fa3_")]:
        row["fa3_best_ms"] = min(fa3_ms)
        if "ours" in t:
            row["vs_fa3"] = row["fa3_best_ms"] / t["ours"]
    if fp8:
        row["fp8_kv_speedup"] = t["ours"] / t["ours_fp8"] if {"ours", "ours_fp8"} <= t.keys() else None
        goals["fp8 speedup"] = (row["fp8_kv_speedup"] or 0) >= GOALS["fp8_kv_speedup"]
    row["goals"], row["met"] = goals, bool(goals) and all(goals.values()) and "ours" in t
    return row


def prefill_set(seqs: int, length: int, page_size: int, seed: int) -> dict:
    """Packed queries [seqs x length, hq, d], their keys both in scattered pages and packed (varlen's input)."""
    s = page_set((length,) * seqs, page_size, seed)
    s["q"] = rand((seqs * length, HQ, D), jnp.bfloat16, seed + 3)
    s["cu"] = jnp.arange(0, (seqs + 1) * length, length, dtype=jnp.int32)
    s["k_packed"], s["v_packed"] = (x.reshape(seqs * length, HKV, D) for x in (s.pop("k_dense"), s.pop("v_dense")))
    return s


def prefill_cases(length: int) -> dict:
    return {"ours": lambda s: ja.paged_prefill(s["q"], s["k"], s["v"], s["cu"], s["indptr"], s["indices"], s["last"],
                                               max_seqlen_q=length, max_seqlen_k=length, causal=True),
            "varlen": lambda s: flash_attn_varlen(s["q"], s["k_packed"], s["v_packed"], s["cu"], s["cu"], length,
                                                  length, causal=True)[0]}


def prefill_row(lib, reps, seqs=8, length=2048, page_size=16) -> dict:
    sets = [prefill_set(seqs, length, page_size, 300 + 10 * i) for i in range(2)]
    t, refused = timed(lib, prefill_cases(length), sets, reps)
    row = {"name": "paged_prefill", "batch": seqs, "seq": length, "page_size": page_size, "refused": refused,
           **{f"{k}_ms": v for k, v in t.items()}}
    if {"ours", "varlen"} <= t.keys():
        row["vs_varlen"] = t["varlen"] / t["ours"]
    row["met"] = row.get("vs_varlen", 0.0) >= GOALS["prefill_vs_varlen"]
    return row


def fp8_set(batch: int, seq: int, seed: int) -> dict:
    s = {n: rand((batch, seq, HQ, D), jnp.bfloat16, seed + i) for i, n in enumerate("qkv")}
    return s | {f"{n}8": s[n].astype(FP8) for n in "qkv"} | {"one": jnp.ones((1,), jnp.float32)}


def fp8_cases() -> dict:
    return {"bf16": lambda s: ja.flash_attn_func(s["q"], s["k"], s["v"]),
            "fp8": lambda s: ja.flash_attn_func(s["q8"], s["k8"], s["v8"], q_descale=s["one"], k_descale=s["one"],
                                                v_descale=s["one"])}


def fp8_fwd_row(lib, reps, seq: int) -> dict:
    batch = 32768 // seq
    sets = [fp8_set(batch, seq, 500 + 10 * i) for i in range(2)]
    t, refused = timed(lib, fp8_cases(), sets, reps)
    row = {"name": "fp8_attn_fwd", "batch": batch, "seq": seq, "refused": refused,
           **{f"{k}_ms": v for k, v in t.items()},
           **{f"{k}_TFLOPs": 4 * batch * HQ * seq * seq * D / v / 1e9 for k, v in t.items()}}
    if {"bf16", "fp8"} <= t.keys():
        row["fp8_speedup"] = t["bf16"] / t["fp8"]
    row["met"] = row.get("fp8_speedup", 0.0) >= GOALS["fp8_fwd_speedup"]
    return row


def bench_serving(lib, reps: int, copy_gbps: float, quick: bool, log=print) -> list[dict]:
    fa3_mod, why = fa3()
    if why:
        log(why)
    rows = []
    for page_size in PAGE_SIZES[:1] if quick else PAGE_SIZES:
        for batch, contexts in DECODE_CASES[1:2] if quick else DECODE_CASES:
            rows.append(decode_row(lib, reps, copy_gbps, batch, contexts, page_size, fa3_mod, fp8=False))
    rows.append(decode_row(lib, reps, copy_gbps, *DECODE_CASES[2], PAGE_SIZES[0], fa3_mod, fp8=True))
    rows.append(prefill_row(lib, reps))
    rows += [fp8_fwd_row(lib, reps, seq) for seq in ((8192,) if quick else (8192, 16384))]
    return rows


def print_table(rows: list[dict]) -> None:
    """One line a row: our time, the fraction of copy bandwidth (decode), our speed against the dense decode or the
    varlen forward, against FA3's best, and FP8's speedup; then what was not run and why."""
    def f(v, fmt=".2f"):
        return "-" if v is None else format(v, fmt)

    print(f"{'serving':<18}{'b':>4}{'page':>5}{'keys':>12}{'ours ms':>9}{'of copy':>8}{'vs ours':>8}"
          f"{'vs fa3':>7}{'fp8 x':>7}  met   (vs ours: over the dense decode, or the varlen forward)")
    for r in rows:
        keys = "-".join(map(str, r["contexts"])) if "contexts" in r else str(r["seq"])
        ours = r.get("ours_ms", r.get("fp8_ms"))
        vs = r.get("vs_dense", r.get("vs_varlen"))
        x = r.get("fp8_kv_speedup", r.get("fp8_speedup"))
        print(f"{r['name']:<18}{r['batch']:>4}{r.get('page_size', '-'):>5}{keys:>12}{f(ours, '.4f'):>9}"
              f"{f(r.get('ours_frac_of_copy')):>8}{f(vs):>8}{f(r.get('vs_fa3')):>7}{f(x):>7}  {r['met']}")
        for k, why in r["refused"].items():
            print(f"    {r['name']}: {k} not run: {why}")
