"""Small inputs of the memory-bound ops are written in jax.numpy, for XLA to fuse (jax_aiter/ops/_small.py).

The rest of the suite runs with JA_KERNEL_MIN_BYTES=0 (the pytest plugin sets it), so it tests the
kernels at every size; here each test sets the value it is about. What a call became is read from
the lowered program: a `ja_*` custom call, or none.
"""
from __future__ import annotations

import logging
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_aiter as ja
from jax_aiter import settings
from jax_aiter.ops import _small
from tests.ops.reference import (
    assert_close,
    f64,
    random,
    rms_norm_ref,
    silu_and_mul_ref,
)

EPS = 1e-6
# name: (the op as a function of (x, weight, residual), its FFI target)
OPS = {
    "rms_norm": (lambda x, w, r: ja.rms_norm(x, w, EPS), "ja_rmsnorm_fwd"),
    "rms_norm_with_add": (lambda x, w, r: ja.rms_norm_with_add(x, r, w, EPS), "ja_rmsnorm_fwd_add"),
    "silu_and_mul": (lambda x, w, r: ja.silu_and_mul(x), "ja_silu_and_mul"),
}


def _targets(fn, *args) -> list[str]:
    """The custom-call targets in the lowered program of fn(*args), traced afresh (a new function each time:
    jit keeps the trace of a function it has seen, and with it the choice made then)."""
    return re.findall(r"custom_call @(ja_[a-z_]+)\(", jax.jit(lambda *a: fn(*a)).lower(*args).as_text())


def _inputs(shape, dtype):
    return random(shape, dtype, 0), random(shape[-1:], dtype, 1), random(shape, dtype, 2)


def _limit(monkeypatch, value: int | None) -> None:
    if value is None:
        monkeypatch.delenv(_small.SETTING, raising=False)
    else:
        monkeypatch.setenv(_small.SETTING, str(value))


def _check_values(name, got, x, w, r, dtype):
    if name == "rms_norm":
        assert_close(got, rms_norm_ref(x, w, EPS), dtype, what=name)
    elif name == "rms_norm_with_add":
        out, summed = got
        assert_close(summed, f64(x) + f64(r), dtype, what=f"{name} (sum)")
        assert_close(out, rms_norm_ref(jnp.asarray(summed), w, EPS), dtype, what=name)
    else:
        assert_close(got, silu_and_mul_ref(x), dtype, what=name)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("name", OPS)
def test_default_writes_a_decode_sized_call_in_jax_numpy(name, dtype, device, monkeypatch):
    """A decode step's few rows (8 x 4096) call no kernel by default; the results match the float64 reference
    as the kernel's do, and a large x (1 MiB and more) still calls the kernel."""
    _limit(monkeypatch, None)
    assert settings.from_env(_small.SETTING) == 1 << 20
    fn, target = OPS[name]
    small = _inputs((8, 4096), dtype)
    assert _targets(fn, *small) == []
    _check_values(name, jax.jit(fn)(*small), *small, dtype)
    rows = (1 << 20) // (4096 * jnp.dtype(dtype).itemsize)  # exactly 1 MiB: the kernel
    assert _targets(fn, *(jax.ShapeDtypeStruct((rows, 4096), dtype), jax.ShapeDtypeStruct((4096,), dtype),
                          jax.ShapeDtypeStruct((rows, 4096), dtype))) == [target]


@pytest.mark.parametrize("name", OPS)
def test_the_limit_is_the_bytes_of_x(name, device, monkeypatch):
    """x of n bytes calls the kernel at a limit of n, and is written in jax.numpy at n + 1; 0 always calls it."""
    fn, target = OPS[name]
    args = _inputs((6, 64), jnp.bfloat16)
    n = 6 * 64 * 2
    for limit, want in ((n, [target]), (n + 1, []), (0, [target])):
        _limit(monkeypatch, limit)
        assert _targets(fn, *args) == want, f"{name} at {n} bytes with {_small.SETTING}={limit}"


@pytest.mark.parametrize("name", OPS)
def test_both_forms_agree_values_and_gradients(name, device, monkeypatch):
    """The jax.numpy form and the kernel give the same values (within rounding) and the same gradients."""
    fn, _ = OPS[name]
    x, w, r = _inputs((5, 96), jnp.float32)
    g = random((5, 96 if name != "silu_and_mul" else 48), jnp.float32, 3)

    def loss(x, w, r):
        out = fn(x, w, r)
        out = out[0] + 0.5 * out[1] if isinstance(out, tuple) else out
        return jnp.sum(out * g)

    results = {}
    for limit in (0, 1 << 20):
        _limit(monkeypatch, limit)
        results[limit] = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(x, w, r)
    (v0, g0), (v1, g1) = results[0], results[1 << 20]
    np.testing.assert_allclose(float(v1), float(v0), rtol=1e-5)
    for a, b in zip(g1, g0):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


def test_vmap_counts_the_folded_rows(device, monkeypatch):
    """Under vmap the size is the call's after the batch folded into the rows: 16 examples of 4 x 64 float32
    (1 KiB each, 16 KiB together) call the kernel at a limit of 8 KiB."""
    _limit(monkeypatch, 8 << 10)
    x, w = random((16, 4, 64), jnp.float32, 0), random((64,), jnp.float32, 1)
    assert _targets(jax.vmap(lambda x: ja.rms_norm(x, w)), x) == ["ja_rmsnorm_fwd"]
    assert _targets(lambda x: ja.rms_norm(x[0], w), x) == []


def test_a_symbolic_shape_gets_the_kernel(device, monkeypatch):
    """jax.export with a symbolic row count: the size is unknown, so the kernel is called (even where every
    concrete size would be small)."""
    _limit(monkeypatch, 1 << 30)
    rows, = jax.export.symbolic_shape("rows")
    exp = jax.export.export(jax.jit(lambda x, w: ja.rms_norm(x, w)),
                            disabled_checks=ja.disabled_checks(["rmsnorm_fwd"]))(
        jax.ShapeDtypeStruct((rows, 64), jnp.float32), jax.ShapeDtypeStruct((64,), jnp.float32))
    assert "ja_rmsnorm_fwd" in exp.mlir_module()


def test_the_choice_is_logged(device, monkeypatch, caplog):
    _limit(monkeypatch, None)
    x, w = random((8, 64), jnp.float32, 0), random((64,), jnp.float32, 1)
    with caplog.at_level(logging.DEBUG, logger="jax_aiter"):
        jax.jit(lambda x, w: ja.rms_norm(x, w)).lower(x, w)
    assert any("rms_norm: x float32 (8, 64) is 2048 bytes, under JA_KERNEL_MIN_BYTES=1048576" in m
               for m in caplog.messages), caplog.messages


@pytest.mark.parametrize("value", ["-1", "1.5", "nan", "lots"])
def test_a_bad_value_names_the_setting(value, device, monkeypatch):
    monkeypatch.setenv(_small.SETTING, value)
    x, w = random((8, 64), jnp.float32, 0), random((64,), jnp.float32, 1)
    with pytest.raises(settings.SettingError, match=rf"JA_KERNEL_MIN_BYTES='{re.escape(value)}' is not valid.*an "
                                                    r"integer from 0 to"):
        jax.jit(lambda x, w: ja.rms_norm(x, w)).lower(x, w)
