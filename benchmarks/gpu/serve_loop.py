"""A server loop, end to end (issue 83, goal 4): the Llama-like decoder of llama.py serving a set of requests of
mixed contexts with continuous batching (serve_schedule.py), two ways from the same weights:

- ours: a paged KV cache, one pool per layer for K and one for V (`jax_aiter.append_kv` writes each new token in
  place, the pools donated; `jax_aiter.paged_attention` reads them through the page table; a new request's prompt
  is prefilled with our flash attention and appended to its pages);
- plain JAX: a dense padded cache [slots, longest request, kv heads, head dim] per layer, each token written with
  `dynamic_update_slice` at its row's position, attention by `jax.nn.dot_product_attention` over the whole row with
  the row's length (`key_value_seq_lengths`; cuDNN where it takes the shape), the prompt written into its row.

Both follow one schedule with the same (teacher-forced) tokens, so their logits are compared step by step (check),
then each runs the whole loop alone, timed on the host: generated tokens per second of the whole loop, and the time
split into prefill and decode (the loop waits for the device before and after each group of admissions). Memory is
what each allocates for the KV cache, read from the arrays: the pools (as many pages as the schedule ever holds at
once) against the dense caches, each over the most tokens the schedule holds at once.

Used by bench_gpu.py --only model at full size (serve_bench.py) and by tests/ops/test_serve_loop.py at a tiny size
on the CPU.
"""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.gpu import llama
from benchmarks.gpu.serve_schedule import PageTable, Request, Step, max_tokens, pool_pages, schedule


def _decoder(cfg: llama.Config, ops: llama.Ops, params, token, attend):
    """Logits [slots, vocab] of one token per slot (attend places it: each slot at its own position)."""
    return llama.layers(cfg, ops, params, params["embed"][token][:, None, :], attend)[:, 0, :]


class OurServer:
    """The paged cache: pools per layer, append_kv and paged_attention, the pools donated to every call."""

    name = "ours"

    def __init__(self, cfg: llama.Config, params, requests: list[Request], slots: int, page_size: int,
                 dtype=jnp.bfloat16):
        import jax_aiter as ja

        self.cfg, self.params, self.ja = cfg, params, ja
        self.table = PageTable(pool_pages(requests, slots, page_size), page_size, slots)
        shape = (self.table.num_pages, page_size, cfg.heads_kv, cfg.head_dim)
        self.pools = [(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)) for _ in range(cfg.layers)]
        self.max_len = max_tokens(requests)
        self._prefill = jax.jit(self._prefill_fn, donate_argnums=(1,))
        self._decode = jax.jit(self._decode_fn, donate_argnums=(1,))

    def _prefill_fn(self, params, pools, tokens, slots):
        logits, cache = llama.prefill(self.cfg, llama.our_ops(), params, tokens[None])
        pools = [self.ja.append_kv(k[0], v[0], slots, kp, vp) for (k, v), (kp, vp) in zip(cache, pools)]
        return logits[0, -1], pools

    def _decode_fn(self, params, pools, token, positions, meta):
        cfg, ja, new = self.cfg, self.ja, list(pools)

        def attend(i, layer, h):
            q, k, v = llama.qkv(cfg, layer, h, positions)
            kp, vp = ja.append_kv(k[:, 0], v[:, 0], meta["slot_mapping"], *pools[i])
            new[i] = (kp, vp)
            o = ja.paged_attention(q[:, 0], kp, vp, meta["kv_indptr"], meta["kv_page_indices"],
                                   meta["kv_last_page_lens"], max_seq_len=self.max_len)
            return o.reshape(q.shape[0], 1, cfg.heads_q * cfg.head_dim)

        logits = _decoder(cfg, llama.our_ops(), params, token, attend)
        return logits, new

    def admit(self, slot: int, request: Request):
        slots = self.table.admit(slot, request.context)
        logits, self.pools = self._prefill(self.params, self.pools, request.tokens[:request.context], slots)
        return logits

    def decode(self, step: Step, token: np.ndarray, positions: np.ndarray):
        meta = self.table.decode([s for s, _, _ in step.decode])
        logits, self.pools = self._decode(self.params, self.pools, token, positions[:, None], meta)
        return logits

    def release(self, slot: int) -> None:
        self.table.release(slot)

    def kv_bytes(self) -> int:
        return sum(a.nbytes for pair in self.pools for a in pair)


class PlainServer:
    """The dense padded cache of plain JAX: [slots, longest request, kv heads, head dim] per layer."""

    name = "plain"

    def __init__(self, cfg: llama.Config, params, requests: list[Request], slots: int, implementation: str | None,
                 dtype=jnp.bfloat16):
        self.cfg, self.params, self.impl = cfg, params, implementation
        shape = (slots, max_tokens(requests), cfg.heads_kv, cfg.head_dim)
        self.caches = [(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)) for _ in range(cfg.layers)]
        self._prefill = jax.jit(self._prefill_fn, donate_argnums=(1,))
        self._decode = jax.jit(self._decode_fn, donate_argnums=(1,))

    def _prefill_fn(self, params, caches, tokens, slot):
        logits, cache = llama.prefill(self.cfg, llama.plain_ops(self.impl), params, tokens[None])
        at = (slot, 0, 0, 0)
        caches = [(jax.lax.dynamic_update_slice(ck, k, at), jax.lax.dynamic_update_slice(cv, v, at))
                  for (k, v), (ck, cv) in zip(cache, caches)]
        return logits[0, -1], caches

    def _decode_fn(self, params, caches, token, positions):
        cfg, new = self.cfg, list(caches)
        write = jax.vmap(lambda c, x, p: jax.lax.dynamic_update_slice(c, x, (p, 0, 0)))

        def attend(i, layer, h):
            q, k, v = llama.qkv(cfg, layer, h, positions)
            ck, cv = (write(c, x, positions[:, 0]) for c, x in zip(caches[i], (k, v)))
            new[i] = (ck, cv)
            o = jax.nn.dot_product_attention(q, ck, cv, key_value_seq_lengths=positions[:, 0] + 1,
                                             implementation=self.impl)
            return o.reshape(q.shape[0], 1, cfg.heads_q * cfg.head_dim)

        logits = _decoder(cfg, llama.plain_ops(self.impl), params, token, attend)
        return logits, new

    def admit(self, slot: int, request: Request):
        logits, self.caches = self._prefill(self.params, self.caches, request.tokens[:request.context],
                                            np.int32(slot))
        return logits

    def decode(self, step: Step, token: np.ndarray, positions: np.ndarray):
        del step  # the dense cache needs no page table
        logits, self.caches = self._decode(self.params, self.caches, token, positions[:, None])
        return logits

    def release(self, slot: int) -> None:
        del slot  # the row is overwritten by the next request's prompt

    def kv_bytes(self) -> int:
        return sum(a.nbytes for pair in self.caches for a in pair)


def step_inputs(step: Step, slots: int) -> tuple[np.ndarray, np.ndarray]:
    """token [slots] and positions [slots] (int32) of a decode step; an idle slot feeds token 0 at position 0."""
    token, positions = np.zeros(slots, np.int32), np.zeros(slots, np.int32)
    for s, r, j in step.decode:
        token[s], positions[s] = r.tokens[r.context + j], r.context + j
    return token, positions


def run(server, requests: list[Request], slots: int, on_logits=None) -> dict:
    """The whole loop on one server: seconds in all, in prefill and in decode, tokens generated, the most tokens held
    at once. on_logits(kind, step index, rows, logits) sees every result (the check); None: nothing is read back."""
    t = {"prefill": 0.0, "decode": 0.0}
    last, held, peak, generated = None, 0, 0, 0
    mark = time.perf_counter()
    for n, step in enumerate(schedule(requests, slots)):
        if step.admit:  # the device drains the decode steps so far, then the prefills run alone
            jax.block_until_ready(last)
            now = time.perf_counter()
            t["decode"] += now - mark
            for s, r in step.admit:
                out = server.admit(s, r)
                held += r.context
                if on_logits:
                    on_logits("prefill", n, [s], out[None])
            jax.block_until_ready(out)
            mark = time.perf_counter()
            t["prefill"] += mark - now
        last = server.decode(step, *step_inputs(step, slots))
        held += len(step.decode)
        peak, generated = max(peak, held), generated + len(step.decode)
        if on_logits:
            on_logits("decode", n, [s for s, _, _ in step.decode], last[np.asarray([s for s, _, _ in step.decode])])
        for s, r, j in step.decode:
            if j + 1 == r.generate:
                server.release(s)
                held -= r.context + r.generate
    jax.block_until_ready(last)
    t["decode"] += time.perf_counter() - mark
    return {"seconds": t["prefill"] + t["decode"], "prefill_s": t["prefill"], "decode_s": t["decode"],
            "generated": generated, "peak_tokens_held": peak}


def compare(ours, plain, requests: list[Request], slots: int) -> dict:
    """Both servers through the schedule in lockstep: the relative L2 error of our logits against plain JAX's over
    every prefill and decode result (float32), and the worst single step's."""
    seen = {}

    def keep(name):
        return lambda kind, n, rows, logits: seen.setdefault((kind, n, name), []).append(
            np.asarray(logits, np.float32))

    # one server at a time (each run is the whole schedule), the results matched by (kind, step)
    run(ours, requests, slots, keep("ours"))
    run(plain, requests, slots, keep("plain"))
    num = den = 0.0
    worst = 0.0
    for (kind, n, name), got in seen.items():
        if name != "ours":
            continue
        a, b = np.concatenate(got), np.concatenate(seen[(kind, n, "plain")])
        d, r = float(np.sum((a - b) ** 2)), float(np.sum(b ** 2))
        num, den, worst = num + d, den + r, max(worst, (d / r) ** 0.5)
    return {"logits_rel_err": (num / den) ** 0.5, "logits_worst_step_rel_err": worst, "steps_compared": len(seen) // 2}
