"""Code written against upstream jax-aiter's API runs unchanged: `jax_aiter.mha` and `jax_aiter.rmsnorm`.

The calls below are written as upstream's users and its own tests (tests/test_mha_ja.py,
tests/test_mha_varlen_ja.py, tests/test_rmsnorm_ja.py upstream) write them: the module imports and
paths, positional and keyword arguments with upstream's names (min_seqlen_q, logits_soft_cap,
block_table=None, out=None ...), bias in the activations' dtype, dropout without a key, the return
conventions (a tuple: (out,), then lse, then the probabilities). Each must run; the facades translate names and
conventions only, so their results equal the op's bit for bit, and the op's equal a float32
jax.numpy reference as upstream's tests check it.
"""
from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_aiter
from tests.ops.reference import random, rms_norm_ref

ROOT = Path(__file__).resolve().parents[2]


def _same(a, b):
    np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


# --- jax_aiter.rmsnorm ----------------------------------------------------------------------------

def test_rmsnorm_module_calls(device):
    from jax_aiter.rmsnorm import rms_norm, rms_norm_with_add

    x, r = random((4, 7, 256), jnp.bfloat16, 0), random((4, 7, 256), jnp.bfloat16, 1)
    gamma = random((256,), jnp.bfloat16, 2)
    _same(rms_norm(x, gamma), jax_aiter.rms_norm(x, gamma))
    _same(rms_norm(x, gamma, 1e-5), jax_aiter.rms_norm(x, gamma, 1e-5))
    _same(rms_norm(x, gamma, epsilon=1e-3), jax_aiter.rms_norm(x, gamma, eps=1e-3))
    y, res = rms_norm_with_add(x, r, gamma, epsilon=1e-5)
    want = jax_aiter.rms_norm_with_add(x, r, gamma, 1e-5)
    _same(y, want[0])
    _same(res, want[1])
    ref = rms_norm_ref(np.asarray(x, np.float32), np.asarray(gamma, np.float32), 1e-5)
    np.testing.assert_allclose(np.asarray(rms_norm(x, gamma, 1e-5), np.float32), ref, rtol=2e-2, atol=2e-2)


def test_rmsnorm_module_under_jit_and_grad(device):
    from jax_aiter import rmsnorm

    x, gamma = random((8, 128), jnp.float32, 3), random((128,), jnp.float32, 4)

    @jax.jit
    def loss(x, gamma):
        y, res = rmsnorm.rms_norm_with_add(x, x, gamma)
        return jnp.sum(rmsnorm.rms_norm(y, gamma, epsilon=1e-6) * res)

    @jax.jit
    def ours(x, gamma):
        y, res = jax_aiter.rms_norm_with_add(x, x, gamma)
        return jnp.sum(jax_aiter.rms_norm(y, gamma) * res)

    for g, w in zip(jax.grad(loss, argnums=(0, 1))(x, gamma), jax.grad(ours, argnums=(0, 1))(x, gamma)):
        _same(g, w)


FACADES = ["activation", "mha", "rmsnorm"]


def test_the_serving_api_is_in_jax_aiter_ops_as_upstream_has_it():
    """`from jax_aiter.ops import append_kv, paged_attention, paged_prefill` (upstream's module), the same functions
    as jax_aiter.<name>; every public name of the op table is there, and only those."""
    from jax_aiter import ops
    from jax_aiter.ops import append_kv, paged_attention, paged_prefill  # noqa: F401  (the import is the test)

    for name in jax_aiter.__all__:
        if name not in ("register", "disabled_checks"):
            assert getattr(ops, name) is getattr(jax_aiter, name), name
    with pytest.raises(AttributeError, match="module 'jax_aiter.ops' has no attribute 'paged_atention'"):
        ops.paged_atention  # noqa: B018


@pytest.mark.parametrize("name", FACADES)
def test_facades_are_reachable_as_upstream_has_them(name):
    """`import jax_aiter` then `jax_aiter.<facade>` works (upstream's __init__ imports them), without importing
    JAX at `import jax_aiter` (checked in a fresh interpreter)."""
    assert getattr(jax_aiter, name) is importlib.import_module(f"jax_aiter.{name}")
    assert name in dir(jax_aiter)
    code = (f"import sys, jax_aiter; assert 'jax' not in sys.modules; m = jax_aiter.{name}; "
            f"assert m.__name__ == 'jax_aiter.{name}'; print('ok')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]


# --- jax_aiter.mha --------------------------------------------------------------------------------

def _make_qkv(b, sq, sk, hq, hk, d, dtype, seed=0):
    """As upstream's tests make them: jax.random.normal in the dtype, a legacy PRNGKey."""
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(seed), 3)
    return (jax.random.normal(k1, (b, sq, hq, d), dtype=dtype), jax.random.normal(k2, (b, sk, hk, d), dtype=dtype),
            jax.random.normal(k3, (b, sk, hk, d), dtype=dtype))


def _ref(q, k, v, causal=False, scale=None, window_size=(-1, -1), bias=None):
    """Upstream's test reference (float32 jax.numpy), with an additive bias."""
    q, k, v = q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32)
    scale = scale or q.shape[-1] ** -0.5
    sq, sk = q.shape[1], k.shape[1]
    k, v = jnp.repeat(k, q.shape[2] // k.shape[2], 2), jnp.repeat(v, q.shape[2] // v.shape[2], 2)
    s = jnp.einsum("bshd,bthd->bhst", q, k) * scale
    if bias is not None:
        s = s + bias.astype(jnp.float32)
    row, col = jnp.arange(sq)[:, None] + (sk - sq), jnp.arange(sk)[None, :]
    ok = jnp.ones((sq, sk), bool)
    if causal:
        ok &= col <= row
    if window_size[0] >= 0:
        ok &= row - col <= window_size[0]
    if window_size[1] >= 0:
        ok &= col - row <= window_size[1]
    p = jax.nn.softmax(jnp.where(ok, s, -jnp.inf), axis=-1)
    return jnp.einsum("bhst,bthd->bshd", jnp.nan_to_num(p), v)


def _close(out, ref, dtype, factor=1.0):
    """Upstream's criterion: eps^(2/3) of the dtype, absolute or relative to the largest reference value."""
    tol = (float(jnp.finfo(dtype).eps) ** (2 / 3) if dtype != jnp.float32 else 1e-5) * factor
    diff = float(jnp.max(jnp.abs(out.astype(jnp.float32) - ref.astype(jnp.float32))))
    assert diff < tol or diff / max(float(jnp.max(jnp.abs(ref))), 1e-6) < tol, (diff, tol)


BATCH = [
    (2, 64, 64, 4, 4, 32, jnp.bfloat16), (1, 64, 64, 2, 2, 256, jnp.bfloat16),
    (2, 96, 48, 4, 4, 64, jnp.bfloat16), (2, 48, 96, 4, 4, 64, jnp.bfloat16), (2, 64, 64, 6, 3, 64, jnp.float16),
    (2, 64, 64, 6, 1, 64, jnp.float16), (2, 1, 128, 4, 4, 64, jnp.bfloat16),
]


@pytest.mark.parametrize("b,sq,sk,hq,hk,d,dtype", BATCH, ids=lambda x: str(x) if not isinstance(x, type) else "")
@pytest.mark.parametrize("causal", [False, True], ids=["nomask", "causal"])
def test_mha_batch_calls(device, b, sq, sk, hq, hk, d, dtype, causal):
    """run_fwd / run_bwd as upstream writes them: result[0] of the tuple, grads of its sum."""
    from jax_aiter.mha import flash_attn_func

    q, k, v = _make_qkv(b, sq, sk, hq, hk, d, dtype)
    result = flash_attn_func(q, k, v, causal=causal)
    assert isinstance(result, tuple) and len(result) == 1
    out = result[0]
    assert out.shape == (b, sq, hq, d) and out.dtype == dtype and bool(jnp.all(jnp.isfinite(out)))
    _close(out, _ref(q, k, v, causal=causal), dtype)
    _same(out, jax_aiter.flash_attn_func(q, k, v, causal=causal))
    grads = jax.grad(lambda q, k, v: jnp.sum(flash_attn_func(q, k, v, causal=causal)[0]), argnums=(0, 1, 2))(q, k, v)
    want = jax.grad(lambda q, k, v: jnp.sum(_ref(q, k, v, causal=causal).astype(dtype)), argnums=(0, 1, 2))(q, k, v)
    for g, w in zip(grads, want):
        assert g.shape == w.shape and g.dtype == dtype and bool(jnp.all(jnp.isfinite(g)))
        _close(g, w, dtype, factor=10)  # upstream's backward factor


# --- flash_attn_varlen's returns, as current upstream's ------------------------------------------------------------

def test_varlen_returns_out_then_lse_then_probs(device):
    """(out,) by default; (out, lse) with return_lse, so `out, lse = flash_attn_varlen(..., return_lse=True)`
    unpacks; the probabilities appended with return_attn_probs (with or without dropout)."""
    from jax_aiter.mha import flash_attn_varlen

    cu = np.array([0, 5, 12], np.int32)
    q, k, v = (random((12, h, 32), jnp.float32, i) for i, h in enumerate((4, 2, 2)))
    result = flash_attn_varlen(q, k, v, cu, cu, causal=True)
    assert isinstance(result, tuple) and len(result) == 1 and result[0].shape == (12, 4, 32)
    out, lse = flash_attn_varlen(q, k, v, cu, cu, 7, 7, 0.0, None, True, (-1, -1), False, True)  # positional
    _same(out, result[0])
    assert lse.shape == (4, 12) and lse.dtype == jnp.float32
    out2, lse2, probs = flash_attn_varlen(q, k, v, cu, cu, max_seqlen_k=7, causal=True, return_lse=True,
                                          return_attn_probs=True)
    _same(out2, out)
    _same(lse2, lse)
    assert probs.shape == (4, 12, 7)
    np.testing.assert_allclose(np.asarray(probs).sum(-1), 1.0, rtol=1e-5)  # each row's probabilities over its keys
    out3, probs3 = flash_attn_varlen(q, k, v, cu, cu, max_seqlen_k=7, causal=True, return_attn_probs=True)
    _same(out3, out)
    _same(probs3, probs)


def test_varlen_return_types_are_overloads_on_literal():
    """Type checkers see (out,) for return_lse=False, (out, lse) with lse not Optional for return_lse=True, and a
    tuple of arrays for a bool known only at run time; each overload takes every argument the function does."""
    import inspect
    import typing

    from jax_aiter.mha import flash_attn_varlen

    overloads = typing.get_overloads(flash_attn_varlen)
    hints = [typing.get_type_hints(f) for f in overloads]
    one, pair, many = tuple[jax.Array], tuple[jax.Array, jax.Array], tuple[jax.Array, ...]
    assert [h["return"] for h in hints] == [one, pair, many]
    assert [h["return_lse"] for h in hints] == [typing.Literal[False], typing.Literal[True], bool]
    assert [h["return_attn_probs"] for h in hints] == [typing.Literal[False], typing.Literal[False], bool]
    extras = set(typing.get_type_hints(hints[0]["options"].__args__[0]))  # Unpack[_VarlenOptions]
    for f in overloads:
        names = set(inspect.signature(f).parameters) - {"options"} | extras
        assert names == set(inspect.signature(flash_attn_varlen).parameters), f


def test_a_type_checker_reads_the_varlen_returns(tmp_path):
    """mypy (the test environment's) on upstream-style calls: (out,), then (out, lse) with lse an Array (not
    Optional), and the overloads consistent with the implementation (mypy checks that too)."""
    mypy_api = pytest.importorskip("mypy.api", reason="mypy is not installed in this environment")
    code = tmp_path / "calls.py"
    code.write_text(
        "import jax.numpy as jnp\nfrom jax_aiter.mha import flash_attn_varlen\nq = cu = jnp.zeros(3)\n"
        "reveal_type(flash_attn_varlen(q, q, q, cu))\n"
        "out, lse = flash_attn_varlen(q, q, q, cu, causal=True, return_lse=True, logits_soft_cap=2.0)\n"
        "reveal_type(lse)\n")
    stdout, stderr, status = mypy_api.run([str(code), str(ROOT / "jax_aiter" / "mha" / "__init__.py"),
                                           "--ignore-missing-imports", "--follow-imports=silent", "--no-incremental"])
    assert status == 0, stdout + stderr
    revealed = [line.split("Revealed type is ")[1] for line in stdout.splitlines() if "Revealed type" in line]
    assert revealed == ['"tuple[jax._src.basearray.Array]"', '"jax._src.basearray.Array"'], stdout
