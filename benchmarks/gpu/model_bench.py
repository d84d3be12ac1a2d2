"""The model section of bench_gpu.py: the Llama-like decoder of llama.py, ours against plain JAX.

Each workload builds one set of weights and runs it through both models (llama.our_ops and
llama.plain_ops, cuDNN attention where cuDNN takes the shape). First a check that the two agree
(logits, loss, gradients: relative L2 error against plain JAX), then host-timed samples: one sample
is `calls` back-to-back calls of the jitted step (dispatched asynchronously, as a training or serving
loop runs them) and one wait at the end; ours and plain alternate sample by sample, after two untimed
calls of each. The figure is the median sample divided by `calls`; the JSON keeps every sample.
Host timing is deliberate: a model step includes what a per-kernel event cannot see (launch gaps
between XLA's kernels and ours, command buffers, the host's dispatch).
"""
from __future__ import annotations

import re
import statistics
import time
from collections import Counter
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from benchmarks.gpu import llama


@dataclass(frozen=True)
class Workload:
    name: str
    kind: str            # prefill, train or decode
    cfg: llama.Config
    batch: int
    seq: int             # tokens per sequence (prefill, train) or keys in the cache (decode)
    calls: int           # calls per timed sample
    goal: float = 1.0    # ours must take at most 1/goal of plain JAX's time


HKV4 = llama.LLAMA.with_(heads_kv=4)
WORKLOADS = (
    Workload("prefill b4 s2048", "prefill", llama.LLAMA, 4, 2048, 3),
    Workload("train b4 s2048", "train", llama.LLAMA, 4, 2048, 2),
    Workload("decode b8 kv8k", "decode", llama.LLAMA, 8, 8192, 32),
    Workload("decode b8 kv32k", "decode", llama.LLAMA, 8, 32768, 32),
    Workload("decode b8 kv8k hkv4", "decode", HKV4, 8, 8192, 32, goal=1.15),
    Workload("decode b8 kv32k hkv4", "decode", HKV4, 8, 32768, 32, goal=1.15),
    Workload("train d256 b4 s2048", "train", llama.GEMMA_LIKE, 4, 2048, 2),
    # issue 56: documents of mixed lengths packed into one 16k row (ours varlen, plain cuDNN with a segment
    # mask), and Gemma 2's attention (window 4096 on alternate layers, softcap 50: plain JAX takes XLA's path)
    Workload("train packed docs b1 s16k", "train", llama.LLAMA.with_(docs=llama.PACKED_DOCS), 1, 16384, 1, goal=1.8),
    Workload("train gemma2 win4k cap50 s8k", "train", llama.GEMMA_LIKE.with_(window=4096, softcap=50.0), 1, 8192, 1,
             goal=2.0),
    # issue 82: each layer under jax.checkpoint (llama.remat_policy: dots and our attention's named residuals
    # saved), so neither model recomputes its attention in the gradient
    Workload("train remat b4 s2048", "train", llama.LLAMA.with_(remat=True), 4, 2048, 2),
    # issue 82: long-context training, where the attention backward weighs most: at most 0.9x plain JAX's time
    Workload("train b1 s16k", "train", llama.LLAMA, 1, 16384, 1, goal=1 / 0.9),
    Workload("train b1 s32k", "train", llama.LLAMA, 1, 32768, 1, goal=1 / 0.9),
)
# --quick runs these (and the perf gate's baseline holds them); a full run adds the others.
QUICK = ("prefill b4 s2048", "train b4 s2048", "decode b8 kv8k", "decode b8 kv8k hkv4")
# --model-swaps: plain JAX with one group of our ops swapped in, so a difference between the two
# models can be put on the op it comes from (a custom call also changes what XLA fuses around it).
SWAPS = {"attention": ("attention",), "norms": ("rms_norm", "rms_norm_add"), "silu_and_mul": ("silu_and_mul",)}
# The step with attention taken out (llama.without_attention; only for a workload whose goal is over 1, the
# issue-56 ones, where attention is what is asked to be faster): plain / its time is the most any attention
# kernel could give, so a goal above it is out of reach whatever the kernel.
FLOOR = "ours without attention"
# Largest relative L2 error against plain JAX (bf16 weights and activations, float32 accumulation)
# at which the two models are said to agree: logits, the loss, and the worst single gradient.
AGREE = {"logits": 2e-2, "loss": 5e-3, "grad": 5e-2}


def plain_attention(w: Workload) -> tuple[str | None, str | None]:
    """("cudnn", None) when cuDNN compiles this workload's attention (and its gradient for a train
    step), else (None, why): plain JAX then lets jax.nn.dot_product_attention pick."""
    cfg = w.cfg
    sq, sk = (1, w.seq) if w.kind == "decode" else (w.seq, w.seq)
    q = jax.ShapeDtypeStruct((w.batch, sq, cfg.heads_q, cfg.head_dim), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((w.batch, sk, cfg.heads_kv, cfg.head_dim), jnp.bfloat16)
    attn = llama.plain_ops("cudnn").attention
    try:
        for layer in range(min(2, cfg.layers)):  # the even and the odd layers' attention
            feats = cfg.attention_features(layer) if w.kind != "decode" else {}
            f = (lambda q, k, v, feats=feats: attn(q, k, v, w.kind != "decode", **feats))
            g = jax.grad(lambda q, k, v, f=f: f(q, k, v).astype(jnp.float32).sum(), argnums=(0, 1, 2))
            jax.jit(f).lower(q, kv, kv).compile()
            if w.kind == "train":
                jax.jit(g).lower(q, kv, kv).compile()
        return "cudnn", None
    except Exception as e:  # noqa: BLE001 -- any refusal is recorded and the default implementation runs
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"


def build(w: Workload, ops: llama.Ops, params, key):
    """(step, state, outputs): step(state) -> state runs one call; outputs are what the check compares,
    and under "hlo" the launch census of the compiled step (hlo_launches)."""
    cfg = w.cfg
    if w.kind == "decode":
        fn = jax.jit(lambda p, c, t, pos: llama.decode_step(cfg, ops, p, c, t, pos), donate_argnums=(1,))
        token = jax.random.randint(jax.random.fold_in(key, 1), (w.batch,), 0, cfg.vocab)
        pos = jnp.int32(w.seq - 1)
        cache = llama.init_cache(cfg, jax.random.fold_in(key, 2), w.batch, w.seq)
        hlo = hlo_launches(fn, params, cache, token, pos)  # before the call donates the cache
        logits, cache = fn(params, cache, token, pos)
        return (lambda c: fn(params, c, token, pos)[1]), cache, {"logits": logits, "hlo": hlo}
    if w.kind == "prefill":
        fn = jax.jit(lambda p, t: llama.forward(cfg, ops, p, t))
        tokens = jax.random.randint(jax.random.fold_in(key, 1), (w.batch, w.seq), 0, cfg.vocab)
        return (lambda _: fn(params, tokens)), None, {"logits": fn(params, tokens),
                                                      "hlo": hlo_launches(fn, params, tokens)}
    fn = jax.jit(llama.train_step(cfg, ops))
    tokens = jax.random.randint(jax.random.fold_in(key, 1), (w.batch, w.seq + 1), 0, cfg.vocab)
    loss, grads = fn(params, tokens)
    return (lambda _: fn(params, tokens)), None, {"loss": loss, "grads": grads, "hlo": hlo_launches(fn, params, tokens)}


def hlo_launches(fn, *args) -> dict[str, int]:
    """What the compiled step launches, from the entry computation of XLA's optimized HLO: "fusion" (XLA's
    kernels, its Triton matmuls among them) and one count per custom-call target (ours are ja_*, cuDNN's
    __cudnn$...). A custom call is a fusion boundary, so XLA arranges its kernels around ours differently (e.g. a
    reduce of a split-K matmul's partial sums of its own before our norm, where plain JAX reduces them inside
    its residual add). One custom call may launch more than one kernel; this does not see that."""
    text = fn.lower(*args).compile().as_text()
    entry = text[text.index("\nENTRY "):]
    entry = entry[:entry.find("\n}")]
    census: Counter = Counter()
    for line in entry.splitlines()[1:]:
        if m := re.search(r"\s(fusion|custom-call)\(", line):
            target = re.search(r'custom_call_target="([^"]+)"', line)
            census[f"custom-call {target.group(1)}" if target else m.group(1)] += 1
    return dict(sorted(census.items()))


def agreement(ours: dict, plain: dict) -> dict:
    """Relative errors of our outputs against plain JAX's, and whether each is within AGREE."""
    out = {}
    if "logits" in ours:
        out["logits_rel_err"] = llama.rel_err(ours["logits"], plain["logits"])
    if "loss" in ours:
        out["loss_rel_err"] = abs(float(ours["loss"]) - float(plain["loss"])) / abs(float(plain["loss"]))
        out["grad_worst_rel_err"] = llama.worst_leaf_err(ours["grads"], plain["grads"])
        out["grad_rel_err"] = llama.rel_err(ours["grads"], plain["grads"])
    limits = {"logits_rel_err": AGREE["logits"], "loss_rel_err": AGREE["loss"], "grad_worst_rel_err": AGREE["grad"]}
    out["agree"] = all(out[k] <= v for k, v in limits.items() if k in out)
    return out


def time_models(steps: dict, states: dict, calls: int, samples: int) -> dict[str, list[float]]:
    """ms per call of each model, `samples` samples of `calls` calls, the models alternating."""
    for name, step in steps.items():  # two untimed calls each
        for _ in range(2):
            states[name] = step(states[name])
        jax.block_until_ready(states[name])
    times: dict[str, list[float]] = {n: [] for n in steps}
    for _ in range(samples):
        for name, step in steps.items():
            t0 = time.perf_counter()
            st = states[name]
            for _ in range(calls):
                st = step(st)
            jax.block_until_ready(st)
            times[name].append((time.perf_counter() - t0) * 1e3 / calls)
            states[name] = st
    return times


def bench_workload(w: Workload, samples: int, swaps: bool = False) -> dict:
    impl, refused = plain_attention(w)
    models = {"ours": llama.our_ops(), "plain": llama.plain_ops(impl)}
    if swaps:
        models.update({f"plain+{k}": llama.swapped(models["plain"], models["ours"], *f) for k, f in SWAPS.items()})
    if floor := w.goal > 1 and w.kind != "decode":  # a goal that rests on attention: can any attention meet it?
        models[FLOOR] = llama.without_attention(models["ours"])
    key = jax.random.key(0)
    params = llama.init_params(w.cfg, jax.random.fold_in(key, 7))
    steps, states, outs = {}, {}, {}
    for name, ops in models.items():
        steps[name], states[name], outs[name] = build(w, ops, params, key)
    outs = {n: outs[n] for n in ("ours", "plain")}
    launches = {n: outs[n].pop("hlo") for n in outs}
    row = {"name": w.name, "kind": w.kind, "batch": w.batch, "seq": w.seq, "config": vars(w.cfg),
           "plain_attention": (impl or "default") + (" (softcap: XLA, llama.softcap_attention)"
                                                     if w.cfg.softcap else ""),
           **({"cudnn_refused": refused} if refused else {}),
           "hlo_launches": launches, **agreement(outs["ours"], outs["plain"])}
    del outs
    t = time_models(steps, states, w.calls, samples)
    ours, plain = statistics.median(t["ours"]), statistics.median(t["plain"])
    row.update({"calls_per_sample": w.calls, "ours_ms": ours, "plain_ms": plain, "ours_over_plain": ours / plain,
                "speedup": plain / ours, "goal_ours_over_plain": round(1 / w.goal, 4), "met": ours * w.goal <= plain,
                "samples_ms": t})
    if floor:
        fl = statistics.median(t[FLOOR])
        row.update({"no_attention_ms": fl, "ceiling_speedup": plain / fl, "goal_reachable": fl * w.goal <= plain})
    if swaps:
        row["swaps_over_plain"] = {k: statistics.median(t[f"plain+{k}"]) / plain for k in SWAPS}
    return row


def bench_model(samples: int, names: list[str] | None = None, swaps: bool = False) -> list[dict]:
    rows = []
    for w in WORKLOADS:
        if names and w.name not in names:
            continue
        rows.append(bench_workload(w, samples, swaps))
        print(f"model {w.name}: ours {rows[-1]['ours_ms']:.3f} ms, plain {rows[-1]['plain_ms']:.3f} ms, "
              f"ours/plain {rows[-1]['ours_over_plain']:.3f}, agree {rows[-1]['agree']}", flush=True)
    return rows


def print_table(rows: list[dict]) -> None:
    print(f"{'model workload':<24}{'ours ms':>10}{'plain ms':>10}{'ours/plain':>11}{'<= goal':>8}  met   agree "
          f"(logits / loss / worst grad rel err; plain attention)")
    for r in rows:
        errs = " / ".join(f"{r[k]:.1e}" if k in r else "-" for k in ("logits_rel_err", "loss_rel_err",
                                                                       "grad_worst_rel_err"))
        print(f"{r['name']:<24}{r['ours_ms']:>10.3f}{r['plain_ms']:>10.3f}{r['ours_over_plain']:>11.3f}"
              f"{r['goal_ours_over_plain']:>8.2f}  {r['met']!s:<6}{r['agree']!s:<6}{errs}; "
              f"{r['plain_attention']}")
        launches = {n: sum(c.values()) for n, c in r["hlo_launches"].items()}
        ours_calls = sum(v for k, v in r["hlo_launches"]["ours"].items() if k.startswith("custom-call ja_"))
        print(f"{'':<24}HLO launches: ours {launches['ours']} ({ours_calls} of them our calls), "
              f"plain {launches['plain']}")
        if "ceiling_speedup" in r:
            print(f"{'':<24}without attention (llama.attention_taken_out): {r['no_attention_ms']:.3f} ms; plain / that "
                  f"= {r['ceiling_speedup']:.3f}, the most any attention can give "
                  f"(goal {1 / r['goal_ours_over_plain']:.2f}: "
                  f"{'reachable' if r['goal_reachable'] else 'out of reach'})")
        if "swaps_over_plain" in r:
            print(f"{'':<24}plain JAX with one group of ours, / plain: "
                  + ", ".join(f"{k} {v:.3f}" for k, v in r["swaps_over_plain"].items()))
