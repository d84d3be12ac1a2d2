"""Attention's arguments under the transformations users apply (docs/transformations.md, "Attention's arguments
under the transformations"): vmap, remat, scan, jax.export with symbolic dims (and a reload in a fresh process),
and zero-size inputs, each with the features that change how the op folds, saves or traces (windows, segment
ids, cu_seqlens, bias, ALiBi, softcap, dropout). Each transformed program is compared with the same program
written without the transformation (a Python loop, no checkpoint, the jitted original), gradients included.
Sharding: tests/multigpu/."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

import jax_aiter
from jax_aiter import mha
from tests.ops.test_export import reload_in_a_fresh_process

B, S, HQ, HKV, D = 2, 20, 4, 2, 32


def _rand(seed, shape, dtype=np.float32):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape).astype(dtype))


def _qkv(seed=0, lead=(), b=B, sq=S, sk=S):
    return (_rand(seed, (*lead, b, sq, HQ, D)), _rand(seed + 1, (*lead, b, sk, HKV, D)),
            _rand(seed + 2, (*lead, b, sk, HKV, D)))


SEG = np.asarray([[0] * 7 + [1] * 13, [5] * 12 + [6] * 8], np.int32)


def _close(a, b, what="", tol=2e-6):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(np.asarray(x, np.float32), np.asarray(y, np.float32), rtol=tol, atol=tol,
                                   err_msg=what)


def _loss(f):
    return lambda *a: jnp.sum(jnp.sin(f(*a)))


# --- vmap ------------------------------------------------------------------------------------------------

N = 3  # examples mapped by vmap

VMAP = [
    ("window-softcap", lambda q, k, v: jax_aiter.flash_attn_func(q, k, v, causal=True, window_size=(5, -1),
                                                                  softcap=6.0)),
    ("shared-segments", lambda q, k, v: jax_aiter.flash_attn_func(q, k, v, segment_ids=SEG, causal=True)),
    ("shared-alibi", lambda q, k, v: jax_aiter.flash_attn_func(q, k, v, alibi_slopes=jnp.linspace(0.1, 0.4, HQ))),
    ("shared-bias", lambda q, k, v: jax_aiter.flash_attn_func(q, k, v, bias=jnp.linspace(-1, 1, S * S).reshape(S, S),
                                                               window_size=(4, 2))),
]


@pytest.mark.parametrize("fn", [c[1] for c in VMAP], ids=[c[0] for c in VMAP])
def test_vmap_equals_a_loop(device, fn):
    """vmap over a leading axis of q, k, v (the arguments shared): each example as it would run alone, forward
    and gradients."""
    q, k, v = _qkv(0, (N,))
    got = jax.jit(jax.vmap(fn))(q, k, v)
    want = [fn(q[i], k[i], v[i]) for i in range(N)]
    _close(got, jnp.stack(want), "forward")
    g = jax.jit(jax.vmap(jax.grad(_loss(fn), argnums=(0, 1, 2))))(q, k, v)
    gw = [jax.grad(_loss(fn), argnums=(0, 1, 2))(q[i], k[i], v[i]) for i in range(N)]
    for i, name in enumerate(("dq", "dk", "dv")):
        _close(g[i], jnp.stack([w[i] for w in gw]), name)


def test_vmap_of_per_example_arguments(device):
    """segment_ids, ALiBi slopes, a bias and cu_seqlens mapped with the example (each its own packing)."""
    q, k, v = _qkv(3, (N,))
    seg = jnp.asarray(np.stack([SEG, SEG[::-1], np.zeros_like(SEG)]))
    slopes = _rand(7, (N, HQ)) ** 2
    bias = _rand(8, (N, S, S))

    def fn(q, k, v, seg, slopes, bias):
        return jax_aiter.flash_attn_func(q, k, v, segment_ids=seg, alibi_slopes=slopes, bias=bias, causal=True)

    got = jax.jit(jax.vmap(fn))(q, k, v, seg, slopes, bias)
    _close(got, jnp.stack([fn(q[i], k[i], v[i], seg[i], slopes[i], bias[i]) for i in range(N)]))
    g = jax.jit(jax.vmap(jax.grad(_loss(fn), argnums=(0, 1, 2, 5))))(q, k, v, seg, slopes, bias)
    for i in range(N):
        _close([x[i] for x in g], jax.grad(_loss(fn), argnums=(0, 1, 2, 5))(q[i], k[i], v[i], seg[i], slopes[i],
                                                                            bias[i]), f"example {i}")

    cus = jnp.asarray([[0, 5, 20, 40], [0, 0, 33, 40], [0, 13, 14, 40]], jnp.int32)
    pq, pk, pv = (_rand(9 + i, (N, 40, h, D)) for i, h in enumerate((HQ, HKV, HKV)))

    def varlen(q, k, v, cu):
        out, lse = mha.flash_attn_varlen(q, k, v, cu, cu, causal=True, window_size=(6, -1), return_lse=True)
        return out, lse

    got = jax.jit(jax.vmap(varlen))(pq, pk, pv, cus)
    want = [varlen(pq[i], pk[i], pv[i], cus[i]) for i in range(N)]
    _close(got[0], jnp.stack([w[0] for w in want]), "varlen out")
    _close(got[1], jnp.stack([w[1] for w in want]), "varlen lse")


def test_vmap_dropout_one_key_and_a_key_per_example(device):
    """One key: the examples are rows of one batch (each draws its own mask): the vmapped call equals one call on
    the examples concatenated along the batch. A key per example: each draws as it would alone."""
    q, k, v = _qkv(11, (N,))
    key = jax.random.key(2)

    def fn(q, k, v, key):
        return jax_aiter.flash_attn_func(q, k, v, dropout_p=0.3, dropout_key=key, causal=True)

    got = jax.jit(jax.vmap(fn, in_axes=(0, 0, 0, None)))(q, k, v, key)
    flat = fn(*(x.reshape(N * B, *x.shape[2:]) for x in (q, k, v)), key)
    _close(got, flat.reshape(got.shape), "one key")
    keys = jax.random.split(key, N)
    got = jax.jit(jax.vmap(fn))(q, k, v, keys)
    _close(got, jnp.stack([fn(q[i], k[i], v[i], keys[i]) for i in range(N)]), "a key per example")


# --- remat and scan ---------------------------------------------------------------------------------------

def _features(q, k, v, bias, key):
    return jax_aiter.flash_attn_func(q, k, v, causal=True, window_size=(6, -1), softcap=10.0, segment_ids=SEG,
                                     alibi_slopes=jnp.full((HQ,), 0.1), bias=bias, dropout_p=0.1, dropout_key=key)


@pytest.mark.parametrize("policy", [None, jax.checkpoint_policies.nothing_saveable,
                                    jax.checkpoint_policies.everything_saveable],
                         ids=["default", "nothing", "everything"])
def test_remat_gives_the_same_gradients(device, policy):
    """jax.checkpoint around attention with every feature: the recomputed forward draws the same dropout mask and
    the gradients equal the ones without remat, bit for bit."""
    q, k, v = _qkv(20)
    bias, key = _rand(23, (S, S)), jax.random.key(4)
    loss = _loss(_features)
    want = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))(q, k, v, bias, key)
    got = jax.jit(jax.grad(jax.checkpoint(loss, policy=policy), argnums=(0, 1, 2, 3)))(q, k, v, bias, key)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


@pytest.mark.parametrize("policy, forwards", [
    ("nothing", 2), ("everything", 1), ("dots", 2), ("attention names", 1), ("dots and attention names", 1)])
def test_a_policy_that_saves_the_named_residuals_runs_the_forward_once(device, policy, forwards):
    """Under jax.checkpoint in a scan over layers (where XLA cannot merge a recomputed forward with the first), the
    gradient runs the attention forward again unless the policy keeps its residuals: everything_saveable does, and
    so does any policy that saves them by name (jax_aiter.ops.attention.RESIDUAL_NAMES, out and lse). Counted in the
    compiled gradient's custom calls; the gradients are the ones without remat."""
    import re

    from jax_aiter.ops.attention import RESIDUAL_NAMES

    cp = jax.checkpoint_policies
    names = cp.save_only_these_names(*RESIDUAL_NAMES)
    pol = {"nothing": cp.nothing_saveable, "everything": cp.everything_saveable, "dots": cp.dots_saveable,
           "attention names": names, "dots and attention names": cp.save_from_both_policies(cp.dots_saveable, names)}
    w = _rand(30, (3, D * HQ, D * HQ)) * 0.1
    x0 = _rand(31, (B, S, D * HQ))

    def layer(x, wi):
        q = (x @ wi).reshape(B, S, HQ, D)
        return jnp.tanh(jax_aiter.flash_attn_func(q, q, q, causal=True).reshape(B, S, D * HQ)), None

    def loss(w, body):
        return jax.lax.scan(body, x0, w)[0].sum()

    grad = jax.jit(jax.grad(lambda w: loss(w, jax.checkpoint(layer, policy=pol[policy]))))
    text = grad.lower(w).compile().as_text()
    assert len(re.findall(r'custom_call_target="ja_mha_fwd"', text)) == forwards
    np.testing.assert_allclose(np.asarray(grad(w)), np.asarray(jax.jit(jax.grad(lambda w: loss(w, layer)))(w)),
                               rtol=1e-6, atol=1e-7)


# XLA's GPU dynamic-slice fusion (on by default in JAX 0.11's CUDA plugin) folds a custom call whose result feeds
# a scan's stacked residual into one fusion that writes the slot in place; for a call whose results are aliased to
# operands (the harness's NaN poisoning, jax_aiter/ops/_ffi.py) it loses the write, and the backward reads a residual
# the forward never stored (measured on the H200: dx off by up to 8.6e3). Production calls carry no aliases: their
# gradients are the same with the fusion on and off (test_scan_gradients_do_not_depend_on_dynamic_slice_fusion).
NO_DSF = {"xla_gpu_enable_dynamic_slice_fusion": False}


@pytest.fixture
def fresh_traces():
    """JAX's trace caches emptied before and after the test: poisoning (JA_POISON_OUTPUTS) is decided when an op
    is traced, and a trace cached under the other setting would be reused (seen on the H200: the production form,
    run after the poisoned one in one process, got the poisoned calls)."""
    jax.clear_caches()
    yield
    jax.clear_caches()


def _scan_and_unrolled(layers=3):
    wq = _rand(30, (layers, D, D)) * 0.2
    keys = jax.random.split(jax.random.key(5), layers)
    x0 = _rand(31, (B, S, HQ, D))

    def layer(x, w, key):
        y = jnp.einsum("bshd,de->bshe", x, w, precision=jax.lax.Precision.HIGHEST)
        kv = y[:, :, :HKV]
        return x + jax_aiter.flash_attn_func(y, kv, kv, causal=True, window_size=(4, -1), softcap=8.0,
                                             segment_ids=SEG, dropout_p=0.1, dropout_key=key)

    def scanned(x, wq):
        return jnp.sum(jax.lax.scan(lambda x, a: (layer(x, *a), None), x, (wq, keys))[0] ** 2)

    def unrolled(x, wq):
        for i in range(layers):
            x = layer(x, wq[i], keys[i])
        return jnp.sum(x ** 2)

    return scanned, unrolled, (x0, wq)


@pytest.mark.parametrize("poisoned", [True, False], ids=["poisoned", "production"])
def test_scan_over_layers(device, poisoned, monkeypatch, fresh_traces):
    """lax.scan over layers (a key per layer, window and softcap, segment ids): equal to the unrolled loop,
    forward and gradients; with the harness's poisoned outputs and as users call it (no aliases)."""
    monkeypatch.setenv("JA_POISON_OUTPUTS", "1" if poisoned else "0")
    opts = NO_DSF if poisoned and device.platform == "gpu" else None
    scanned, unrolled, args = _scan_and_unrolled()
    grad = lambda f: jax.jit(jax.grad(f, argnums=(0, 1)), compiler_options=opts)
    # float32 on the GPU: the two programs fuse differently, so their sums round in different orders
    tol = 2e-6 if device.platform == "cpu" else 2e-5
    _close(jax.jit(scanned, compiler_options=opts)(*args), jax.jit(unrolled)(*args), "forward", tol)
    _close(grad(scanned)(*args), grad(unrolled)(*args), "gradients", tol)


@pytest.mark.gpu
@pytest.mark.parametrize("device", ["gpu"], indirect=True)  # dynamic-slice fusion is a GPU pass
def test_scan_gradients_do_not_depend_on_dynamic_slice_fusion(device, monkeypatch, fresh_traces):
    """As users call it (no poisoning), the scanned program's gradients are bitwise the same whether XLA's GPU
    dynamic-slice fusion wraps the attention calls or not."""
    monkeypatch.setenv("JA_POISON_OUTPUTS", "0")
    scanned, _, args = _scan_and_unrolled()
    on = jax.jit(jax.grad(scanned, argnums=(0, 1)))(*args)
    off = jax.jit(jax.grad(scanned, argnums=(0, 1)), compiler_options=NO_DSF)(*args)
    for x, y in zip(on, off):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


# --- jax.export with symbolic dims ------------------------------------------------------------------------

def _export_fn(q, k, v, bias, seg, slopes):
    out = jax_aiter.flash_attn_func(q, k, v, causal=True, window_size=(5, -1), softcap=9.0, segment_ids=seg,
                                    alibi_slopes=slopes, bias=bias, dropout_p=0.1,
                                    dropout_key=jax.random.key(1))
    return out


def _export_grad(*a):
    return jax.grad(_loss(_export_fn), argnums=(0, 1, 2, 3))(*a)


def _export_args(b, s, seed=0):
    rng = np.random.default_rng(seed)
    f = lambda *shape: rng.standard_normal(shape).astype(np.float32)
    seg = np.repeat(np.arange(b * 3).reshape(b, 3), -(-s // 3), axis=1)[:, :s].astype(np.int32)
    return [f(b, s, HQ, D), f(b, s, HKV, D), f(b, s, HKV, D), f(b, 1, s, s), seg, np.abs(f(b, HQ))]


def _symbolic():
    scope = export.SymbolicScope()
    shapes = ["b, s, 4, 32", "b, s, 2, 32", "b, s, 2, 32", "b, 1, s, s", "b, s", "b, 4"]
    dtypes = [jnp.float32] * 4 + [jnp.int32, jnp.float32]
    return [jax.ShapeDtypeStruct(export.symbolic_shape(s, scope=scope), d) for s, d in zip(shapes, dtypes)]


def test_export_with_symbolic_batch_and_length_and_every_array_argument(device):
    """Symbolic batch and sequence length with a window, softcap, segment ids, per-example ALiBi, a bias and
    dropout: the exported forward and gradient equal the jitted ones at two bindings."""
    for fn in (_export_fn, _export_grad):
        exp = export.export(jax.jit(fn), disabled_checks=jax_aiter.disabled_checks())(*_symbolic())
        for b, s in ((1, 9), (3, 70)):
            args = _export_args(b, s)
            for g, w in zip(jax.tree.leaves(exp.call(*args)), jax.tree.leaves(jax.jit(fn)(*args))):
                np.testing.assert_array_equal(np.asarray(g), np.asarray(w), err_msg=f"{fn.__name__} at {b}, {s}")


def _varlen_fn(q, k, v, cu):
    out, lse = mha.flash_attn_varlen(q, k, v, cu, cu, causal=True, window_size=(8, -1), return_lse=True)
    return out, lse


def test_export_varlen_with_symbolic_tokens_and_sequences(device):
    """flash_attn_varlen with the packed length and the number of sequences symbolic."""
    scope = export.SymbolicScope()
    specs = [jax.ShapeDtypeStruct(export.symbolic_shape(s, scope=scope), d) for s, d in
             (("t, 4, 32", jnp.float32), ("t, 2, 32", jnp.float32), ("t, 2, 32", jnp.float32), ("n", jnp.int32))]
    exp = export.export(jax.jit(_varlen_fn), disabled_checks=jax_aiter.disabled_checks())(*specs)
    for cu in ([0, 7, 7, 30], [0, 100]):
        t = cu[-1]
        args = [np.asarray(_rand(i, (t, h, D))) for i, h in enumerate((HQ, HKV, HKV))] + [np.asarray(cu, np.int32)]
        for g, w in zip(exp.call(*args), jax.jit(_varlen_fn)(*args)):
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_exported_features_reload_in_a_fresh_process(tmp_path):
    """The symbolic export of attention with every array argument, serialized, then deserialized and run in a new
    interpreter (registered by JAX's plugin hook): the same outputs and gradients bit for bit."""
    reload_in_a_fresh_process(tmp_path, {"forward": _export_fn, "grad": _export_grad}, _symbolic(),
                              _export_args(2, 33, seed=3))


# --- zero-size inputs -------------------------------------------------------------------------------------

def _all_args(b, sq, sk):
    """Every array argument, shaped for a call of batch b, seq_q sq, seq_k sk (segment ids need sq == sk)."""
    kw = {"causal": True, "window_size": (3, -1), "softcap": 5.0, "alibi_slopes": jnp.full((HQ,), 0.2),
          "dropout_p": 0.2, "dropout_key": jax.random.key(0)}
    if sq == sk:
        kw["segment_ids"] = jnp.zeros((b, sq), jnp.int32)
    return kw


ZERO = [("batch0", 0, 8, 8), ("seq_q0", 2, 0, 8), ("seq_k0", 2, 8, 0), ("seq0", 2, 0, 0)]


@pytest.mark.parametrize("b,sq,sk", [z[1:] for z in ZERO], ids=[z[0] for z in ZERO])
def test_zero_size_with_every_argument(device, b, sq, sk):
    """A zero dimension with every argument given: no kernel call, zero outputs (rows that see no key), zero
    gradients of the inputs' shapes, the bias's included; a varlen batch of no tokens likewise."""
    q, k, v = _rand(0, (b, sq, HQ, D)), _rand(1, (b, sk, HKV, D)), _rand(2, (b, sk, HKV, D))
    bias = _rand(3, (sq, sk))

    def fn(q, k, v, bias):
        return jax_aiter.flash_attn_func(q, k, v, bias=bias, **_all_args(b, sq, sk))

    grad = jax.grad(_loss(fn), argnums=(0, 1, 2, 3))
    for f in (fn, grad):
        text = str(jax.make_jaxpr(f)(q, k, v, bias))
        assert "ffi_call" not in text and "custom_partitioning" not in text, f"a kernel is called:\n{text}"
    out = jax.jit(fn)(q, k, v, bias)
    assert out.shape == (b, sq, HQ, D) and not np.asarray(out).any()
    for g, a in zip(jax.jit(grad)(q, k, v, bias), (q, k, v, bias)):
        assert g.shape == a.shape and not np.asarray(g).any()

    e = jnp.zeros((0, HQ, D))
    out, lse = mha.flash_attn_varlen(e, e[:, :HKV], e[:, :HKV], np.zeros(3, np.int32), np.zeros(3, np.int32),
                                     causal=True, return_lse=True)
    assert out.shape == (0, HQ, D) and lse.shape == (HQ, 0)
