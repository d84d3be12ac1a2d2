"""Input checks shared by the ops: clear errors that name the problem and the fix."""
from __future__ import annotations

import math
import numbers

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


def check_eps(op: str, eps) -> float:
    if isinstance(eps, (bool, np.bool_)) or not isinstance(eps, numbers.Real):
        raise TypeError(f"{op}: eps must be a Python float (e.g. 1e-6), got {type(eps).__name__}; "
                        "eps is a compile-time constant, not an array")
    value = float(eps)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{op}: eps must be a finite non-negative float, got {value}")
    return value
