"""The attention section of bench_gpu.py (--only attention): dense prefill attention, ours against cuDNN (through
jax.nn.dot_product_attention) and FlashAttention-3 (the flash-attn3-jax wheel: FA3's Hopper kernels behind XLA FFI)
in the same run, on the same inputs, in bfloat16.

Cases (issue 82): sequence lengths 1k to 32k with batch x length = 32k tokens, 32 heads (16 at head dim 256), head
dims 64, 128 and 256, causal and full. --quick runs the perf gate's cases: batch 4 x 1k, 2 x 16k and 1 x 32k at
head dim 128. Each case times the forward alone and the backward alone (the forward and its vjp built untimed);
forward+backward is their sum. FLOPs: 4 b h s^2 d for the forward, half that causal; the backward counts 2.5x
the forward's. Each backward row states issue 82's goals for it and whether they are met.

FlashAttention-3 is an optional import: where flash_attn3_jax is not installed, or refuses a case, its column is
left out with the reason printed and recorded in the JSON (the row's "refused").
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

import jax_aiter as ja
from benchmarks.gpu.gpu_timing import median, n_sets, rand, time_cases

TOKENS = 32768  # batch x length of every case of the full grid
SEQS = (1024, 2048, 4096, 8192, 16384, 32768)
HEAD_DIMS = (64, 128, 256)
QUICK = ((4, 1024), (2, 16384), (1, 32768))  # (batch, length): the perf gate's cases, head dim 128
XLA_MAX_SEQ = 1024  # the XLA route materialises b h s^2 scores: beyond this, gigabytes per call
# Issue #30's goals for the forward, as fractions of cuDNN's FLOP rate in the same run.
GOAL_FWD_D128, GOAL_FWD_OTHER_D = 0.75, 0.60
# Issue #82's goals for the backward: TF/s of the backward alone at 16k and 32k tokens, (full, causal) per head
# dim; the backward's share of the forward's time at head dim 128 from 4k tokens on.
GOAL_BWD_TFLOPS = {64: (450.0, 450.0), 128: (560.0, 540.0), 256: (480.0, 480.0)}
GOAL_BWD_SHARE = 2.9


def heads(d: int) -> int:
    return 16 if d == 256 else 32


def attn_flops(b, h, s, d, causal):
    f = 4 * b * h * s * s * d
    return f / 2 if causal else f


def grid(quick: bool, head_dims) -> list[tuple[int, int, int]]:
    """(head dim, batch, length) of every case, in the order they run."""
    if quick:
        return [(d, b, s) for d in (head_dims or (128,)) for b, s in QUICK]
    return [(d, TOKENS // s, s) for d in (head_dims or HEAD_DIMS) for s in SEQS]


def fa3() -> tuple[object | None, str | None]:
    """flash_attn3_jax, or None and why it is left out."""
    try:
        import flash_attn3_jax
    except Exception as e:  # noqa: BLE001 -- an absent or broken anchor is reported, the run goes on
        return None, (f"FlashAttention-3 column left out: flash_attn3_jax does not import ({type(e).__name__}: "
                      f"{str(e).splitlines()[0][:200] if str(e) else ''}); pip install flash-attn3-jax")
    return flash_attn3_jax, None


def forwards(causal: bool, s: int, fa3_mod) -> dict:
    """name -> f(q, k, v): the forward of each implementation timed for this case."""
    out = {
        "ours": lambda q, k, v: ja.flash_attn_func(q, k, v, causal=causal),
        "cudnn": lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="cudnn"),
    }
    if fa3_mod is not None:
        out["fa3"] = lambda q, k, v: fa3_mod.flash_mha(q, k, v, is_causal=causal)
    if s <= XLA_MAX_SEQ:
        out["xla"] = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="xla")
    return out


def _refusal(f, args) -> str | None:
    """None when f and its gradient compile for args, else the reason (an anchor declining a shape)."""
    try:
        jax.jit(f).lower(*args).compile()
        jax.jit(lambda *a: jax.vjp(f, *a)[1](a[0])).lower(*args).compile()
        return None
    except Exception as e:  # noqa: BLE001 -- any refusal is recorded, the rest of the run goes on
        return f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"


def bwd_only(f):
    """The backward alone: the forward and its vjp are built untimed, only applying the vjp is timed."""
    return (lambda q, k, v, g: (jax.vjp(f, q, k, v)[1], g)), (lambda tree: tree[0](tree[1]))


def _ratios(row: dict, key: str, name: str) -> dict:
    """{f"{name}_{anchor}": ours / the anchor's} for each anchor (cuDNN, FA3) that has `key` in the row."""
    return {f"{name}_{a}": row[f"ours_{key}"] / row[f"{a}_{key}"] for a in ("cudnn", "fa3") if f"{a}_{key}" in row}


def bwd_goals(d: int, s: int, causal: bool, fwd_ms: dict, bwd_ms: dict, bwd_tflops: float) -> dict:
    """Issue 82's goals for one case: {goal text: met}."""
    goals = {}
    total = {k: fwd_ms[k] + bwd_ms[k] for k in bwd_ms if k in fwd_ms}
    if "cudnn" in total:
        goals["fwd+bwd <= cuDNN's"] = total["ours"] <= total["cudnn"]
    if s >= 16384 and d in GOAL_BWD_TFLOPS:
        want = GOAL_BWD_TFLOPS[d][1 if causal else 0]
        goals[f"backward >= {want:.0f} TF/s"] = bwd_tflops >= want
    if s >= 16384 and d in (128, 256) and "fa3" in total:
        goals["fwd+bwd <= FA3's"] = total["ours"] <= total["fa3"]
    if d == 128 and s >= 4096:
        goals[f"backward <= {GOAL_BWD_SHARE}x the forward"] = bwd_ms["ours"] <= GOAL_BWD_SHARE * fwd_ms["ours"]
    return goals


def bench_attention(lib, reps: int, quick: bool, head_dims=None, log=print, progress=lambda rows: None) -> list[dict]:
    """The section's rows; progress(rows) after each case, so a run cut short keeps the cases it timed."""
    fa3_mod, why = fa3()
    if why:
        log(why)
    rows = []
    for d, b, s in grid(quick, head_dims):
        h = heads(d)
        for causal in (False, True):
            sets = [tuple(rand((b, s, h, d), jnp.bfloat16, 10 * i + j) for j in range(3))
                    for i in range(n_sets(3 * b * s * h * d * 2))]
            fwd = forwards(causal, s, fa3_mod)
            refused = {} if why is None else {"fa3": why}
            for name in [n for n in fwd if n != "ours"]:
                if (r := _refusal(fwd[name], sets[0])) is not None:
                    refused[name] = r
                    fwd.pop(name)
                    log(f"  {name} left out of d{d} b{b} seq{s} {'causal' if causal else 'full'}: {r}")
            flops = attn_flops(b, h, s, d, causal)
            base = {"seq": s, "batch": b, "heads": h, "causal": causal, "head_dim": d, "refused": refused}
            t = {k: median(v) for k, v in time_cases(lib, fwd, sets, reps).items()}
            row = {"name": "flash_attn_fwd", **base, **{f"{k}_ms": v for k, v in t.items()},
                   **{f"{k}_TFLOPs": flops / v / 1e9 for k, v in t.items()}}
            row |= _ratios(row, "TFLOPs", "frac_of")
            goal = GOAL_FWD_D128 if d == 128 else GOAL_FWD_OTHER_D
            row["met"] = (row.get("frac_of_cudnn", 0.0) >= goal
                          and ("xla_ms" not in row or row["ours_ms"] < row["xla_ms"]))
            rows.append(row)

            bsets = [(*st, rand((b, s, h, d), jnp.bfloat16, 777 + i)) for i, st in enumerate(sets)]
            bwd = {k: bwd_only(fwd[k]) for k in fwd if k != "xla"}
            t2 = {k: median(v) for k, v in time_cases(lib, bwd, bsets, reps).items()}
            row2 = {"name": "flash_attn_bwd", **base, **{f"{k}_ms": v for k, v in t2.items()},
                    **{f"{k}_TFLOPs": 2.5 * flops / v / 1e9 for k, v in t2.items()},
                    **{f"{k}_fwd_bwd_ms": t[k] + v for k, v in t2.items()}}
            row2 |= _ratios(row2, "TFLOPs", "frac_of") | _ratios(row2, "fwd_bwd_ms", "fwd_bwd_vs")
            row2["bwd_over_fwd"] = t2["ours"] / t["ours"]
            row2["goals"] = bwd_goals(d, s, causal, t, t2, row2["ours_TFLOPs"])
            row2["met"] = all(row2["goals"].values())
            rows.append(row2)
            progress(rows)
    return rows


def print_table(rows: list[dict]) -> None:
    """One line a case and pass: TF/s of ours, cuDNN and FA3, our time against theirs (fwd+bwd on the backward
    lines), the backward's share of the forward and the goals missed."""
    def f(r, key, fmt=".1f"):
        return format(r[key], fmt) if key in r else "-"

    print(f"{'attention':<15}{'d':>4}{'b':>3}{'seq':>6}{'causal':>7}{'ours':>8}{'cudnn':>8}{'fa3':>8}  TF/s"
          f"{'of cudnn':>10}{'of fa3':>8}{'f+b/cudnn':>10}{'f+b/fa3':>9}{'bwd/fwd':>8}  met")
    for r in rows:
        missed = [g for g, ok in r.get("goals", {}).items() if not ok]
        print(f"{r['name']:<15}{r['head_dim']:>4}{r['batch']:>3}{r['seq']:>6}{str(r['causal']):>7}"  # noqa: RUF010
              f"{f(r, 'ours_TFLOPs'):>8}{f(r, 'cudnn_TFLOPs'):>8}{f(r, 'fa3_TFLOPs'):>8}      "
              f"{f(r, 'frac_of_cudnn', '.2f'):>10}{f(r, 'frac_of_fa3', '.2f'):>8}{f(r, 'fwd_bwd_vs_cudnn', '.2f'):>10}"
              f"{f(r, 'fwd_bwd_vs_fa3', '.2f'):>9}{f(r, 'bwd_over_fwd', '.2f'):>8}  {r['met']}"
              + (f"  (missed: {'; '.join(missed)})" if missed else ""))
    for r in rows:
        for k, why in r.get("refused", {}).items():
            if k != "fa3" or "does not import" not in why:
                print(f"    {r['name']} d{r['head_dim']} seq{r['seq']}: {k} not run: {why}")
