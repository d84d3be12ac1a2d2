#!/usr/bin/env python3
"""The convergence recipe: a small transformer trained with jax_aiter's kernels and with plain JAX.

The model is a real (if tiny) decoder: token and position embeddings, then
per layer RMSNorm, causal grouped-query attention (4 query heads sharing 2
key/value heads, head_dim 64 unless --head-dim says otherwise: a kernel that
runs only some head dims is trained at its own) and a residual, RMSNorm, a
SiLU-and-mul MLP and a residual; a final RMSNorm and tied output embeddings.
Both runs start from the same weights and see the same batches; only the implementation of RMSNorm,
SiLU-and-mul and attention (``flash_attn_func``, forward and backward kernels)
differs. The kernels converge when the loss falls and their loss curve stays
within a tolerance of the reference's over the last steps. The data needs the
attention: each sequence is an affine recurrence whose step only the earlier
tokens reveal. Each run writes a MaxText-style log (``completed step: N,
seconds: S, TFLOP/s/device: T, Tokens/s/device: K, total_weights: W, loss: L``),
summarised by ci/perf/parse_perf_log.py into JSON and a markdown table (the
job summary on GitHub). Throughput is reported, not gated: this run answers
"do the kernels train the same model", not "are they fast".

    python3 -m ci.convergence.train_tiny --compare --out build/convergence [--steps 200] [--dtype bfloat16] \\
        [--repeats 3]
        [--head-dim 160]

Exit codes: 0 converged; 1 diverged (loss curves apart, loss not falling, or a
non-finite loss); 2 bad input (unknown option, parse failure).
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from ci.perf import parse_perf_log

ROOT = Path(__file__).resolve().parents[2]

VOCAB, DIM, HIDDEN, LAYERS, BATCH, SEQ = 64, 128, 256, 2, 16, 32
HEADS_Q, HEADS_KV, HEAD_DIM = 4, 2, 64
EPS = 1e-6


def rms_norm_ref(x, w, eps=EPS):
    xf = x.astype(jnp.float32)
    return (xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps) * w.astype(jnp.float32)).astype(x.dtype)


def silu_and_mul_ref(x):
    a, b = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return (jax.nn.silu(a) * b).astype(x.dtype)


def attention_ref(q, k, v):
    """Causal grouped-query attention in plain JAX, float32 softmax: q [b, s, hq, d], k and v [b, s, hkv, d]."""
    group = q.shape[2] // k.shape[2]
    k, v = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)
    s = jnp.einsum("bqhd,bkhd->bhqk", q.astype(jnp.float32), k.astype(jnp.float32)) / math.sqrt(q.shape[-1])
    n = q.shape[1]
    s = jnp.where(jnp.tril(jnp.ones((n, n), bool)), s, -jnp.inf)
    p = jax.nn.softmax(s, axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", p, v.astype(jnp.float32)).astype(q.dtype)


def ops(impl: str):
    """(rms_norm, silu_and_mul, causal attention) of one implementation."""
    if impl == "reference":
        return rms_norm_ref, silu_and_mul_ref, attention_ref
    import jax_aiter

    os.environ["JA_KERNEL_MIN_BYTES"] = "0"  # the kernels at this model's small sizes, not jax.numpy's forms

    return ((lambda x, w: jax_aiter.rms_norm(x, w, EPS)), jax_aiter.silu_and_mul,
            (lambda q, k, v: jax_aiter.flash_attn_func(q, k, v, causal=True)))


def init(key, dtype, head_dim=HEAD_DIM):
    keys = iter(jax.random.split(key, 2 + 6 * LAYERS))
    normal = lambda shape, fan_in: jax.random.normal(next(keys), shape) / math.sqrt(fan_in)
    params = {"embed": jax.random.normal(next(keys), (VOCAB, DIM)) * 0.02,
              "pos": jax.random.normal(next(keys), (SEQ, DIM)) * 0.02, "norm": jnp.ones((DIM,)), "layers": []}
    for _ in range(LAYERS):
        params["layers"].append({
            "attn_norm": jnp.ones((DIM,)),
            "wq": normal((DIM, HEADS_Q * head_dim), DIM),
            "wk": normal((DIM, HEADS_KV * head_dim), DIM),
            "wv": normal((DIM, HEADS_KV * head_dim), DIM),
            "wo": normal((HEADS_Q * head_dim, DIM), HEADS_Q * head_dim),
            "mlp_norm": jnp.ones((DIM,)),
            "up": normal((DIM, 2 * HIDDEN), DIM),
            "down": normal((HIDDEN, DIM), HIDDEN),
        })
    return jax.tree_util.tree_map(lambda a: a.astype(dtype), params)


def batch(step: int):
    """Sequences of an affine recurrence mod VOCAB: learnable, deterministic, different every step.

    The step (1, 3, 5 or 7) differs per sequence and only the tokens before the
    current one reveal it, so predicting the next token needs attention.
    """
    key = jax.random.fold_in(jax.random.PRNGKey(1234), step)
    start = jax.random.randint(key, (BATCH, 1), 0, VOCAB)
    mult = 1 + 2 * jax.random.randint(jax.random.fold_in(key, 1), (BATCH, 1), 0, 4)
    pos = jnp.arange(SEQ + 1)[None, :]
    return (start + mult * pos) % VOCAB


def loss_fn(params, tokens, rms_norm, silu_and_mul, attention):
    b, n = tokens.shape[0], tokens.shape[1] - 1
    x = params["embed"][tokens[:, :-1]] + params["pos"][:n]
    for layer in params["layers"]:
        hd = layer["wq"].shape[1] // HEADS_Q  # the head dim the weights were made for (init)
        h = rms_norm(x, layer["attn_norm"])
        q = (h @ layer["wq"]).reshape(b, n, HEADS_Q, hd)
        k = (h @ layer["wk"]).reshape(b, n, HEADS_KV, hd)
        v = (h @ layer["wv"]).reshape(b, n, HEADS_KV, hd)
        x = x + attention(q, k, v).reshape(b, n, HEADS_Q * hd) @ layer["wo"]
        h = rms_norm(x, layer["mlp_norm"])
        x = x + silu_and_mul(h @ layer["up"]) @ layer["down"]
    logits = (rms_norm(x, params["norm"]) @ params["embed"].T).astype(jnp.float32)
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))


def adam(lr=3e-3, b1=0.9, b2=0.99, eps=1e-8):
    def update(grads, state, params):
        m, v, t = state
        t = t + 1
        m = jax.tree_util.tree_map(lambda m, g: b1 * m + (1 - b1) * g.astype(jnp.float32), m, grads)
        v = jax.tree_util.tree_map(lambda v, g: b2 * v + (1 - b2) * jnp.square(g.astype(jnp.float32)), v, grads)
        step = lambda p, m, v: (p.astype(jnp.float32) - lr * (m / (1 - b1 ** t)) /
                                (jnp.sqrt(v / (1 - b2 ** t)) + eps)).astype(p.dtype)
        return jax.tree_util.tree_map(step, params, m, v), (m, v, t)

    def init_state(params):
        zeros = jax.tree_util.tree_map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
        return zeros, zeros, 0
    return init_state, update


@functools.cache
def step_fn(impl: str):
    """One jitted training step of an implementation, compiled once per process (--repeats reuses it)."""
    rms_norm, silu_and_mul, attention = ops(impl)
    _, update = adam()

    @jax.jit
    def step(params, state, tokens):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens, rms_norm, silu_and_mul, attention)
        params, state = update(grads, state, params)
        return params, state, loss
    return step


def train(impl: str, steps: int, dtype, log_path: Path, head_dim: int = HEAD_DIM) -> list[float]:
    params = init(jax.random.PRNGKey(0), dtype, head_dim)
    init_state, _ = adam()
    state = init_state(params)
    n_params = sum(p.size for p in jax.tree_util.tree_leaves(params))
    tokens_per_step = BATCH * SEQ
    # forward + backward, the usual estimate, plus the attention scores (causal: half of seq^2)
    attn_flops = 3 * 4 * BATCH * HEADS_Q * SEQ * SEQ * head_dim / 2 * LAYERS
    flops_per_step = 6.0 * n_params * tokens_per_step + attn_flops
    step = step_fn(impl)

    losses = []
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        log.write(f"train_tiny: impl={impl} dtype={jnp.dtype(dtype).name} head_dim={head_dim} params={n_params} "
                  f"backend={jax.default_backend()}\n")
        for i in range(steps):
            start = time.perf_counter()
            params, state, loss = step(params, state, batch(i))
            loss = float(loss)  # waits for the step
            dt = time.perf_counter() - start
            losses.append(loss)
            log.write(f"completed step: {i}, seconds: {dt:.6f}, TFLOP/s/device: {flops_per_step / dt / 1e12:.6f}, "
                      f"Tokens/s/device: {tokens_per_step / dt:.1f}, total_weights: {tokens_per_step}, "
                      f"loss: {loss:.6f}\n")
    return losses


def tail_mean(curve: list[float], window: int) -> float:
    tail = curve[-window:]
    return sum(tail) / len(tail)


def verdict(refs: list[list[float]], ours: list[list[float]], window: int, rel_tol: float) -> list[str]:
    """Reasons the kernels did not converge like the reference (empty when they did).

    refs and ours hold one loss curve per run (--repeats). Each of our runs' last-window mean must
    lie in the range of the reference runs' last-window means, widened by rel_tol of their mean: the
    range is the reference's run-to-run noise (none where training is deterministic, as on the CPU;
    bfloat16 on a GPU is not), rel_tol the difference allowed to the kernels beyond it.
    """
    problems = []
    ref_means = [tail_mean(c, window) for c in refs]
    lo, hi = min(ref_means), max(ref_means)
    tol = rel_tol * abs(sum(ref_means) / len(ref_means))
    for k, curve in enumerate(ours):
        run = f"run {k + 1}: " if len(ours) > 1 else ""
        bad = [i for i, v in enumerate(curve) if not math.isfinite(v)]
        if bad:
            problems.append(f"{run}non-finite loss at steps {bad[:10]}")
        mean = tail_mean(curve, window)
        if not mean < 0.5 * curve[0]:
            problems.append(f"{run}loss did not fall: first {curve[0]:.4f}, last-{window} mean {mean:.4f}")
        if math.isfinite(mean) and not lo - tol <= mean <= hi + tol:
            if len(refs) == 1:
                problems.append(f"last-{window} mean loss {mean:.4f} differs from the reference's {lo:.4f} "
                                f"by more than {rel_tol:.0%}")
            else:
                problems.append(f"{run}last-{window} mean loss {mean:.4f} is outside the {len(refs)} reference runs' "
                                f"{lo:.4f}-{hi:.4f} widened by {rel_tol:.0%} ({lo - tol:.4f}-{hi + tol:.4f})")
    return problems


def positive_int(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n} is not a positive count")
    return n


def head_dim_arg(text: str) -> int:
    from jax_aiter.ops._attn_args import MAX_HEAD_DIM  # the attention's own bound

    n = int(text)
    if not 1 <= n <= MAX_HEAD_DIM:
        raise argparse.ArgumentTypeError(f"{n} is not a head dim jax_aiter's attention takes (1 to {MAX_HEAD_DIM})")
    return n


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m ci.convergence.train_tiny", description=__doc__.splitlines()[0])
    p.add_argument("--compare", action="store_true", help="train with the reference and with jax_aiter, compare")
    p.add_argument("--impl", choices=("aiter", "reference"), default="aiter", help="one run (without --compare)")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--window", type=int, default=20, help="tail steps compared and summarised")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--rel-tol", type=float, default=0.02, help="allowed relative gap of the tail mean loss")
    p.add_argument("--repeats", type=positive_int, default=1, help="runs of each implementation (with --compare; "
                   "bfloat16 on a GPU varies from run to run: the reference runs' spread is then part of the band)")
    p.add_argument("--head-dim", type=head_dim_arg, default=HEAD_DIM,
                   help="attention's head dim (1 to the largest jax_aiter's attention takes)")
    p.add_argument("--out", type=Path, default=ROOT / "build" / "convergence")
    args = p.parse_args(argv)
    if args.repeats > 1 and not args.compare:
        p.error("--repeats needs --compare (it repeats the comparison's runs)")
    dtype = jnp.dtype(args.dtype)
    impls = ("reference", "aiter") if args.compare else (args.impl,)
    runs: dict[str, list[list[float]]] = {impl: [] for impl in impls}
    for k in range(args.repeats):  # the implementations alternate, run by run
        for impl in impls:
            log = args.out / (f"{impl}.log" if k == 0 else f"{impl}.{k + 1}.log")
            runs[impl].append(train(impl, args.steps, dtype, log, args.head_dim))
    summaries = {}
    for impl in impls:
        rc = parse_perf_log.run([str(args.out / f"{impl}.log"), "--window", str(args.window),
                                 "--json-out", str(args.out / f"{impl}.json"),
                                 *(["--baseline", str(args.out / "reference.json")] if impl == "aiter" and
                                   args.compare else [])])
        if rc == parse_perf_log.EXIT_INPUT:
            return 2
        summaries[impl] = json.loads((args.out / f"{impl}.json").read_text())
    if not args.compare:
        return 0
    problems = verdict(runs["reference"], runs["aiter"], args.window, args.rel_tol)
    result = {"converged": not problems, "problems": problems, "steps": args.steps, "dtype": args.dtype,
              "head_dim": args.head_dim, "rel_tol": args.rel_tol, "repeats": args.repeats,
              "mean_loss": {k: v["mean_loss"] for k, v in summaries.items()},
              "tail_mean_loss_runs": {k: [tail_mean(c, args.window) for c in v] for k, v in runs.items()}}
    (args.out / "verdict.json").write_text(json.dumps(result, indent=2) + "\n")
    for msg in problems:
        print(f"train_tiny: DIVERGED: {msg}", file=sys.stderr)
    if not problems:
        ours, ref = result["tail_mean_loss_runs"]["aiter"], result["tail_mean_loss_runs"]["reference"]
        each = f"{min(ours):.4f}-{max(ours):.4f} (reference {min(ref):.4f}-{max(ref):.4f}), {args.repeats} runs each"
        print(f"train_tiny: converged: last-{args.window} mean loss "
              + (each if args.repeats > 1 else f"{ours[0]:.4f} (reference {ref[0]:.4f})")
              + f", {args.steps} steps, {args.dtype}, head dim {args.head_dim}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
