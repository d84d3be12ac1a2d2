"""The model benchmark's Llama-like decoder (benchmarks/gpu/llama.py) at a tiny size: the model built
from our ops agrees with the same model in plain JAX, and its decode step agrees with its prefill.

bench_gpu.py --only model times these models at full size on a GPU and checks the same agreement
there (model_bench.agreement); here they run on every device the op tests run on, so CI covers
the model code and a change to an op that breaks the model shows up without a GPU.

Bounds: float32 runs the same math in a different order (flash attention's online softmax against
a materialised one), about 1e-6 apart, when both models' matrix products are float32: on a GPU XLA's
default precision for float32 dots is TF32 (measured on the H200: logits 5e-4 apart), so the float32
case runs under jax.default_matmul_precision("highest"). 1e-4 leaves room and still catches any real
difference (a wrong mask, position or residual is off by 1e-1 or more). bfloat16 uses model_bench.AGREE, the
bounds the GPU benchmark applies (measured at this size on the CPU: logits 7e-3, loss 4e-4, worst
gradient 1.3e-2).
"""
from __future__ import annotations

import contextlib
import importlib
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _module(name: str):
    """benchmarks/gpu/<name>.py, a module of the checkout's benchmarks package."""
    return importlib.import_module(f"benchmarks.gpu.{name}")


@pytest.fixture(scope="module")
def llama():
    return _module("llama")


@pytest.fixture(scope="module")
def model_bench():
    _module("llama")
    return _module("model_bench")


def tiny(llama, head_dim=32):
    return llama.Config(layers=2, d_model=64, heads_q=4, heads_kv=2, head_dim=head_dim, ffn=96, vocab=101)


BOUNDS = {jnp.float32: {"logits": 1e-4, "loss": 1e-5, "grad": 1e-4}}


@pytest.mark.parametrize("head_dim,dtype", [(32, jnp.float32), (32, jnp.bfloat16), (256, jnp.bfloat16)],
                         ids=["d32-float32", "d32-bfloat16", "d256-bfloat16"])
def test_our_model_agrees_with_plain_jax(device, llama, model_bench, dtype, head_dim):
    exact = jax.default_matmul_precision("highest") if dtype == jnp.float32 else contextlib.nullcontext()
    with exact:
        _agree(llama, model_bench, dtype, head_dim)


def _agree(llama, model_bench, dtype, head_dim):
    cfg = tiny(llama, head_dim)
    bounds = BOUNDS.get(dtype, model_bench.AGREE)
    params = llama.init_params(cfg, jax.random.key(1), dtype)
    tokens = jax.random.randint(jax.random.key(2), (2, 17), 0, cfg.vocab)
    ours, plain = llama.our_ops(), llama.plain_ops()

    logits = [jax.jit(lambda p, t, o=o: llama.forward(cfg, o, p, t))(params, tokens[:, :-1]) for o in (ours, plain)]
    assert llama.rel_err(*logits) <= bounds["logits"]

    (l_ours, g_ours), (l_plain, g_plain) = (jax.jit(llama.train_step(cfg, o))(params, tokens) for o in (ours, plain))
    assert abs(float(l_ours) - float(l_plain)) <= bounds["loss"] * abs(float(l_plain))
    assert llama.worst_leaf_err(g_ours, g_plain) <= bounds["grad"]
    assert all(float(jnp.abs(g).max()) > 0 for g in jax.tree_util.tree_leaves(g_ours))  # every weight learns

    cache = llama.init_cache(cfg, jax.random.key(3), 2, 24, dtype)
    step = [jax.jit(lambda p, c, t, pos, o=o: llama.decode_step(cfg, o, p, c, t, pos))(params, cache, tokens[:, 0],
                                                                                         jnp.int32(23))
            for o in (ours, plain)]
    assert llama.rel_err(step[0][0], step[1][0]) <= bounds["logits"]
    assert llama.rel_err(step[0][1], step[1][1]) <= bounds["logits"]  # the caches the two steps wrote


@pytest.mark.parametrize("which", ["ours", "plain"])
def test_decode_step_continues_the_prefill(device, llama, which):
    """Prefill s - 1 tokens, then decode token s - 1 at position s - 1: the logits equal the prefill's of all s."""
    cfg = tiny(llama)
    ops = llama.our_ops() if which == "ours" else llama.plain_ops()
    params = llama.init_params(cfg, jax.random.key(4), jnp.float32)
    s = 12
    tokens = jax.random.randint(jax.random.key(5), (2, s), 0, cfg.vocab)
    prefill = jax.jit(lambda p, t: llama.prefill(cfg, ops, p, t))
    full, _ = prefill(params, tokens)
    _, cache = prefill(params, tokens[:, :-1])
    cache = [tuple(jnp.pad(x, ((0, 0), (0, 1), (0, 0), (0, 0))) for x in kv) for kv in cache]  # a slot for the token
    logits, new_cache = jax.jit(lambda p, c, t, pos: llama.decode_step(cfg, ops, p, c, t, pos))(
        params, cache, tokens[:, -1], jnp.int32(s - 1))
    assert llama.rel_err(logits, full[:, -1]) <= 1e-5
    assert all(float(jnp.abs(k[:, -1]).max()) > 0 for k, _ in new_cache)  # the token's keys were written


def test_agreement_check_fails_on_a_wrong_model(device, llama, model_bench):
    """The benchmark's check is not a formality: plain JAX with its attention's mask dropped disagrees."""
    cfg = tiny(llama)
    params = llama.init_params(cfg, jax.random.key(6), jnp.bfloat16)
    tokens = jax.random.randint(jax.random.key(7), (2, 16), 0, cfg.vocab)
    plain = llama.plain_ops()
    unmasked = plain.__class__("unmasked", plain.rms_norm, plain.rms_norm_add, plain.silu_and_mul,
                               lambda q, k, v, causal, **features: plain.attention(q, k, v, False))
    outs = [{"logits": jax.jit(lambda p, t, o=o: llama.forward(cfg, o, p, t))(params, tokens)}
            for o in (llama.our_ops(), unmasked)]
    verdict = model_bench.agreement(*outs)
    assert not verdict["agree"], verdict
    assert verdict["logits_rel_err"] > 10 * model_bench.AGREE["logits"]


def test_op_swaps_put_one_group_of_ours_into_plain_jax(device, llama, model_bench):
    """bench_gpu.py --model-swaps times plain JAX with one group of our ops swapped in: each such model takes
    exactly that group from ours (the rest stays plain JAX) and still agrees with plain JAX."""
    cfg = tiny(llama)
    params = llama.init_params(cfg, jax.random.key(8), jnp.float32)
    tokens = jax.random.randint(jax.random.key(9), (2, 16), 0, cfg.vocab)
    ours, plain = llama.our_ops(), llama.plain_ops()
    fields = ("rms_norm", "rms_norm_add", "silu_and_mul", "attention")
    assert {f for group in model_bench.SWAPS.values() for f in group} == set(fields)  # every op is in a group
    with jax.default_matmul_precision("highest"):  # float32 dots as float32 on a GPU too (module docstring)
        base = jax.jit(lambda p, t: llama.forward(cfg, plain, p, t))(params, tokens)
        for group in model_bench.SWAPS.values():
            ops = llama.swapped(plain, ours, *group)
            assert all(getattr(ops, f) is getattr(ours if f in group else plain, f) for f in fields), ops.name
            logits = jax.jit(lambda p, t, o=ops: llama.forward(cfg, o, p, t))(params, tokens)
            assert llama.rel_err(logits, base) <= BOUNDS[jnp.float32]["logits"], ops.name


@pytest.mark.parametrize("kind", ["decode", "prefill", "train"])
def test_hlo_launches_counts_what_the_compiled_step_calls(device, llama, model_bench, kind):
    """The launch census a model row records (model_bench.hlo_launches, from the compiled step's HLO): with
    2 layers, our model calls our forward ops once per use (1 + 2 x 2 norms, 2 SiLU-and-mul, 2 attention) and a
    train step adds the attention backward (the norms' and SiLU's gradients are JAX's); plain JAX's model calls
    none of ours; both launch XLA fusions."""
    cfg = tiny(llama)
    w = model_bench.Workload("tiny", kind, cfg, 2, 24, 1)
    params = llama.init_params(cfg, jax.random.key(10))
    census = {name: model_bench.build(w, ops, params, jax.random.key(11))[2]["hlo"]
              for name, ops in (("ours", llama.our_ops()), ("plain", llama.plain_ops()))}
    want = {"ja_rmsnorm_fwd": 1, "ja_rmsnorm_fwd_add": 4, "ja_silu_and_mul": 2, "ja_mha_fwd": 2,
            **({"ja_mha_bwd": 2} if kind == "train" else {})}
    ours = {k.split()[1]: v for k, v in census["ours"].items() if k.startswith("custom-call ja_")}
    assert ours == want, census["ours"]
    assert not any(k.startswith("custom-call ja_") for k in census["plain"]), census["plain"]
    assert census["ours"].get("fusion", 0) > 0 and census["plain"].get("fusion", 0) > 0


def test_a_rematerialized_train_step_runs_our_attention_forward_once(device, llama, model_bench):
    """Under llama.remat_policy (dots and the attention's named residuals saved) each layer's attention forward
    runs once in the compiled train step, as plain JAX's dots do; under dots_saveable alone it runs again in the
    gradient. The rematerialized step's loss and gradients are the plain step's."""
    cfg = tiny(llama).with_(remat=True)
    w = model_bench.Workload("tiny remat", "train", cfg, 2, 24, 1)
    params = llama.init_params(cfg, jax.random.key(12), jnp.float32)
    census = model_bench.build(w, llama.our_ops(), params, jax.random.key(13))[2]["hlo"]
    assert census.get("custom-call ja_mha_fwd") == cfg.layers and census.get("custom-call ja_mha_bwd") == cfg.layers
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(llama, "remat_policy", lambda: jax.checkpoint_policies.dots_saveable)
        again = model_bench.build(w, llama.our_ops(), params, jax.random.key(13))[2]["hlo"]
    assert again.get("custom-call ja_mha_fwd") == 2 * cfg.layers, again  # the unnamed residuals: recomputed
    tokens = jax.random.randint(jax.random.key(14), (2, 17), 0, cfg.vocab)
    with jax.default_matmul_precision("highest"):
        (l_remat, g_remat), (l_plain, g_plain) = (jax.jit(llama.train_step(c, llama.our_ops()))(params, tokens)
                                                  for c in (cfg, cfg.with_(remat=False)))
    assert abs(float(l_remat) - float(l_plain)) <= 1e-6 * abs(float(l_plain))
    assert llama.worst_leaf_err(g_remat, g_plain) <= 1e-5


# issue 56's model rows at a tiny size: a packed row of documents (ours varlen, plain JAX a segment mask) and
# Gemma 2's attention (a causal window on the even layers, softcap on every layer: plain JAX writes it out).
FEATURES = {"packed-docs": {"docs": (9, 4, 1, 2)}, "gemma2-window-softcap": {"window": 5, "softcap": 3.0}}


@pytest.mark.parametrize("features", list(FEATURES.values()), ids=list(FEATURES))
def test_feature_models_agree_with_plain_jax(device, llama, model_bench, features):
    cfg = tiny(llama).with_(**features)
    with jax.default_matmul_precision("highest"):
        params = llama.init_params(cfg, jax.random.key(1), jnp.float32)
        tokens = jax.random.randint(jax.random.key(2), (1, 17), 0, cfg.vocab)
        ours, plain = llama.our_ops(), llama.plain_ops()
        (l_ours, g_ours), (l_plain, g_plain) = (jax.jit(llama.train_step(cfg, o))(params, tokens)
                                                for o in (ours, plain))
        base = jax.jit(llama.train_step(tiny(llama), plain))(params, tokens)[0]
    bounds = BOUNDS[jnp.float32]
    assert abs(float(l_ours) - float(l_plain)) <= bounds["loss"] * abs(float(l_plain))
    assert llama.worst_leaf_err(g_ours, g_plain) <= bounds["grad"]
    assert abs(float(l_plain) - float(base)) > 1e-3 * abs(float(base)), "the features changed nothing"


def test_a_goal_on_attention_gets_the_step_without_attention(device, llama, model_bench):
    """bench_workload times an issue-56 workload (goal over 1) a third time with attention taken out
    (llama.without_attention): plain / that time is the most any attention kernel could give. That step
    calls no attention of ours and still computes and differentiates through all of q, k and v."""
    w = model_bench.Workload("tiny packed", "train", tiny(llama).with_(docs=(5, 8, 3)), 1, 16, 1, goal=1.8)
    row = model_bench.bench_workload(w, samples=2)
    assert row["no_attention_ms"] > 0 and row["goal_reachable"] == (row["no_attention_ms"] * 1.8 <= row["plain_ms"])
    assert row["ceiling_speedup"] == pytest.approx(row["plain_ms"] / row["no_attention_ms"])
    ops = llama.without_attention(llama.our_ops())
    tokens = jax.random.randint(jax.random.key(3), (1, 17), 0, w.cfg.vocab)
    params = llama.init_params(w.cfg, jax.random.key(4))
    step = jax.jit(llama.train_step(w.cfg, ops))
    hlo = step.lower(params, tokens).compile().as_text()
    assert "ja_mha" not in hlo and "ja_rmsnorm_fwd" in hlo  # our norms stay; attention is gone
    _, grads = step(params, tokens)
    nq, nk = w.cfg.heads_q * w.cfg.head_dim, w.cfg.heads_kv * w.cfg.head_dim
    q_k_v = jnp.split(grads["layers"][0]["wqkv"], [nq, nq + nk], axis=1)
    assert all(float(jnp.abs(part).max()) > 0 for part in q_k_v)
    decode = model_bench.Workload("tiny decode", "decode", tiny(llama), 1, 16, 1, goal=1.15)
    assert "no_attention_ms" not in model_bench.bench_workload(decode, samples=1)
