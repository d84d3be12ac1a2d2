"""A Llama-like decoder built twice from the same weights: from jax-aiter's ops, and in plain JAX.

The two models differ only in four functions (`Ops`): RMSNorm, fused residual-add RMSNorm,
SiLU-and-mul and attention. Ours calls `jax_aiter`; plain JAX writes the norms and SiLU as XLA
fuses them and calls `jax.nn.dot_product_attention` (cuDNN on an NVIDIA GPU when it takes the
shape, XLA's attention otherwise). Everything else (embedding, projections, rotary embedding,
the residual stream, the loss) is the same code, so a difference in time or in results comes
from the ops alone.

The layer is the fused-residual form that serving stacks use: each norm adds the residual branch
into the stream and normalises it in one call. A decode step writes the new token's keys and
values into the cache (donated, updated in place) and attends over the whole cache.

Used by benchmarks/gpu/model_bench.py at full size on a GPU and by
tests/ops/test_model.py at a tiny size on the CPU.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, replace

import jax
import jax.numpy as jnp


@dataclass(frozen=True)
class Config:
    layers: int = 4
    d_model: int = 4096
    heads_q: int = 32
    heads_kv: int = 8
    head_dim: int = 128
    ffn: int = 14336
    vocab: int = 32000
    eps: float = 1e-6
    rope_theta: float = 500000.0
    window: int = -1            # > 0: a causal sliding window of this many keys on the even layers (Gemma 2)
    softcap: float = 0.0        # > 0: attention logit softcap on every layer (Gemma 2's 50)
    docs: tuple[int, ...] = ()  # packed documents (lengths, summing to seq) of a batch-1 row: causal within each
    remat: bool = False         # each layer under jax.checkpoint with REMAT_POLICY (a training step's memory saver)

    def with_(self, **kw) -> Config:
        return replace(self, **kw)

    def attention_features(self, layer: int) -> dict:
        """Layer `layer`'s attention keywords (Ops.attention's): window, softcap, docs."""
        window = (self.window, 0) if self.window > 0 and layer % 2 == 0 else (-1, -1)
        return {"window": window, "softcap": self.softcap, "docs": self.docs}


# The model: Llama-3-8B's layer shape (4 layers of it), a 32k vocabulary.
LLAMA = Config()
# Gemma-2-9B-like: head dim 256, 16 query / 8 kv heads, d_model 3584.
GEMMA_LIKE = Config(d_model=3584, heads_q=16, heads_kv=8, head_dim=256)
# issue 56's packed row: documents of mixed lengths, 128 to 8k tokens, 16384 in all.
PACKED_DOCS = (8192, 3072, 2048, 1536, 768, 384, 256, 128)


@dataclass(frozen=True)
class Ops:
    name: str
    rms_norm: Callable          # (x, w, eps) -> y
    rms_norm_add: Callable      # (x, residual, w, eps) -> (rms_norm(x + residual), x + residual)
    silu_and_mul: Callable      # (x [.., 2f]) -> silu(x[.., :f]) * x[.., f:]
    attention: Callable         # (q, k, v, causal, window=(-1, -1), softcap=0.0, docs=()) -> o;
    #                             q [b, sq, hq, d], k and v [b, sk, hkv, d] (Config.attention_features)


def plain_rms_norm(x, w, eps=1e-6):
    xf = x.astype(jnp.float32)
    return (xf * jax.lax.rsqrt(jnp.mean(xf * xf, -1, keepdims=True) + eps) * w.astype(jnp.float32)).astype(x.dtype)


def plain_rms_norm_add(x, r, w, eps=1e-6):
    s = (x.astype(jnp.float32) + r.astype(jnp.float32)).astype(x.dtype)
    return plain_rms_norm(s, w, eps), s


def plain_silu_and_mul(x):
    a, b = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return (jax.nn.silu(a) * b).astype(x.dtype)


def segment_ids(docs: tuple[int, ...]) -> jax.Array:
    """[1, sum(docs)] int32: the document of each token of a packed row."""
    return jnp.repeat(jnp.arange(len(docs), dtype=jnp.int32), jnp.asarray(docs), total_repeat_length=sum(docs))[None]


def softcap_attention(q, k, v, causal, window, softcap, docs):
    """Attention with a logit softcap as plain JAX must write it (jax.nn.dot_product_attention has no softcap):
    the scores materialised by XLA, float32 softmax."""
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    qg = q.reshape(b, sq, hkv, hq // hkv, d)
    s = jnp.einsum("bqhgd,bkhd->bhgqk", qg, k, preferred_element_type=jnp.float32) * d ** -0.5
    s = softcap * jnp.tanh(s / softcap)
    i, j = jnp.arange(sq)[:, None] + sk - sq, jnp.arange(sk)[None, :]
    vis = jnp.ones((sq, sk), bool)
    if causal:
        vis &= j <= i
    if window[0] >= 0:
        vis &= j >= i - window[0]
    if window[1] >= 0:
        vis &= j <= i + window[1]
    if docs:
        ids = segment_ids(docs)[0]
        vis &= ids[:, None] == ids[None, :]
    p = jax.nn.softmax(jnp.where(vis, s, -jnp.inf), axis=-1)
    o = jnp.einsum("bhgqk,bkhd->bqhgd", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
    return o.reshape(b, sq, hq, v.shape[3]).astype(q.dtype)


def plain_ops(implementation: str | None = None) -> Ops:
    """Plain JAX; implementation is jax.nn.dot_product_attention's ("cudnn", "xla" or None: JAX picks). A
    window becomes its local_window_size, packed documents a segment mask; softcap takes softcap_attention."""
    def attention(q, k, v, causal, window=(-1, -1), softcap=0.0, docs=()):
        if softcap > 0:
            return softcap_attention(q, k, v, causal, window, softcap, docs)
        mask = None
        if docs:
            ids = segment_ids(docs)
            mask = (ids[:, :, None] == ids[:, None, :])[:, None]
        local = None if window == (-1, -1) else window
        return jax.nn.dot_product_attention(q, k, v, is_causal=causal, mask=mask, local_window_size=local,
                                            implementation=implementation)
    return Ops(f"plain ({implementation or 'default'} attention)", plain_rms_norm, plain_rms_norm_add,
               plain_silu_and_mul, attention)


def attention_taken_out(q, k, v, causal, window=(-1, -1), softcap=0.0, docs=()):
    """What is left of a train or prefill step with attention taken out: q plus the mean over kv heads of k + v
    (one memory-bound pass; every input stays in use, so XLA still computes the whole q/k/v projection, and
    every gradient is nonzero). The step built with it is the floor under any attention kernel's time."""
    del causal, window, softcap, docs
    kv = (k.astype(jnp.float32) + v.astype(jnp.float32)).mean(axis=2, keepdims=True)
    return (q.astype(jnp.float32) + kv).astype(q.dtype)


def without_attention(ops: Ops) -> Ops:
    """ops with its attention taken out (attention_taken_out): the floor step of model_bench."""
    return replace(ops, name=f"{ops.name} without attention", attention=attention_taken_out)


def swapped(base: Ops, donor: Ops, *fields: str) -> Ops:
    """base with the named functions taken from donor (e.g. plain JAX with our attention)."""
    return replace(base, name=f"{base.name} with {donor.name}'s {', '.join(fields)}",
                   **{f: getattr(donor, f) for f in fields})


def our_ops() -> Ops:
    import jax_aiter as ja

    def attention(q, k, v, causal, window=(-1, -1), softcap=0.0, docs=()):
        if docs:  # a packed row: varlen over its documents
            cu = jnp.asarray([0, *itertools.accumulate(docs)], jnp.int32)
            return ja.flash_attn_func(q[0], k[0], v[0], causal=causal, window_size=window, softcap=softcap,
                                      cu_seqlens_q=cu, cu_seqlens_kv=cu)[None]
        return ja.flash_attn_func(q, k, v, causal=causal, window_size=window, softcap=softcap)

    return Ops("jax-aiter", lambda x, w, eps: ja.rms_norm(x, w, eps),
               lambda x, r, w, eps: ja.rms_norm_with_add(x, r, w, eps), ja.silu_and_mul, attention)


def init_params(cfg: Config, key, dtype=jnp.bfloat16) -> dict:
    """Random weights scaled by 1/sqrt(fan in), norms around 1; made on the default device."""
    keys = iter(jax.random.split(key, 3 + 6 * cfg.layers))
    qkv = (cfg.heads_q + 2 * cfg.heads_kv) * cfg.head_dim

    def normal(shape, scale):
        return (jax.random.normal(next(keys), shape, jnp.float32) * scale).astype(dtype)

    def norm_weight(n):
        return (1.0 + 0.1 * jax.random.normal(next(keys), (n,), jnp.float32)).astype(dtype)

    layers = [{"attn_norm": norm_weight(cfg.d_model),
               "wqkv": normal((cfg.d_model, qkv), cfg.d_model ** -0.5),
               "wo": normal((cfg.heads_q * cfg.head_dim, cfg.d_model), (cfg.heads_q * cfg.head_dim) ** -0.5),
               "mlp_norm": norm_weight(cfg.d_model),
               "w_gate_up": normal((cfg.d_model, 2 * cfg.ffn), cfg.d_model ** -0.5),
               "w_down": normal((cfg.ffn, cfg.d_model), cfg.ffn ** -0.5)} for _ in range(cfg.layers)]
    return {"embed": normal((cfg.vocab, cfg.d_model), 1.0), "layers": layers,
            "final_norm": norm_weight(cfg.d_model),
            "lm_head": normal((cfg.d_model, cfg.vocab), cfg.d_model ** -0.5)}


def rope(x, positions, theta):
    """Rotary embedding (rotate-half form) of x [b, s, h, d] at integer positions [s] (every row's) or [b, s] (each
    row's own: a server's slots), float32 angles."""
    d = x.shape[-1]
    inv = theta ** (-jnp.arange(0, d, 2, dtype=jnp.float32) / d)
    ang = (positions.astype(jnp.float32)[..., None] * inv)[..., None, :]  # [(b,) s, 1, d / 2]
    cos, sin = jnp.cos(ang), jnp.sin(ang)
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def qkv(cfg: Config, layer, h, positions):
    b, s, _ = h.shape
    fused = h @ layer["wqkv"]
    nq, nk = cfg.heads_q * cfg.head_dim, cfg.heads_kv * cfg.head_dim
    q = fused[..., :nq].reshape(b, s, cfg.heads_q, cfg.head_dim)
    k = fused[..., nq:nq + nk].reshape(b, s, cfg.heads_kv, cfg.head_dim)
    v = fused[..., nq + nk:].reshape(b, s, cfg.heads_kv, cfg.head_dim)
    return rope(q, positions, cfg.rope_theta), rope(k, positions, cfg.rope_theta), v


def remat_policy():
    """Config.remat's policy, the same for both models: the matrix products are saved (plain JAX's attention is
    dots, so its forward is not recomputed either), and so are our attention's residuals, by the names the op gives
    them (jax_aiter.ops.attention.RESIDUAL_NAMES): the gradient recomputes the norms and activations, not
    attention."""
    from jax_aiter.ops.attention import RESIDUAL_NAMES

    cp = jax.checkpoint_policies
    return cp.save_from_both_policies(cp.dots_saveable, cp.save_only_these_names(*RESIDUAL_NAMES))


def layers(cfg: Config, ops: Ops, params, x, attend):
    """The decoder stack in fused-residual form; attend(i, layer, h) -> the attention output [b, s, hq*d]."""
    res = x
    h = ops.rms_norm(x, params["layers"][0]["attn_norm"], cfg.eps)
    for i, layer in enumerate(params["layers"]):
        nxt = params["layers"][i + 1]["attn_norm"] if i + 1 < len(params["layers"]) else params["final_norm"]

        def block(layer, nxt, h, res, i=i):
            h, res = ops.rms_norm_add(attend(i, layer, h) @ layer["wo"], res, layer["mlp_norm"], cfg.eps)
            mlp = ops.silu_and_mul(h @ layer["w_gate_up"]) @ layer["w_down"]
            return ops.rms_norm_add(mlp, res, nxt, cfg.eps)

        h, res = (jax.checkpoint(block, policy=remat_policy()) if cfg.remat else block)(layer, nxt, h, res)
    return h @ params["lm_head"]


def prefill(cfg: Config, ops: Ops, params, tokens):
    """Causal prefill of tokens [b, s]: (logits [b, s, vocab], the KV cache: per layer (k, v) [b, s, hkv, d])."""
    b, s = tokens.shape
    positions = jnp.arange(s)
    cache = []

    def attend(i, layer, h):
        q, k, v = qkv(cfg, layer, h, positions)
        if not cfg.remat:  # a rematerialized layer's k and v are its own trace's: a training step keeps no cache
            cache.append((k, v))
        return ops.attention(q, k, v, True, **cfg.attention_features(i)).reshape(b, s, cfg.heads_q * cfg.head_dim)

    return layers(cfg, ops, params, params["embed"][tokens], attend), cache


def forward(cfg: Config, ops: Ops, params, tokens):
    """Causal prefill of tokens [b, s]: logits [b, s, vocab] (the activations' dtype)."""
    return prefill(cfg, ops, params, tokens)[0]


def loss(cfg: Config, ops: Ops, params, tokens):
    """Next-token cross entropy over tokens [b, s + 1] (float32 log-softmax)."""
    logits = forward(cfg, ops, params, tokens[:, :-1]).astype(jnp.float32)
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))


def train_step(cfg: Config, ops: Ops):
    """(params, tokens) -> (loss, grads): the forward and backward pass of one step."""
    return lambda params, tokens: jax.value_and_grad(lambda p: loss(cfg, ops, p, tokens))(params)


def decode_step(cfg: Config, ops: Ops, params, cache, token, pos):
    """One new token per sequence (token [b]) at position pos (an int32 scalar) against the KV cache.

    cache: per layer (k, v), each [b, seq_k, heads_kv, head_dim]; the token's keys and values are
    written at pos and the query attends over all seq_k positions (a full cache). Returns (logits
    [b, vocab], the updated cache).
    """
    b = token.shape[0]
    positions = jnp.reshape(pos, (1,))
    new_cache = list(cache)

    def attend(i, layer, h):
        q, k, v = qkv(cfg, layer, h, positions)
        ck, cv = cache[i]
        ck = jax.lax.dynamic_update_slice(ck, k, (0, pos, 0, 0))
        cv = jax.lax.dynamic_update_slice(cv, v, (0, pos, 0, 0))
        new_cache[i] = (ck, cv)
        return ops.attention(q, ck, cv, False).reshape(b, 1, cfg.heads_q * cfg.head_dim)

    logits = layers(cfg, ops, params, params["embed"][token][:, None, :], attend)
    return logits[:, 0, :], new_cache


def init_cache(cfg: Config, key, batch: int, seq_k: int, dtype=jnp.bfloat16):
    """A filled KV cache: random keys and values at every position, as after a long prefill."""
    keys = jax.random.split(key, 2 * cfg.layers)
    shape = (batch, seq_k, cfg.heads_kv, cfg.head_dim)
    return [tuple(jax.random.normal(keys[2 * i + j], shape, jnp.float32).astype(dtype) for j in range(2))
            for i in range(cfg.layers)]


def rel_err(a, b) -> float:
    """||a - b|| / ||b|| over all leaves of two pytrees together (float32, on their device)."""
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    num = sum(jnp.sum(jnp.square(x.astype(jnp.float32) - y.astype(jnp.float32))) for x, y in zip(la, lb))
    den = sum(jnp.sum(jnp.square(y.astype(jnp.float32))) for y in lb)
    return float(jnp.sqrt(num / den))


def worst_leaf_err(a, b) -> float:
    """The largest rel_err of one leaf against its counterpart (e.g. the worst gradient)."""
    return max(rel_err(x, y) for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))
