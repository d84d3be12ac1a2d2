"""The issue-56 attention feature section of bench_gpu.py (--only features): our attention through the public
API (jax_aiter.flash_attn_func) with each feature, against our own dense kernel and against cuDNN through
jax.nn.dot_product_attention in the same run, in bfloat16 at batch 1 x 16k tokens, 32 heads of 128 (head dims:
8k tokens). Each row states its issue-56 goal, the measured ratio and whether it is met.

- packed: documents of mixed lengths (128 to 8k) packed into one 16k row, causal within each document, forward
  and backward: ours as varlen (cu_seqlens) and as segment_ids, our dense causal kernel on the same tokens, cuDNN
  with the packing as a segment mask, and cuDNN with the documents padded to one batch (query/key seq lengths).
  Our throughput is FLOPs of the visible pairs per second. Bound rows: the dense causal kernel on a batch of
  documents of each length, summed over the documents (the goal's ratio at the dense kernel's own per-length rate).
- window: windows of 1k and 4k in 16k, causal and not, forward and backward, against the unmasked fraction of
  our full (unmasked) time and against cuDNN's local_window_size; each row also gives cuDNN's own window time
  against the unmasked fraction of cuDNN's full time (what the goal's ratio is for the field's kernel). Bound
  rows: dense attention over sequences as long as a window is wide, against the same fraction of the full time.
- softcap 50 and ALiBi: against our causal time without them.
- head dims 40, 80, 112, 160, 192 against the next kernel head dim up (64, 96, 128, 256, 256): FLOP rates, and
  cuDNN's rate ratio between the same two head dims beside ours.
- deterministic backward against the default backward (the backward alone timed).
- bias and dropout: they take the SIMT kernels on CUDA, which issue 56 lets be slower (measured, no goal): at
  4k tokens, against our causal time without them and (bias) against cuDNN given the same bias.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import jax_aiter as ja
from benchmarks.gpu.gpu_timing import median, n_sets, rand, time_cases

SEQ, HEADS, HEAD_DIM = 16384, 32, 128
DOCS = (8192, 3072, 2048, 1536, 768, 384, 256, 128)  # 16384 tokens: one packed row
WINDOWS = (1024, 4096)
SOFTCAP = 50.0
HEAD_DIM_PAIRS = ((40, 64), (80, 96), (112, 128), (160, 256), (192, 256))
HEAD_DIM_SEQ = 8192
BIAS_SEQ = 4096  # the bias and dropout rows (a [seq, seq] bias, the SIMT kernels)
GOALS = {"varlen_of_dense": 0.9, "varlen_vs_cudnn_segment": 4.0, "window_of_visible_dense": 1.2,
         "window_vs_cudnn": 1.0, "softcap": 1.15, "alibi": 1.1, "head_dim_rate": 0.85, "deterministic": 1.3}
# a row's goal ratio as cuDNN reaches it
ANCHOR_RATIOS = ("anchor_of_visible_dense", "anchor_rate_ratio", "anchor_of_dense_rate")


def visible_pairs(seq: int, causal: bool, window=(-1, -1)) -> int:
    """Query-key pairs a dense [seq, seq] mask with this causal flag and window lets through."""
    i = np.arange(seq, dtype=np.int64)
    left, right = window
    right = 0 if causal else right
    lo = np.zeros_like(i) if left < 0 else np.clip(i - left, 0, seq)
    hi = np.full_like(i, seq) if right < 0 else np.clip(i + right + 1, 0, seq)
    return int(np.maximum(hi - lo, 0).sum())


def doc_pairs(docs, causal: bool = True) -> int:
    return int(sum(n * (n + 1) // 2 if causal else n * n for n in docs))


def fwd_bwd(f):
    """One timed forward and backward: the vjp of f at (q, k, v) applied to g."""
    return lambda q, k, v, g: jax.vjp(f, q, k, v)[1](g)


def bwd_only(f):
    """The backward alone: the forward and its vjp are built untimed (bench_gpu.bench_attention's way)."""
    return (lambda q, k, v, g: (jax.vjp(f, q, k, v)[1], g)), (lambda tree: tree[0](tree[1]))


def dense_cases(causal: bool) -> dict:
    """Plain attention, forward and backward, ours ("ours") and cuDNN's ("cudnn"): the dense cases every section
    measures the features against."""
    return {"ours": fwd_bwd(lambda q, k, v: ja.flash_attn_func(q, k, v, causal=causal)),
            "cudnn": fwd_bwd(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal,
                                                                          implementation="cudnn"))}


def _named(cases: dict, fmt: str) -> dict:
    """dense_cases' cases under the names a section's times use: fmt.format(who) for "ours" and "cudnn"."""
    return {fmt.format(who): case for who, case in cases.items()}


def _sets(b, s, h, d, seed, hkv=None):
    hkv = hkv or h
    per = 2 * b * s * (2 * h + 2 * hkv) * d
    return [(rand((b, s, h, d), jnp.bfloat16, seed + 10 * i), rand((b, s, hkv, d), jnp.bfloat16, seed + 10 * i + 1),
             rand((b, s, hkv, d), jnp.bfloat16, seed + 10 * i + 2), rand((b, s, h, d), jnp.bfloat16, seed + 10 * i + 3))
            for i in range(n_sets(per))]


def _time(lib, cases: dict, sets, reps: int, refused: dict) -> dict[str, float]:
    """Median ms of each case that compiles; a refused anchor (cuDNN declining a shape) is recorded, not run."""
    ok = {}
    for name, case in cases.items():
        fn = case if callable(case) else None
        if fn is not None and name.startswith("cudnn"):
            try:
                jax.jit(fn).lower(*sets[0]).compile()
            except Exception as e:  # noqa: BLE001 -- any refusal is recorded, the run goes on
                refused[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:240]}"
                continue
        ok[name] = case
    return {k: median(v) for k, v in time_cases(lib, ok, sets, reps).items()}


def _row(section, case, ms, ratio, goal_name, goal_text, better_low, **extra):
    goal = None if goal_name is None else GOALS[goal_name]  # a name not in GOALS stays an error
    met = None if ratio is None or goal is None else (ratio <= goal if better_low else ratio >= goal)
    return {"section": section, "case": case, "ms": ms, "ratio": ratio, "goal": goal_text, "met": met, **extra}


def _reported(section, case, ms, ratio, **extra):
    """A row measured and reported, with no goal (bias and dropout: the slower path issue 56 allows)."""
    return _row(section, case, ms, ratio, None, "reported", True, **extra)


def bench_packed(lib, reps, refused):
    cu = np.concatenate([[0], np.cumsum(DOCS)]).astype(np.int32)
    ids = np.repeat(np.arange(len(DOCS), dtype=np.int32), DOCS)[None]
    cu_d, ids_d = jnp.asarray(cu), jnp.asarray(ids)
    lens = jnp.asarray(DOCS, jnp.int32)
    width = max(DOCS)
    # the padded batch's token index per (document, position); positions past a document's length read token 0
    pad_idx = jnp.asarray(np.stack([np.where(np.arange(width) < n, c + np.arange(width), 0)
                                    for c, n in zip(cu[:-1], DOCS)]))

    def cudnn_padded(q, k, v):
        qp, kp, vp = (x[0][pad_idx] for x in (q, k, v))  # [docs, width, h, d]
        o = jax.nn.dot_product_attention(qp, kp, vp, is_causal=True, query_seq_lengths=lens, key_value_seq_lengths=lens,
                                         implementation="cudnn")
        valid = (jnp.arange(width)[None] < lens[:, None])[..., None, None]
        return jnp.zeros_like(q[0]).at[pad_idx].add(jnp.where(valid, o, 0))[None]

    def cudnn_segment(q, k, v):
        mask = (ids_d[:, :, None] == ids_d[:, None, :])[:, None]  # [1, 1, s, s]
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, mask=mask, implementation="cudnn")

    cases = {
        **_named(dense_cases(True), "{}_dense_causal"),
        "ours_varlen": fwd_bwd(lambda q, k, v: ja.flash_attn_func(q[0], k[0], v[0], causal=True, cu_seqlens_q=cu_d,
                                                                  cu_seqlens_kv=cu_d)[None]),
        "ours_segment_ids": fwd_bwd(lambda q, k, v: ja.flash_attn_func(q, k, v, causal=True, segment_ids=ids_d)),
        "cudnn_segment_mask": fwd_bwd(cudnn_segment),
        "cudnn_padded_seq_lengths": fwd_bwd(cudnn_padded),
    }
    t = _time(lib, cases, _sets(1, SEQ, HEADS, HEAD_DIM, 1000), reps, refused)
    dense_rate = visible_pairs(SEQ, True) / t["ours_dense_causal"]
    rows = []
    for name in ("ours_varlen", "ours_segment_ids"):
        rate = doc_pairs(DOCS) / t[name]
        rows.append(_row("packed", f"{name} (fwd+bwd) FLOP rate / our dense causal's", t[name], rate / dense_rate,
                         "varlen_of_dense", ">= 0.9", False, dense_ms=t["ours_dense_causal"]))
        for anchor in ("cudnn_segment_mask", "cudnn_padded_seq_lengths", "cudnn_dense_causal"):
            if anchor in t:
                goal = ">= 4 (cuDNN time / ours)" if anchor == "cudnn_segment_mask" else "reported"
                rows.append(_row("packed", f"{name} vs {anchor}: speedup", t[name], t[anchor] / t[name],
                                 "varlen_vs_cudnn_segment", goal, False, anchor_ms=t[anchor]))
                if anchor != "cudnn_segment_mask":
                    rows[-1]["met"] = None
    rows.append({"section": "packed", "case": "times (ms)", "times": t,
                 "visible_fraction_of_causal": doc_pairs(DOCS) / visible_pairs(SEQ, True)})
    rows += packed_bound_rows(t, {n: _time(lib, dense_cases(True), _sets(SEQ // n, n, HEADS, HEAD_DIM, 1100 + n),
                                           reps, refused) for n in sorted(set(DOCS))})
    return rows


def packed_bound_rows(t: dict[str, float], per_length: dict[int, dict[str, float]]) -> list[dict]:
    """What a kernel as fast as our dense one at each document's own length would reach. per_length[n] times the
    dense causal kernel on SEQ // n documents of length n (the GPU as full as in the packed row); each document
    of DOCS costs its share, time / (SEQ // n), and their sum is the packed row's time at the dense kernel's
    per-length rates. The first row is varlen's goal ratio at those rates (the bound the dense kernel sets on the
    0.9 goal: short documents run shorter loops, whatever the packing), with cuDNN's own where it ran; the second
    is our varlen time over that sum (1: varlen costs nothing over running each document alone)."""
    sums = {}
    for who in ("ours", "cudnn"):
        if all(who in per_length[n] for n in DOCS):
            sums[who] = sum(per_length[n][who] / (SEQ // n) for n in DOCS)
    if "ours" not in sums:
        return []
    frac = doc_pairs(DOCS) / visible_pairs(SEQ, True)
    extra = {"anchor_of_dense_rate": frac * t["cudnn_dense_causal"] / sums["cudnn"]} \
        if "cudnn" in sums and "cudnn_dense_causal" in t else {}
    return [_reported("packed", "bound: each document as its own dense causal batch, FLOP rate / our dense causal's",
                      sums["ours"], frac * t["ours_dense_causal"] / sums["ours"], dense_ms=t["ours_dense_causal"],
                      per_length_ms={n: per_length[n] for n in sorted(per_length)}, **extra),
            _reported("packed", "ours_varlen time / the documents' dense time at their own lengths", t["ours_varlen"],
                      t["ours_varlen"] / sums["ours"], bound_ms=sums["ours"])]


def _window_tag(w: int, causal: bool) -> str:
    """A window's name in its cases: 1k_causal, 4k_both; a width that is not whole kibi-tokens by its count."""
    return f"{f'{w // 1024}k' if w % 1024 == 0 else w}_{'causal' if causal else 'both'}"


def window_cases() -> list[tuple[str, bool, tuple[int, int]]]:
    """(tag, causal, window_size) of each window row: every width, causal (no right window) and both-sided."""
    return [(_window_tag(w, causal), causal, (w, 0 if causal else w)) for w in WINDOWS for causal in (True, False)]


def bench_windows(lib, reps, refused):
    sets = _sets(1, SEQ, HEADS, HEAD_DIM, 2000)
    cases = _named(dense_cases(False), "{}_full")
    for tag, causal, win in window_cases():
        cases[f"ours_{tag}"] = fwd_bwd(lambda q, k, v, c=causal, win=win:
                                       ja.flash_attn_func(q, k, v, causal=c, window_size=win))
        cases[f"cudnn_{tag}"] = fwd_bwd(lambda q, k, v, c=causal, win=win: jax.nn.dot_product_attention(
            q, k, v, is_causal=c, local_window_size=win, implementation="cudnn"))
    t = _time(lib, cases, sets, reps, refused)
    for keys in bound_lengths():
        t |= _time(lib, _named(dense_cases(False), f"{{}}_dense_{keys}"),
                   _sets(SEQ // keys, keys, HEADS, HEAD_DIM, 2100 + keys), reps, refused)
    return window_rows(t)


def bound_lengths() -> list[int]:
    """The keys a window row's query sees, about: w causal, 2 w both-sided; each the length of one bound row."""
    return sorted({n for w in WINDOWS for n in (w, 2 * w) if n <= SEQ})


def window_rows(t: dict[str, float]) -> list[dict]:
    """The window rows from the section's times. Each first row also carries cuDNN's same ratio against its own
    full time (`anchor_of_visible_dense`), where cuDNN ran both: the goal's ratio as the field's kernel reaches it.
    Then a bound row for each of bound_lengths() (reported, no goal): the dense kernel on batches of sequences as
    long as a window's rows are wide, against the same fraction of its full time. Its blocks run as few
    iterations as a window's do, so its ratio is what the goal's ratio costs before any masking: the per-block
    costs (loading K and V, storing dK and dV, filling the pipeline) that a 16k block spreads over 128 tiles."""
    rows = []
    for tag, causal, win in window_cases():
        frac = visible_pairs(SEQ, causal, win) / SEQ ** 2
        ours, anchor = t[f"ours_{tag}"], t.get(f"cudnn_{tag}")
        extra = {} if anchor is None or "cudnn_full" not in t else \
            {"anchor_of_visible_dense": anchor / (frac * t["cudnn_full"])}
        rows.append(_row("window", f"window {tag}: time / (visible {frac:.3f} x our full time)", ours,
                         ours / (frac * t["ours_full"]), "window_of_visible_dense", "<= 1.2", True,
                         full_ms=t["ours_full"], **extra))
        if anchor is not None:
            rows.append(_row("window", f"window {tag}: ours / cuDNN local_window_size", ours, ours / anchor,
                             "window_vs_cudnn", "<= 1.0", True, anchor_ms=anchor))
    for keys in bound_lengths():
        if f"ours_dense_{keys}" not in t:
            continue
        frac = keys / SEQ  # (SEQ / keys) x keys^2 pairs over SEQ^2
        extra = {"anchor_of_visible_dense": t[f"cudnn_dense_{keys}"] / (frac * t["cudnn_full"])} \
            if f"cudnn_dense_{keys}" in t and "cudnn_full" in t else {}
        ms = t[f"ours_dense_{keys}"]
        rows.append(_reported("window", f"bound: dense, {SEQ // keys} x {keys} tokens (each query sees {keys} keys, as "
                              f"in a window): time / (visible {frac:.3f} x our full time)", ms,
                              ms / (frac * t["ours_full"]), full_ms=t["ours_full"], **extra))
    return rows


def bench_terms(lib, reps, refused):
    slopes = jnp.asarray(2.0 ** (-8.0 * (np.arange(HEADS) + 1) / HEADS), jnp.float32)
    cases = {
        "ours_causal": fwd_bwd(lambda q, k, v: ja.flash_attn_func(q, k, v, causal=True)),
        "ours_causal_softcap": fwd_bwd(lambda q, k, v: ja.flash_attn_func(q, k, v, causal=True, softcap=SOFTCAP)),
        "ours_causal_alibi": fwd_bwd(lambda q, k, v: ja.flash_attn_func(q, k, v, causal=True, alibi_slopes=slopes)),
    }
    t = _time(lib, cases, _sets(1, SEQ, HEADS, HEAD_DIM, 3000), reps, refused)
    return [_row("softcap", f"softcap {SOFTCAP:g}, causal, fwd+bwd: time / no softcap", t["ours_causal_softcap"],
                 t["ours_causal_softcap"] / t["ours_causal"], "softcap", "<= 1.15", True, base_ms=t["ours_causal"]),
            _row("alibi", "ALiBi, causal, fwd+bwd: time / no ALiBi", t["ours_causal_alibi"],
                 t["ours_causal_alibi"] / t["ours_causal"], "alibi", "<= 1.1", True, base_ms=t["ours_causal"])]


def bench_head_dims(lib, reps, refused):
    t = {}
    for d, ref in HEAD_DIM_PAIRS:
        for dim in (d, ref):
            if f"ours_d{dim}" in t:
                continue
            t |= _time(lib, _named(dense_cases(False), f"{{}}_d{dim}"), _sets(1, HEAD_DIM_SEQ, HEADS, dim, 4000 + dim),
                       reps, refused)
    return head_dim_rows(t)


def head_dim_rows(t: dict[str, float]) -> list[dict]:
    """The head-dim rows from the section's times: FLOP rate at d over the rate at the next kernel's head dim. Where
    cuDNN ran both dims, the row also carries cuDNN's same ratio (`anchor_rate_ratio`): how far the field's kernel
    keeps its rate at that head dim."""
    rows = []
    for d, ref in HEAD_DIM_PAIRS:
        ms, ref_ms = t[f"ours_d{d}"], t[f"ours_d{ref}"]
        extra = {}
        if f"cudnn_d{d}" in t and f"cudnn_d{ref}" in t:
            extra["anchor_rate_ratio"] = (d / t[f"cudnn_d{d}"]) / (ref / t[f"cudnn_d{ref}"])
        rows.append(_row("head_dim", f"head dim {d} FLOP rate / head dim {ref}'s (fwd+bwd, {HEAD_DIM_SEQ} tokens)",
                         ms, (d / ms) / (ref / ref_ms), "head_dim_rate", ">= 0.85", False, ref_ms=ref_ms, **extra))
    return rows


def bench_deterministic(lib, reps, refused):
    rows = []
    for hkv in (HEADS, 8):
        cases = {"default": bwd_only(lambda q, k, v: ja.flash_attn_func(q, k, v, causal=True)),
                 "deterministic": bwd_only(lambda q, k, v: ja.flash_attn_func(q, k, v, causal=True,
                                                                               deterministic=True))}
        t = _time(lib, cases, _sets(1, SEQ, HEADS, HEAD_DIM, 5000 + hkv, hkv), reps, refused)
        rows.append(_row("deterministic", f"deterministic backward / default, causal, heads {HEADS}/{hkv}",
                         t["deterministic"], t["deterministic"] / t["default"], "deterministic", "<= 1.3", True,
                         base_ms=t["default"]))
    return rows


def bench_bias_dropout(lib, reps, refused):
    bias = jnp.asarray(np.random.default_rng(6000).standard_normal((BIAS_SEQ, BIAS_SEQ)), jnp.bfloat16)
    key = jax.random.key(6001)
    cases = {
        "ours_causal": fwd_bwd(lambda q, k, v: ja.flash_attn_func(q, k, v, causal=True)),
        "ours_causal_bias": fwd_bwd(lambda q, k, v: ja.flash_attn_func(q, k, v, causal=True, bias=bias)),
        "ours_causal_dropout": fwd_bwd(lambda q, k, v: ja.flash_attn_func(q, k, v, causal=True, dropout_p=0.1,
                                                                         dropout_key=key)),
        "cudnn_causal_bias": fwd_bwd(lambda q, k, v: jax.nn.dot_product_attention(
            q, k, v, bias=bias[None, None], is_causal=True, implementation="cudnn")),
    }
    t = _time(lib, cases, _sets(1, BIAS_SEQ, HEADS, HEAD_DIM, 6000), reps, refused)
    base = t["ours_causal"]
    rows = [_reported("bias", f"bias [{BIAS_SEQ}, {BIAS_SEQ}], causal, fwd+bwd (SIMT): time / no bias",
                      t["ours_causal_bias"], t["ours_causal_bias"] / base, base_ms=base),
            _reported("dropout", f"dropout 0.1, causal, {BIAS_SEQ} tokens, fwd+bwd (SIMT): time / no dropout",
                      t["ours_causal_dropout"], t["ours_causal_dropout"] / base, base_ms=base)]
    if "cudnn_causal_bias" in t:
        rows.append(_reported("bias", "bias, causal, fwd+bwd: ours / cuDNN with the same bias", t["ours_causal_bias"],
                              t["ours_causal_bias"] / t["cudnn_causal_bias"], anchor_ms=t["cudnn_causal_bias"]))
    return rows


def bench_features(lib, reps):
    """Every section's rows, then one row of the cuDNN anchors that declined (and why)."""
    refused: dict[str, str] = {}
    rows = []
    for section in (bench_packed, bench_windows, bench_terms, bench_head_dims, bench_deterministic, bench_bias_dropout):
        new = section(lib, reps, refused)
        print_table(new)  # as each section ends: a run cut short still shows what it measured
        rows += new
    if refused:
        rows.append({"section": "refused", "case": "cuDNN anchors that did not compile", "refused": refused})
    return rows


def print_table(rows) -> None:
    print(f"\n{'issue 56':<14}{'case':<78}{'ours ms':>9}{'ratio':>8}  {'goal':<22}met")
    for r in rows:
        if "ratio" not in r:
            extra = r.get("times") or r.get("refused")
            print(f"{r['section']:<14}{r['case']:<78}  {extra}")
            continue
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.3f}"
        met = "-" if r["met"] is None else r["met"]
        anchor = next((f"  (cuDNN's own: {r[k]:.3f})" for k in ANCHOR_RATIOS if k in r), "")
        print(f"{r['section']:<14}{r['case']:<78}{r['ms']:>9.3f}{ratio:>8}  {r['goal']:<22}{met}{anchor}", flush=True)
