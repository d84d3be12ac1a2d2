"""Code written against upstream jax-aiter's API runs unchanged: `jax_aiter.rmsnorm` (and `jax_aiter.mha`).

The calls below are written as upstream's users and tests write them (module imports, positional and
keyword arguments with upstream's names, the return conventions); each must run and give what the op
it forwards to gives, bit for bit (the facades translate names and conventions, nothing else).
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
    import jax_aiter.rmsnorm as rmsnorm

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


FACADES = ["rmsnorm"]


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
