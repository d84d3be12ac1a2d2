"""Input checks shared by the ops: clear errors that name the problem and the fix."""
from __future__ import annotations

import math
import numbers

import jax
import jax.numpy as jnp
import numpy as np

SUPPORTED_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def _names() -> str:
    return ", ".join(d.name for d in SUPPORTED_DTYPES)


def check_dtype(op: str, name: str, arr) -> None:
    dt = jnp.dtype(arr.dtype)
    if dt not in SUPPORTED_DTYPES:
        raise TypeError(f"{op}: {name} has dtype {dt.name}; supported dtypes are {_names()} "
                        f"(cast with {name}.astype(jnp.bfloat16), for example)")


def check_same_dtype(op: str, ref_name: str, ref, name: str, arr) -> None:
    if jnp.dtype(arr.dtype) != jnp.dtype(ref.dtype):
        raise TypeError(f"{op}: {name} has dtype {jnp.dtype(arr.dtype).name} but {ref_name} has "
                        f"{jnp.dtype(ref.dtype).name}; cast {name} with {name}.astype({ref_name}.dtype)")


F32_MAX = float(np.finfo(np.float32).max)


def _f32_scalar(op: str, name: str, value, example: str) -> float:
    """A Python real that the kernel receives as float32: finite there, not only as a double."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{op}: {name} must be a Python float (e.g. {example}), got {type(value).__name__}; "
                        f"{name} is a compile-time constant, not an array")
    out = float(value)
    if not math.isfinite(out) or abs(out) > F32_MAX:
        raise ValueError(f"{op}: {name} must be finite in float32, got {out!r} (the kernels take it as float32, "
                         f"whose largest value is {F32_MAX:.6g}); give a value such as {example}")
    return out


def check_eps(op: str, eps) -> float:
    value = _f32_scalar(op, "eps", eps, "1e-6")
    if value < 0:
        raise ValueError(f"{op}: eps must be a finite non-negative float, got {value}")
    return value


def check_scale(op: str, softmax_scale, default: float) -> float:
    """softmax_scale as a float finite in float32; None gives `default` (1/sqrt(head_dim))."""
    if softmax_scale is None:
        return default
    return _f32_scalar(op, "softmax_scale", softmax_scale, f"{default:.6g} (1/sqrt(head_dim))")


def as_array(op: str, name: str, x) -> jax.Array:
    """x as a JAX array, as jax.numpy converts array-likes (lists, NumPy arrays, scalars): a float64 NumPy
    array becomes float32 unless jax_enable_x64 is on. Tracers and jax.Arrays pass through unchanged."""
    if isinstance(x, jax.Array):
        return x
    try:
        return jnp.asarray(x)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{op}: {name} must be an array or array-like (a jax.Array, a NumPy array or a nested "
                        f"list of numbers), got {type(x).__name__}: {e}") from None


def is_empty(x) -> bool:
    """True when a dimension of x is a known 0 (a symbolic dimension of jax.export is never 0)."""
    return any(isinstance(n, int) and n == 0 for n in x.shape)
