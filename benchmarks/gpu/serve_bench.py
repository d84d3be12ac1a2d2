"""The server-loop rows of bench_gpu.py's model section (issue 83, goal 4): serve_loop.py at full size.

One workload: the Llama-like model (llama.LLAMA) serving 64 requests of mixed contexts (256 to 16k tokens) and
generation lengths over 32 slots with continuous batching, pages of 16 tokens. First the check (both servers
through the whole schedule, logits compared step by step; it also compiles every prefill length and the decode
step), then each server runs the whole loop alone, `samples` times, alternating; the figure is the median run.
Goals: generated tokens per second of the whole loop (prefills included) at least 1.5x plain JAX's, the pools at
most 1.1x the most tokens the schedule holds at once, the logits within model_bench.AGREE.
"""
from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from benchmarks.gpu import llama, model_bench, serve_loop
from benchmarks.gpu.gpu_timing import compile_refusal
from benchmarks.gpu.serve_schedule import make_requests


@dataclass(frozen=True)
class ServeWorkload:
    name: str
    cfg: llama.Config
    requests: int
    contexts: tuple[int, ...]
    generate: tuple[int, ...]
    slots: int
    page_size: int
    goal: float = 1.5         # our tokens per second over plain JAX's, at least
    memory_goal: float = 1.1  # our KV bytes over the bytes of the most tokens held at once, at most


SERVE = (ServeWorkload("serve 64 req ctx 256-16k", llama.LLAMA, 64, (256, 512, 1024, 2048, 4096, 8192, 16384),
                       (64, 128, 192, 256), slots=32, page_size=16),)


def plain_implementation(w: ServeWorkload) -> tuple[str | None, str | None]:
    """("cudnn", None) when cuDNN compiles the plain server's decode attention (one query a row over the dense
    cache with each row's length), else (None, why): jax.nn.dot_product_attention then picks."""
    cfg, n = w.cfg, max(w.contexts) + max(w.generate)
    q = jax.ShapeDtypeStruct((w.slots, 1, cfg.heads_q, cfg.head_dim), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((w.slots, n, cfg.heads_kv, cfg.head_dim), jnp.bfloat16)
    lens = jax.ShapeDtypeStruct((w.slots,), jnp.int32)
    why = compile_refusal(lambda q, k, v, n: jax.nn.dot_product_attention(q, k, v, key_value_seq_lengths=n,
                                                                          implementation="cudnn"), q, kv, kv, lens)
    return (None, why) if why else ("cudnn", None)


def bench_serve(w: ServeWorkload, samples: int) -> dict:
    impl, refused = plain_implementation(w)
    requests = make_requests(w.requests, w.contexts, w.generate, w.cfg.vocab)
    params = llama.init_params(w.cfg, jax.random.key(7))
    ours = serve_loop.OurServer(w.cfg, params, requests, w.slots, w.page_size)
    plain = serve_loop.PlainServer(w.cfg, params, requests, w.slots, impl)
    check = serve_loop.compare(ours, plain, requests, w.slots)
    runs = {"ours": [], "plain": []}
    for _ in range(samples):
        for name, server in (("ours", ours), ("plain", plain)):
            runs[name].append(serve_loop.run(server, requests, w.slots))
    med = {n: sorted(rs, key=lambda r: r["seconds"])[len(rs) // 2] for n, rs in runs.items()}  # the median run
    held = med["ours"]["peak_tokens_held"]
    token_bytes = ours.kv_bytes() / (ours.table.num_pages * w.page_size)  # K and V of a token, every layer
    tps = {n: r["generated"] / r["seconds"] for n, r in med.items()}
    row = {"name": w.name, "kind": "serve", "config": vars(w.cfg), "requests": w.requests, "slots": w.slots,
           "page_size": w.page_size, "contexts": list(w.contexts), "generate": list(w.generate),
           "plain_attention": impl or "default", **({"cudnn_refused": refused} if refused else {}),
           **check, "agree": check["logits_worst_step_rel_err"] <= model_bench.AGREE["logits"],
           "ours": med["ours"], "plain": med["plain"], "runs": runs,
           "ours_tokens_per_s": tps["ours"], "plain_tokens_per_s": tps["plain"],
           "speedup": tps["ours"] / tps["plain"], "goal_speedup": w.goal, "met": tps["ours"] >= w.goal * tps["plain"],
           "decode_speedup": (med["plain"]["decode_s"] / med["ours"]["decode_s"]),
           "peak_tokens_held": held, "pool_pages": ours.table.num_pages,
           "ours_kv_bytes": ours.kv_bytes(), "plain_kv_bytes": plain.kv_bytes(),
           "ours_kv_over_held": ours.kv_bytes() / (held * token_bytes),
           "plain_kv_over_held": plain.kv_bytes() / (held * token_bytes),
           "memory_goal": w.memory_goal}
    row["memory_met"] = row["ours_kv_over_held"] <= w.memory_goal
    return row


def bench_serve_all(samples: int, names: list[str] | None = None) -> list[dict]:
    rows = []
    for w in SERVE:
        if names and w.name not in names:
            continue
        try:
            rows.append(bench_serve(w, samples))
        except Exception as e:  # noqa: BLE001 -- e.g. no GPU kernel of the paged ops in this build: the row says why
            rows.append({"name": w.name, "kind": "serve", "not_run": f"{type(e).__name__}: {str(e)[:500]}"})
            print(f"model {w.name}: not run: {rows[-1]['not_run']}", flush=True)
            continue
        r = rows[-1]
        print(f"model {w.name}: ours {r['ours_tokens_per_s']:.0f} tok/s, plain {r['plain_tokens_per_s']:.0f} tok/s, "
              f"speedup {r['speedup']:.2f}, agree {r['agree']}", flush=True)
    return rows


def print_table(rows: list[dict]) -> None:
    print(f"{'server loop':<26}{'ours tok/s':>11}{'plain tok/s':>12}{'speedup':>8}{'>= goal':>8}  met   "
          f"{'decode x':>9}  KV bytes / most held: ours, plain (<= goal)  agree (worst step's logits rel err)")
    for r in rows:
        if "not_run" in r:
            print(f"{r['name']:<26}not run: {r['not_run']}")
            continue
        print(f"{r['name']:<26}{r['ours_tokens_per_s']:>11.0f}{r['plain_tokens_per_s']:>12.0f}{r['speedup']:>8.2f}"
              f"{r['goal_speedup']:>8.2f}  {r['met']!s:<6}{r['decode_speedup']:>9.2f}  "
              f"{r['ours_kv_over_held']:.3f}, {r['plain_kv_over_held']:.3f} (<= {r['memory_goal']}: "
              f"{r['memory_met']})  {r['agree']} ({r['logits_worst_step_rel_err']:.1e}); plain attention "
              f"{r['plain_attention']}")
        for n in ("ours", "plain"):
            m = r[n]
            print(f"{'':<26}{n}: {m['seconds']:.3f} s ({m['prefill_s']:.3f} prefill, {m['decode_s']:.3f} decode), "
                  f"{m['generated']} tokens, KV {r[n + '_kv_bytes'] / 2**30:.2f} GiB")
