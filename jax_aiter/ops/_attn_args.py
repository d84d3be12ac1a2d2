"""Argument checks of attention's features: each bad value is refused with an error that names the argument,
the value, what is allowed and the fix, before any kernel runs.

Static arguments (window_size, dropout_p, softcap, max_seqlen_*) must be Python values: they choose the
program. Array arguments (cu_seqlens_*, segment_ids, alibi_slopes, bias) are checked for shape and dtype
always, and for their values only when those are concrete (not traced under jit). Traced boundaries
cannot be checked in Python; the mask module makes any values valid (jax_aiter/ops/_attn_mask.py:
clipped and monotone), so a wrong traced value gives a defined result, never an out-of-bounds access
(docs/attention.md, "Traced arguments").
"""
from __future__ import annotations

import math
import numbers
import os

import jax
import jax.numpy as jnp
import numpy as np

from jax_aiter import settings
from jax_aiter.ops import _checks

MAX_HEAD_DIM = 256  # JA_MHA_MAX_HEAD_DIM (csrc/include/ja/kernels/mha.h; tests/build/test_abi_constants.py)


def _is_int(x) -> bool:
    return isinstance(x, (numbers.Integral, np.integer)) and not isinstance(x, (bool, np.bool_))


def is_concrete(x) -> bool:
    """True when x's values are known in Python (not a tracer under jit, vmap or grad)."""
    return not isinstance(x, jax.core.Tracer)


def check_bool(op: str, name: str, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{op}: {name} must be a Python bool, got {type(value).__name__} {value!r}; "
                        f"{name} is a compile-time choice, not an array")
    return bool(value)


IMPLEMENTATION_SETTING = "JA_MHA_IMPLEMENTATION"
IMPL_AUTO, IMPL_DECODE = (settings.MHA_IMPLEMENTATIONS.index(n) for n in ("auto", "decode"))


def implementation(op: str, value) -> int:
    """The kernel family a call runs (its JaMhaImpl code): `value` (None: JA_MHA_IMPLEMENTATION, default "auto")."""
    names = settings.MHA_IMPLEMENTATIONS
    if value is None:
        text = (os.environ.get(IMPLEMENTATION_SETTING) or "").strip() or "auto"
        settings.check(settings.BY_NAME[IMPLEMENTATION_SETTING], text)
        return names.index(text)
    if not isinstance(value, str) or value not in names or value == "auto":
        raise ValueError(f"{op}: implementation must be None (automatic) or one of the kernel families "
                         f"{', '.join(repr(n) for n in names[1:])}, got {value!r} (docs/attention.md, "
                         f"\"Kernel families\")")
    return names.index(value)


def backward_implementation(impl: int) -> int:
    """The backward's family for a call whose forward runs `impl`: the decode kernel is a forward, its calls'
    backward runs the default family."""
    return IMPL_AUTO if impl == IMPL_DECODE else impl


def window(op: str, window_size) -> tuple[int, int]:
    """(left, right): two Python ints, each -1 (unbounded) or >= 0."""
    ok = isinstance(window_size, (tuple, list)) and len(window_size) == 2 and all(_is_int(w) for w in window_size)
    if not ok:
        raise TypeError(f"{op}: window_size must be two Python ints (left, right), -1 for unbounded, got "
                        f"{window_size!r}; e.g. window_size=(4096, 0) for a causal window of 4097 keys")
    left, right = int(window_size[0]), int(window_size[1])
    if left < -1 or right < -1:
        raise ValueError(f"{op}: window_size entries must be -1 (unbounded) or >= 0, got ({left}, {right})")
    return left, right


def dropout_p(op: str, p) -> float:
    """A Python float in [0, 1)."""
    if isinstance(p, (bool, np.bool_)) or not isinstance(p, numbers.Real):
        raise TypeError(f"{op}: dropout_p must be a Python float in [0, 1), got {type(p).__name__}; it is a "
                        "compile-time constant, not an array (use 0.0 to turn dropout off at evaluation)")
    p = float(p)
    if not 0.0 <= p < 1.0:
        raise ValueError(f"{op}: dropout_p must be in [0, 1), got {p!r}; 0.0 turns dropout off, and dropping "
                         "every element (1.0) leaves nothing to rescale")
    return p


def softcap(op: str, value) -> float:
    """A finite float32 >= 0 (0 turns it off)."""
    if value is None:
        return 0.0
    out = _checks._f32_scalar(op, "softcap", value, "50.0")
    if out < 0:
        raise ValueError(f"{op}: softcap must be >= 0 (0 turns it off), got {out!r}")
    return out


def max_seqlen(op: str, name: str, value) -> int:
    if not _is_int(value) or int(value) < 0:
        raise TypeError(f"{op}: {name} must be a Python int >= 0 (0: not given), got {value!r}")
    return int(value)


def head_dims(op: str, head_dim, head_dim_v) -> None:
    for name, d in (("head_dim", head_dim), ("head_dim_v", head_dim_v)):
        if isinstance(d, int) and d > MAX_HEAD_DIM:
            raise ValueError(f"{op}: {name} {d} is larger than {MAX_HEAD_DIM}, the largest the kernels take; "
                             "split the heads (more heads of a smaller head_dim) or use "
                             "jax.nn.dot_product_attention")


def int_array(op: str, name: str, x, rank: int, what: str) -> jax.Array:
    x = _checks.as_array(op, name, x)
    if not jnp.issubdtype(x.dtype, jnp.integer) or x.ndim != rank:
        raise TypeError(f"{op}: {name} must be an integer array of rank {rank} ({what}), got "
                        f"{x.dtype} {tuple(x.shape)}")
    return x


def cu_seqlens(op: str, name: str, cu, total, max_len: int, max_name: str, length_name: str) -> jax.Array:
    """[n + 1] int boundaries of packed sequences: 0, non-decreasing, ending at total (checked when concrete),
    no sequence longer than max_len (when max_len > 0), the argument `max_name` (max_seqlen_q / max_seqlen_k)."""
    cu = int_array(op, name, cu, 1, f"[num_sequences + 1] boundaries of the packed sequences in {length_name}")
    if cu.shape[0] < 1:
        raise ValueError(f"{op}: {name} must hold at least one entry (0), got shape {tuple(cu.shape)}")
    if not is_concrete(cu) or not isinstance(total, int):
        return cu
    vals = np.asarray(cu).astype(np.int64)
    if vals[0] != 0:
        raise ValueError(f"{op}: {name} must start at 0, got {vals[0]} ({name} = {_show(vals)})")
    steps = np.diff(vals)
    if (steps < 0).any():
        i = int(np.argmax(steps < 0))
        raise ValueError(f"{op}: {name} must not decrease: entry {i + 1} ({vals[i + 1]}) is below entry {i} "
                         f"({vals[i]}) ({name} = {_show(vals)}); it holds the running total of the sequence lengths")
    if vals[-1] != total:
        raise ValueError(f"{op}: {name} must end at the number of packed tokens {length_name} = {total}, got "
                         f"{vals[-1]} ({name} = {_show(vals)})")
    if max_len > 0 and steps.size and steps.max() > max_len:
        i = int(np.argmax(steps))
        raise ValueError(f"{op}: sequence {i} has {steps[i]} tokens in {name}, more than {max_name} "
                         f"{max_len}; pass {max_name} >= {steps.max()} (or 0: not given)")
    return cu


def _show(vals: np.ndarray) -> str:
    return str(vals.tolist()) if vals.size <= 12 else f"[{', '.join(map(str, vals[:6]))}, ..., {vals[-1]}]"


def segment_ids(op: str, ids, batch, seq_q, seq_k) -> jax.Array:
    ids = int_array(op, "segment_ids", ids, 2, "[batch, seq]: equal ids in a run form one document")
    if not _same(seq_q, seq_k):
        raise ValueError(f"{op}: segment_ids need seq_q == seq_k (self-attention over packed documents), got "
                         f"seq_q {seq_q} and seq_k {seq_k}; use cu_seqlens_q and cu_seqlens_kv for other lengths")
    if not (_same(ids.shape[0], batch) and _same(ids.shape[1], seq_q)):
        raise ValueError(f"{op}: segment_ids must have shape [batch, seq] = ({batch}, {seq_q}), got "
                         f"{tuple(ids.shape)}")
    return ids


def _same(a, b) -> bool:
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 -- symbolic dims that cannot be compared: let the kernel's shapes decide
        return True


def alibi(op: str, slopes, batch, heads_q: int) -> jax.Array:
    """float32 [1 or batch, heads_q] from slopes of shape [heads_q] or [batch, heads_q]."""
    slopes = _checks.as_array(op, "alibi_slopes", slopes)
    if not jnp.issubdtype(slopes.dtype, jnp.floating):
        raise TypeError(f"{op}: alibi_slopes must be a float array, got {slopes.dtype}")
    shape = tuple(slopes.shape)
    if shape == (heads_q,):
        return slopes.astype(jnp.float32)[None]
    if len(shape) == 2 and _same(shape[0], batch) and shape[1] == heads_q:
        return slopes.astype(jnp.float32)
    raise ValueError(f"{op}: alibi_slopes must have shape [heads_q] = ({heads_q},) or [batch, heads_q] = "
                     f"({batch}, {heads_q}), got {shape}")


def bias(op: str, b, batch, heads_q: int, seq_q, seq_k) -> jax.Array:
    """float32 [1 or batch, 1 or heads_q, seq_q, seq_k] from a bias of shape [seq_q, seq_k] or broadcastable
    to [batch, heads_q, seq_q, seq_k]. A bias broadcast over a sequence axis is materialised along it (the
    kernels take a full [seq_q, seq_k] matrix per batch row and head); the batch and head axes stay
    broadcast. The conversions are JAX operations, so the bias's gradient sums over every broadcast axis and
    comes back in the bias's dtype."""
    b = _checks.as_array(op, "bias", b)
    if not jnp.issubdtype(b.dtype, jnp.floating):
        raise TypeError(f"{op}: bias must be a float array, got {b.dtype}")
    full = (batch, heads_q, seq_q, seq_k)
    shape = tuple(b.shape)
    ok = b.ndim <= 4 and all(_same(s, 1) or _same(s, f) for s, f in zip(shape[::-1], full[::-1]))
    if not ok:
        raise ValueError(f"{op}: bias of shape {shape} does not broadcast to [batch, heads_q, seq_q, seq_k] = "
                         f"{full}; give [seq_q, seq_k] or a shape broadcastable to the full one")
    b = b.reshape((1,) * (4 - b.ndim) + shape).astype(jnp.float32)
    return jnp.broadcast_to(b, (b.shape[0], b.shape[1], seq_q, seq_k))


def dropout_key(op: str, key):
    """A jax.random key (typed or a legacy uint32 [2] one); None is handled by the caller."""
    dt = getattr(key, "dtype", None)
    if dt is not None and (jnp.issubdtype(dt, jax.dtypes.prng_key)
                           or (dt == jnp.uint32 and tuple(key.shape) == (2,))):
        return key
    raise TypeError(f"{op}: dropout_key must be a jax.random key (jax.random.key(seed), or a legacy "
                    f"jax.random.PRNGKey), got {type(key).__name__} "
                    f"{getattr(key, 'dtype', '')}{tuple(getattr(key, 'shape', ()))}")


def default_scale(head_dim) -> float:
    """1/sqrt(head_dim); head_dim 0 (every score is 0) gets 1.0, not a division by zero."""
    return 1.0 / math.sqrt(head_dim) if isinstance(head_dim, int) and head_dim > 0 else 1.0
