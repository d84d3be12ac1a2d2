"""float64 NumPy references and per-dtype error bounds for the op tests."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

# Bounds on |ours - ref| <= ATOL + RTOL * |ref|, per dtype. The kernels
# accumulate in float32 and round once on store, so the error is about one
# unit in the last place of the output dtype (bf16: 2^-8, f16: 2^-11) plus
# float32 accumulation noise; inputs are exactly representable in the dtype.
TOL = {
    jnp.dtype(jnp.float32): {"rtol": 2e-5, "atol": 2e-5},
    jnp.dtype(jnp.bfloat16): {"rtol": 1.6e-2, "atol": 1.6e-2},
    jnp.dtype(jnp.float16): {"rtol": 2e-3, "atol": 2e-3},
}
DTYPES = [jnp.float32, jnp.bfloat16, jnp.float16]


# Test inputs and outputs change dtype on the host (NumPy and ml_dtypes), never through XLA:
# an eager cast or jnp.asarray compiles one program per shape and dtype in every test
# process, which was over a third of the op tests' compilations.


def f64(a) -> np.ndarray:
    """a's values as float64 (exact for every dtype the ops take), converted on the host."""
    return np.asarray(a).astype(np.float64)


def f32(a) -> jax.Array:
    """a's values as a float32 array on the default device, converted on the host."""
    return jax.device_put(np.asarray(a).astype(np.float32))


def rms_norm_ref(x, w, eps):
    x, w = f64(x), f64(w)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu_and_mul_ref(x):
    x = f64(x)
    d = x.shape[-1] // 2
    a, b = x[..., :d], x[..., d:]
    return a / (1.0 + np.exp(-a)) * b


def assert_close(got, ref, dtype, scale: float = 1.0, what: str = "") -> None:
    tol = TOL[jnp.dtype(dtype)]
    got = f64(got)
    assert got.shape == ref.shape, f"{what}: shape {got.shape} != {ref.shape}"
    assert np.all(np.isfinite(got)), f"{what}: non-finite values in the output"
    err = np.abs(got - ref)
    bound = tol["atol"] * scale + tol["rtol"] * np.abs(ref)
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert np.all(err <= bound), (
        f"{what}: max error {err.max():.3g} at {worst} (got {got[worst]:.6g}, ref {ref[worst]:.6g}) "
        f"exceeds atol={tol['atol'] * scale:.3g} + rtol={tol['rtol']}*|ref| for {jnp.dtype(dtype).name}"
    )


def random(shape, dtype, seed: int, scale: float = 1.0) -> jax.Array:
    """Normal values rounded to dtype on the host, on the default device."""
    rng = np.random.default_rng(seed)
    return jax.device_put((rng.standard_normal(shape) * scale).astype(jnp.dtype(dtype)))


# Flash attention: float64 forward and gradients, the normwise error measure and its
# bounds per dtype (tests/ops/test_attention.py explains all three; the clean-room
# smoke test ships this file and uses them too).
ATTENTION_RTOL = {"float32": 1e-4, "bfloat16": 1e-2, "float16": 2e-3}


def attention_ref(q, k, v, do, causal: bool, scale: float):
    """float64 forward output and (dq, dk, dv) for q [b, sq, hq, d], k/v [b, sk, hkv, d]."""
    q, k, v, do = (np.asarray(x, np.float64) for x in (q, k, v, do))
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    g = hq // hkv
    ke, ve = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)
    s = np.einsum("bqhd,bkhd->bhqk", q, ke) * scale
    mask = np.ones((sq, sk), bool)
    if causal:
        mask = np.arange(sk)[None, :] <= np.arange(sq)[:, None] + sk - sq
    s = np.where(mask, s, -np.inf)
    m = s.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - m)
    den = p.sum(-1, keepdims=True)
    p = np.where(den > 0, p / np.where(den > 0, den, 1.0), 0.0)
    o = np.einsum("bhqk,bkhd->bqhd", p, ve)
    dov = np.einsum("bqhd->bhqd", do)
    dv = np.einsum("bhqk,bhqd->bkhd", p, dov)
    dp = np.einsum("bhqd,bkhd->bhqk", dov, ve)
    ds = p * (dp - (p * dp).sum(-1, keepdims=True))
    dq = np.einsum("bhqk,bkhd->bqhd", ds, ke) * scale
    dk = np.einsum("bhqk,bqhd->bkhd", ds, q) * scale
    dk = dk.reshape(b, sk, hkv, g, d).sum(3)
    dv = dv.reshape(b, sk, hkv, g, d).sum(3)
    return o, (dq, dk, dv)


def rel_err(got, ref) -> float:
    got = f64(got)
    assert np.all(np.isfinite(got)), "result has NaN or inf"
    floor = 0.1 * np.sqrt(ref.size)
    return float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), floor, 1e-30))
