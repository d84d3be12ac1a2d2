"""flash_attn_func (mha_fwd / mha_bwd kernels) against a float64 NumPy reference.

Reference: softmax(Q K^T * scale) V and its three gradients, written out in
float64 NumPy (dV = P^T dO, dS = P * (dP - rowsum(P * dP)), dQ = scale dS K,
dK = scale dS^T Q, GQA heads summed), from the same rounded inputs the kernel
sees. The causal mask is bottom-right aligned; a query row with no visible key
has output 0 and zero gradients.

Error measure: normwise, ||got - ref|| / max(||ref||, 0.1 * sqrt(n)). Inputs
are unit normal, so the 0.1 floor only matters for tensors whose exact value
is (near) zero, such as dQ and dK with a single key. Bounds per dtype are in
RTOL: a few times the error of rounding the result once to the dtype (float32
accumulation everywhere); measured errors are about 5e-7 (float32), 2e-3
(bfloat16) and 2.5e-4 (float16). The float32 bound is looser (1e-4) because
with one key dQ and dK are exactly zero and the kernel returns float32
cancellation noise of dP - delta summed over up to 129 query rows and 4 heads
(up to 5.3e-5 of the floor measured).
"""
from __future__ import annotations

import ctypes
import re
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_aiter
from jatools.testing import pytest_plugin
from jax_aiter.ops import attention
from tests.ops.reference import ATTENTION_RTOL, attention_ref, f64, rel_err

RTOL = ATTENTION_RTOL
DTYPES = ["float32", "bfloat16", "float16"]
DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("gpu", id="gpu", marks=pytest.mark.gpu)]
ROOT = Path(__file__).resolve().parents[2]


def make_inputs(seed, dtype, batch, sq, sk, hq, hkv, d, device="cpu"):
    """Unit-normal q, k, v, dout in dtype on device, plus their exact float64 values."""
    rng = np.random.default_rng(seed)
    shapes = [(batch, sq, hq, d), (batch, sk, hkv, d), (batch, sk, hkv, d), (batch, sq, hq, d)]
    dev = jax.devices(device)[0]
    host = [rng.standard_normal(s, np.float32).astype(jnp.dtype(dtype)) for s in shapes]  # rounded on the host
    return [jax.device_put(h, dev) for h in host], [f64(h) for h in host]


@partial(jax.jit, static_argnames=("causal", "scale"))
def forward_and_grads(q, k, v, do, causal, scale=None):
    out, vjp = jax.vjp(lambda q, k, v: jax_aiter.flash_attn_func(q, k, v, causal=causal, softmax_scale=scale),
                       q, k, v)
    return out, vjp(do)


def _kernels(causal: bool, scale: float, implementation: str | None = None):
    """The op's forward and backward kernel calls for dense attention (no other feature): fwd(q, k, v) -> (o, lse),
    bwd(q, k, v, o, do, lse) -> (dq, dk, dv); every optional operand absent, as the op passes them; the kernel
    family `implementation` (None: automatic)."""
    from jax_aiter.ops import _attn_args
    from jax_aiter.ops._attn_mask import MASK_CAUSAL, MASK_NONE

    impl = _attn_args.implementation("test", implementation)
    cfg = attention.Config(MASK_CAUSAL if causal else MASK_NONE, scale, 0.0, 0.0, False, impl=impl)
    fwd, bwd = attention._prims(cfg)
    rows, alibi, bias, seed = (attention._placeholder(n) for n in ("rows", "alibi", "bias", "seed"))
    return (lambda q, k, v: fwd(q, k, v, rows, alibi, bias, seed),
            lambda q, k, v, o, do, lse: bwd(q, k, v, o, do, lse, rows, rows, alibi, bias, seed)[:3])


def check_case(device, dtype, d, causal, hq, hkv, sq, sk, batch=2, scale=None, seed=0):
    (q, k, v, do), (qe, ke, ve, doe) = make_inputs(seed, dtype, batch, sq, sk, hq, hkv, d, device)
    out, grads = forward_and_grads(q, k, v, do, causal=causal, scale=scale)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert [g.dtype for g in grads] == [q.dtype] * 3
    ref_o, ref_grads = attention_ref(qe, ke, ve, doe, causal, scale if scale is not None else d ** -0.5)
    errs = {name: rel_err(got, ref) for name, got, ref in
            zip(("o", "dq", "dk", "dv"), (out, *grads), (ref_o, *ref_grads))}
    bad = {n: e for n, e in errs.items() if not e <= RTOL[dtype]}
    assert not bad, f"relative error above {RTOL[dtype]} ({dtype}): {bad}"


# --- numerics -------------------------------------------------------------------------

GQA = [pytest.param((4, 4), id="mha"), pytest.param((4, 1), id="gqa4")]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("heads", GQA)
@pytest.mark.parametrize("seqs", [(17, 129), (129, 17)], ids=lambda s: f"sq{s[0]}-sk{s[1]}")
def test_matches_reference(device, dtype, d, causal, heads, seqs):
    check_case(device, dtype, d, causal, *heads, *seqs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("heads", GQA)
@pytest.mark.parametrize("seqs", [(1, 1), (17, 17), (129, 129), (1, 17), (17, 1)], ids=lambda s: f"sq{s[0]}-sk{s[1]}")
def test_sequence_lengths(device, causal, heads, seqs):
    check_case(device, "bfloat16", 64, causal, *heads, *seqs)


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("heads", GQA + [pytest.param((8, 2), id="gqa4-2")])
@pytest.mark.parametrize("seqs", [(1, 1), (1, 129), (129, 1), (17, 17), (64, 64), (65, 63), (129, 129),
                                  (200, 333), (333, 200)], ids=lambda s: f"sq{s[0]}-sk{s[1]}")
def test_sweep(device, dtype, d, causal, heads, seqs):
    check_case(device, dtype, d, causal, *heads, *seqs, batch=1)


# Decode: few query rows per kv head (heads_q / heads_kv * seq_q <= 64), the shapes that take
# the GPU's split-KV path (keys split across blocks, then a merge): one token against a long
# cache, a few draft tokens (causal with seq_q > 1), multi-query heads (4 row blocks), odd
# lengths that end inside a key tile and split boundaries, rows that see no key.
DECODE = [(1, 1, 8, 8), (1, 65, 8, 1), (1, 4097, 32, 8), (1, 3001, 32, 4), (3, 1000, 8, 2), (7, 501, 4, 2),
          (2, 2049, 32, 1), (20, 10, 4, 4)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", DECODE, ids=lambda s: f"sq{s[0]}-sk{s[1]}-hq{s[2]}-hkv{s[3]}")
def test_decode_matches_reference(device, dtype, causal, shape):
    sq, sk, hq, hkv = shape
    check_case(device, dtype, 128, causal, hq, hkv, sq, sk, batch=2, seed=sk)


HEAD_DIMS = [32, 64, 96, 128, 256]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqs", [(17, 129), (129, 17), (1, 300)], ids=lambda s: f"sq{s[0]}-sk{s[1]}")
def test_head_dims(device, dtype, d, causal, seqs):
    """Every compiled head dim: forward and the three gradients, GQA, odd lengths both ways, decode."""
    check_case(device, dtype, d, causal, 8, 2, *seqs, batch=1, seed=d)


@pytest.mark.parametrize("device", DEVICES)
def test_decode_rows_without_keys(device):
    """Decode path, causal with seq_q > seq_k: the first rows see no key (output 0, lse +inf)."""
    (q, k, v, _), _ = make_inputs(7, "bfloat16", 1, 6, 2, 8, 2, 128, device)
    o, lse = jax.jit(_kernels(True, 0.1)[0])(q, k, v)
    o, lse = np.asarray(o, np.float32), np.asarray(lse)
    assert np.all(o[:, :4] == 0.0) and np.all(lse[:, :, :4] == np.inf)
    assert np.all(np.isfinite(lse[:, :, 4:])) and np.all(np.abs(o[:, 4:]) > 0)


@pytest.mark.parametrize("device", DEVICES)
def test_custom_scale(device):
    check_case(device, "float32", 64, True, 4, 2, 33, 47, scale=0.3)


@pytest.mark.parametrize("device", DEVICES)
def test_rows_without_keys_are_zero(device):
    """Causal with seq_q > seq_k: the first seq_q - seq_k rows see no key."""
    (q, k, v, do), _ = make_inputs(1, "float32", 1, 20, 5, 2, 2, 64, device)
    out, (dq, dk, dv) = forward_and_grads(q, k, v, do, causal=True)
    assert np.all(np.asarray(out[:, :15]) == 0.0)
    assert np.all(np.asarray(dq[:, :15]) == 0.0)
    assert np.all(np.abs(np.asarray(out[:, 15:])) > 0)
    assert all(np.all(np.isfinite(np.asarray(x))) for x in (out, dq, dk, dv))


# --- transformations ------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_eager_matches_jit(device):
    (q, k, v, _), _ = make_inputs(2, "bfloat16", 2, 17, 17, 4, 2, 64, device)
    eager = jax_aiter.flash_attn_func(q, k, v, causal=True)
    jitted = jax.jit(lambda q, k, v: jax_aiter.flash_attn_func(q, k, v, causal=True))(q, k, v)
    np.testing.assert_array_equal(np.asarray(eager, np.float32), np.asarray(jitted, np.float32))


@pytest.mark.parametrize("device", DEVICES)
def test_vmap_folds_into_batch(device):
    """vmap over an extra leading axis equals a loop over it (k, v shared or mapped)."""
    (q, k, v, _), _ = make_inputs(3, "float32", 6, 17, 17, 4, 2, 64, device)
    q3 = q.reshape(3, 2, *q.shape[1:])
    k3, v3 = k.reshape(3, 2, *k.shape[1:]), v.reshape(3, 2, *v.shape[1:])
    f = lambda q, k, v: jax_aiter.flash_attn_func(q, k, v, causal=True)
    mapped = jax.jit(jax.vmap(f))(q3, k3, v3)
    looped = jnp.stack([f(q3[i], k3[i], v3[i]) for i in range(3)])
    np.testing.assert_allclose(np.asarray(mapped), np.asarray(looped), rtol=1e-6, atol=1e-6)
    shared = jax.vmap(f, in_axes=(0, None, None))(q3, k3[0], v3[0])
    np.testing.assert_allclose(np.asarray(shared[1]), np.asarray(f(q3[1], k3[0], v3[0])), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_grad_of_vmap_and_vmap_of_grad(device):
    (q, k, v, do), (qe, ke, ve, doe) = make_inputs(4, "float32", 4, 17, 9, 4, 1, 64, device)
    w = do.reshape(2, 2, *do.shape[1:])
    resh = lambda x: x.reshape(2, 2, *x.shape[1:])

    def loss(q, k, v):
        return jnp.sum(jax.vmap(lambda q, k, v: jax_aiter.flash_attn_func(q, k, v, causal=True))(q, k, v) * w)

    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(resh(q), resh(k), resh(v))
    _, ref = attention_ref(qe, ke, ve, doe, True, 64 ** -0.5)
    for got, r in zip(grads, ref):
        assert rel_err(got.reshape(r.shape), r) <= RTOL["float32"]

    def per_example(q, k, v, w):
        return jax.grad(lambda q: jnp.sum(jax_aiter.flash_attn_func(q, k, v, causal=True) * w))(q)

    dq = jax.jit(jax.vmap(per_example))(resh(q), resh(k), resh(v), w)
    assert rel_err(dq.reshape(ref[0].shape), ref[0]) <= RTOL["float32"]

    # k and v shared by the mapped examples: their gradients sum over the examples.
    def shared_loss(q, k, v):
        f = lambda q: jax_aiter.flash_attn_func(q, k, v, causal=True)
        return jnp.sum(jax.vmap(f)(q) * w)

    _, dk, dv = jax.jit(jax.grad(shared_loss, argnums=(0, 1, 2)))(resh(q), k[:2], v[:2])
    per = [jax.grad(lambda k, v, j=j: jnp.sum(jax_aiter.flash_attn_func(resh(q)[j], k, v, causal=True) * w[j]),
                    argnums=(0, 1))(k[:2], v[:2]) for j in range(2)]
    np.testing.assert_allclose(np.asarray(dk), np.asarray(per[0][0] + per[1][0]), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(dv), np.asarray(per[0][1] + per[1][1]), rtol=1e-5, atol=1e-6)


# --- poisoned outputs -----------------------------------------------------------------

def assert_poisoned(fn, args, calls: int) -> None:
    """The traced FFI calls really take NaN-filled buffers aliased to their results."""
    text = jax.jit(fn).lower(*args).as_text()
    assert text.count("output_operand_aliases") == calls, "outputs are not poisoned (stale trace cache?)"


@pytest.mark.parametrize("device", DEVICES)
def test_every_output_element_is_written(device, monkeypatch):
    """JA_POISON_OUTPUTS=1 pre-fills every result (o, lse, dq, dk, dv, workspaces) with NaN."""
    monkeypatch.setenv("JA_POISON_OUTPUTS", "1")
    (q, k, v, do), (qe, ke, ve, doe) = make_inputs(5, "bfloat16", 2, 33, 20, 4, 2, 128, device)

    def run(q, k, v, do):  # a fresh function, so the trace sees the variable
        out, vjp = jax.vjp(lambda q, k, v: jax_aiter.flash_attn_func(q, k, v, causal=True), q, k, v)
        return out, vjp(do)

    assert_poisoned(run, (q, k, v, do), calls=2)
    out, grads = jax.jit(run)(q, k, v, do)
    ref_o, ref_grads = attention_ref(qe, ke, ve, doe, True, 128 ** -0.5)
    for got, ref in zip((out, *grads), (ref_o, *ref_grads)):
        assert rel_err(got, ref) <= RTOL["bfloat16"]


@pytest.mark.parametrize("device", DEVICES)
def test_forward_lse_and_workspace_written_under_poison(device, monkeypatch):
    """The raw FFI results, lse and workspaces included, hold no NaN when poisoned."""
    monkeypatch.setenv("JA_POISON_OUTPUTS", "1")
    (q, k, v, do), _ = make_inputs(6, "float16", 1, 40, 17, 2, 1, 64, device)
    fwd, bwd = _kernels(True, 0.125)
    assert_poisoned(fwd, (q, k, v), calls=1)
    o, lse = jax.jit(fwd)(q, k, v)
    lse = np.asarray(lse)
    assert lse.shape == (1, 2, 40) and not np.isnan(lse).any()
    assert np.all(lse[:, :, :23] == np.inf) and np.all(np.isfinite(lse[:, :, 23:]))
    for x in jax.jit(bwd)(q, k, v, o, do, jnp.asarray(lse)):
        assert not np.isnan(np.asarray(x, np.float32)).any()


# --- the Hopper forward ------------------------------------------------------------------
# On an sm_90 device the bfloat16/float16 forward runs the wgmma + TMA kernel (csrc/kernels/mha/sm90/fwd_kernel.cuh;
# every head dim that is a multiple of 8, in the kernel of the next head dim up: csrc/kernels/mha/sm90/dims.h;
# not for plain decode shapes); implementation="mma" sends the same call to the mma.sync kernel. libmha_fwd.so
# counts the calls the Hopper kernel handled.

def _lib_calls(lib: str, counter: str) -> int:
    """A call counter that an MHA library exports (int64_t counter(void))."""
    from jax_aiter import _loader

    fn = getattr(ctypes.CDLL(str(_loader.find_library(lib))), counter)
    fn.restype = ctypes.c_int64
    return int(fn())


def _sm90_calls() -> int:
    return _lib_calls("libmha_fwd.so", "ja_mha_fwd_sm90_calls")


def _both_paths(make, args, calls, expected):
    """make(implementation)(*args) twice: automatic (a path that `calls` counts `expected` times), then on the
    mma.sync kernels (implementation="mma", not counted). Returns both results."""
    before = calls()
    first = jax.block_until_ready(jax.jit(make(None))(*args))
    assert calls() == before + expected
    second = jax.block_until_ready(jax.jit(make("mma"))(*args))
    assert calls() == before + expected
    return first, second


def _assert_paths_agree(dtype, ref_o, o1, lse1, o2, lse2):
    """Two kernels' (out, lse) of one call: each within the reference bound, and of each other;
    the same rows without keys (lse +inf), the other lse equal up to float32 rounding."""
    assert rel_err(o1, ref_o) <= RTOL[dtype] and rel_err(o2, ref_o) <= RTOL[dtype]
    assert rel_err(o1, f64(o2)) <= RTOL[dtype]
    lse1, lse2 = np.asarray(lse1), np.asarray(lse2)
    assert np.array_equal(np.isinf(lse1), np.isinf(lse2)) and np.all(lse1[np.isinf(lse1)] > 0)
    fin = np.isfinite(lse2)
    np.testing.assert_allclose(lse1[fin], lse2[fin], rtol=0, atol=1e-3)


def _cuda_cc() -> tuple[int, int] | None:
    """The first GPU's compute capability (9, 0), or None on ROCm, where XLA's compute_capability is the gfx
    name (e.g. "gfx950"), not a number."""
    cc = str(getattr(jax.devices("gpu")[0], "compute_capability", ""))
    return (int(cc.split(".")[0]), int(cc.split(".")[1])) if re.fullmatch(r"\d+\.\d+", cc) else None


def _path_cases(shapes):
    """The marks of the kernel-path tests below: on the GPU, each dtype x head dim x causal x shape
    (batch, seq_q, seq_k, heads_q, heads_kv)."""
    marks = [pytest.mark.gpu, pytest.mark.parametrize("dtype", ["bfloat16", "float16"]),
             pytest.mark.parametrize("d", [32, 64, 96, 128, 256]),
             pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"]),
             pytest.mark.parametrize("shape", shapes, ids=lambda s: f"b{s[0]}-sq{s[1]}-sk{s[2]}-hq{s[3]}-hkv{s[4]}")]

    def wrap(fn):
        for mark in reversed(marks):  # as if stacked above fn, first on top
            fn = mark(fn)
        return fn
    return wrap


def _is_sm90() -> bool:
    return _cuda_cc() == (9, 0)


HOPPER = [(2, 300, 500, 4, 2), (2, 513, 200, 4, 4), (1, 200, 1, 4, 1), (1, 129, 1000, 8, 1), (2, 1000, 1000, 2, 2)]


@_path_cases(HOPPER)
def test_hopper_forward_matches_reference_and_fallback(dtype, d, causal, shape):
    """The Hopper kernel runs where it should, matches the float64 reference, and the mma.sync
    kernel (implementation="mma") within the same bound; lse equal up to float32 rounding."""
    batch, sq, sk, hq, hkv = shape
    (q, k, v, _), (qe, ke, ve, doe) = make_inputs(sk + d, dtype, batch, sq, sk, hq, hkv, d, "gpu")
    (o1, lse1), (o2, lse2) = _both_paths(lambda impl: _kernels(causal, d ** -0.5, impl)[0], (q, k, v), _sm90_calls,
                                         1 if _is_sm90() else 0)
    ref_o, _ = attention_ref(qe, ke, ve, doe, causal, d ** -0.5)
    _assert_paths_agree(dtype, ref_o, o1, lse1, o2, lse2)


@pytest.mark.gpu
def test_hopper_forward_is_not_used_for_decode_or_float32():
    before = _sm90_calls()
    for dtype, sq, hq, hkv in (("bfloat16", 1, 8, 8), ("float32", 300, 4, 4)):
        (q, k, v, _), _ = make_inputs(0, dtype, 1, sq, 500, hq, hkv, 128, "gpu")
        jax.block_until_ready(jax_aiter.flash_attn_func(q, k, v))
    assert _sm90_calls() == before


@pytest.mark.gpu
@pytest.mark.parametrize("d, padded", [(80, 96), (160, 192)])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_hopper_forward_head_dim_kernel_equals_the_padded_one(d, padded, causal, monkeypatch):
    """The forward's kernels of head dims 80 and 160 (sm90/dims.h) compute what the kernels of 96 and 192
    (the same key tile) compute on the same inputs zero-padded, less the products of the zero columns (which add
    exact zeros): out and lse equal bit for bit, both calls on the Hopper kernels."""
    if not _is_sm90():
        pytest.skip("the Hopper kernels run on an sm_90 device only")
    from jax_aiter import mha

    (q, k, v, _), _ = make_inputs(d, "bfloat16", 2, 300, 333, 8, 2, d, "gpu")
    pad = partial(jnp.pad, pad_width=((0, 0), (0, 0), (0, 0), (0, padded - d)))
    f = jax.jit(partial(mha.flash_attn_func, softmax_scale=d ** -0.5, causal=causal, return_lse=True))
    before = _sm90_calls()
    o, lse = jax.block_until_ready(f(q, k, v))
    o_padded, lse_padded = jax.block_until_ready(f(pad(q), pad(k), pad(v)))
    assert _sm90_calls() == before + 2
    np.testing.assert_array_equal(np.asarray(o).view(np.uint16), np.asarray(o_padded[..., :d]).view(np.uint16))
    np.testing.assert_array_equal(np.asarray(lse), np.asarray(lse_padded))


# --- the decode path's TMA loads ----------------------------------------------------------
# Decode shapes take the split-KV kernel (csrc/kernels/mha/decode/fwd.cuh); on an sm_90 (or
# newer) device, in bfloat16/float16 at head dims 64, 128 and 256, its K and V tiles come by TMA, and
# JA_MHA_FWD_DECODE_TMA=0 sends the same call to its cp.async loads. libmha_fwd.so counts the TMA calls.

def _decode_tma_calls() -> int:
    return _lib_calls("libmha_fwd.so", "ja_mha_fwd_decode_tma_calls")


def _is_sm90_or_newer() -> bool:
    """An NVIDIA device of compute capability 9.0 or newer (never a ROCm device)."""
    cc = _cuda_cc()
    return cc is not None and cc >= (9, 0)


DECODE_TMA = [(2, 1, 3001, 32, 4), (2, 3, 1000, 8, 2), (1, 1, 65, 8, 1)]
DECODE_TMA_HEAD_DIMS = (64, 128, 256)  # decode/fwd.cuh: the head dims with a TMA kernel


@_path_cases(DECODE_TMA)
def test_decode_tma_matches_reference_and_cp_async(dtype, d, causal, shape, monkeypatch):
    """The decode kernel's TMA path runs where it should, matches the float64 reference, and its
    cp.async path (JA_MHA_FWD_DECODE_TMA=0) within the same bound; lse equal up to float32 rounding."""
    batch, sq, sk, hq, hkv = shape
    (q, k, v, _), (qe, ke, ve, doe) = make_inputs(sk + d, dtype, batch, sq, sk, hq, hkv, d, "gpu")
    fwd = jax.jit(_kernels(causal, d ** -0.5)[0])
    tma = _is_sm90_or_newer() and d in DECODE_TMA_HEAD_DIMS  # other head dims load by cp.async only
    monkeypatch.delenv("JA_MHA_FWD_DECODE_TMA", raising=False)
    before = _decode_tma_calls()
    o1, lse1 = jax.block_until_ready(fwd(q, k, v))
    assert _decode_tma_calls() == before + (1 if tma else 0)
    monkeypatch.setenv("JA_MHA_FWD_DECODE_TMA", "0")  # read on every call: the same program, the cp.async loads
    o2, lse2 = jax.block_until_ready(fwd(q, k, v))
    assert _decode_tma_calls() == before + (1 if tma else 0)
    ref_o, _ = attention_ref(qe, ke, ve, doe, causal, d ** -0.5)
    _assert_paths_agree(dtype, ref_o, o1, lse1, o2, lse2)


# --- the decode path's cluster merge ------------------------------------------------------
# On the TMA path, when the plan splits each kv head's keys 2-8 ways and the device holds those splits'
# thread-block clusters in as many waves as the blocks take, the splits merge through distributed shared
# memory instead of the merge kernel (JA_MHA_FWD_DECODE_CLUSTER=0 sends the same call to the merge kernel).
# The merge does the merge kernel's arithmetic in its order, so the two paths agree bit for bit.

def _decode_cluster_calls() -> int:
    return _lib_calls("libmha_fwd.so", "ja_mha_fwd_decode_cluster_calls")


# 64 kv-head groups each (batch x kv heads x 16-row blocks), as in the model's decode (batch 8, 8 kv heads).
DECODE_CLUSTER = [(8, 1, 2048, 32, 8), (8, 1, 4999, 32, 8), (16, 1, 3000, 8, 4), (8, 3, 2000, 16, 8)]


def _decode_cluster_expected(d: int) -> int | None:
    """Calls that must merge in a cluster for one DECODE_CLUSTER call: 1 on an sm_90 device of 132
    multiprocessors (H100 SXM, H200) at head dim 128 or 256, where the kernel fits one block per
    multiprocessor and the plan takes 2 splits of 64 groups (128 blocks, clusters of 2 fit in one wave);
    None elsewhere: the plan follows the device, and only the results are compared."""
    return 1 if _cuda_cc() == (9, 0) and _multiprocessors() == 132 and d in (128, 256) else None


def _multiprocessors() -> int:
    """The first GPU's multiprocessor count: JAX's core_count, else the driver's (0 where neither says)."""
    n = getattr(jax.devices("gpu")[0], "core_count", 0)
    if n:
        return int(n)
    try:
        cuda = ctypes.CDLL(pytest_plugin.CUDA_DRIVER)
    except OSError:
        return 0
    dev, count = ctypes.c_int(0), ctypes.c_int(0)
    ok = (cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
          and cuda.cuDeviceGetAttribute(ctypes.byref(count), 16, dev) == 0)  # 16: MULTIPROCESSOR_COUNT
    return count.value if ok else 0


@_path_cases(DECODE_CLUSTER)
def test_decode_cluster_merge_matches_merge_kernel_bitwise(dtype, d, causal, shape, monkeypatch):
    batch, sq, sk, hq, hkv = shape
    (q, k, v, _), (qe, ke, ve, doe) = make_inputs(sk + d, dtype, batch, sq, sk, hq, hkv, d, "gpu")
    fwd = jax.jit(_kernels(causal, d ** -0.5)[0])
    monkeypatch.delenv("JA_MHA_FWD_DECODE_CLUSTER", raising=False)
    before = _decode_cluster_calls()
    o1, lse1 = jax.block_until_ready(fwd(q, k, v))
    took = _decode_cluster_calls() - before
    expected = _decode_cluster_expected(d)
    assert took == expected if expected is not None else took in (0, 1)
    monkeypatch.setenv("JA_MHA_FWD_DECODE_CLUSTER", "0")
    o2, lse2 = jax.block_until_ready(fwd(q, k, v))
    assert _decode_cluster_calls() == before + took
    ref_o, _ = attention_ref(qe, ke, ve, doe, causal, d ** -0.5)
    assert rel_err(o1, ref_o) <= RTOL[dtype]
    np.testing.assert_array_equal(np.asarray(o1).view(np.uint16), np.asarray(o2).view(np.uint16))
    np.testing.assert_array_equal(np.asarray(lse1), np.asarray(lse2))


# --- the Hopper backward -----------------------------------------------------------------
# On an sm_90 device the bfloat16/float16 backward runs the wgmma + TMA kernel (csrc/kernels/mha/sm90/bwd_kernel.cuh;
# head dims past 128: sm90/bwd_kernel_d256.cuh; head dims as the forward's); implementation="mma" sends the same
# call to the mma.sync kernel. libmha_bwd.so counts the calls the Hopper kernel handled.

def _sm90_bwd_calls() -> int:
    return _lib_calls("libmha_bwd.so", "ja_mha_bwd_sm90_calls")


HOPPER_BWD = [(2, 300, 500, 4, 2), (2, 513, 200, 4, 4), (1, 129, 1000, 8, 1), (2, 1000, 1000, 2, 2),
              (1, 64, 64, 2, 1), (1, 1, 300, 4, 4)]


@_path_cases(HOPPER_BWD)
def test_hopper_backward_matches_reference_and_fallback(dtype, d, causal, shape):
    """The Hopper backward runs where it should (GQA, causal both ways, seq_q != seq_k, odd
    lengths), its gradients match the float64 reference and the mma.sync kernels
    (implementation="mma") within the same bound."""
    batch, sq, sk, hq, hkv = shape
    (q, k, v, do), (qe, ke, ve, doe) = make_inputs(sq + d, dtype, batch, sq, sk, hq, hkv, d, "gpu")
    fwd, _ = _kernels(causal, d ** -0.5)
    o, lse = jax.block_until_ready(jax.jit(fwd)(q, k, v))
    g1, g2 = _both_paths(lambda impl: _kernels(causal, d ** -0.5, impl)[1], (q, k, v, o, do, lse), _sm90_bwd_calls,
                         1 if _is_sm90() else 0)
    _, ref = attention_ref(qe, ke, ve, doe, causal, d ** -0.5)
    for x1, x2, r in zip(g1[:3], g2[:3], ref):
        assert x1.dtype == q.dtype and x1.shape == r.shape
        assert rel_err(x1, r) <= RTOL[dtype] and rel_err(x2, r) <= RTOL[dtype]
        assert rel_err(x1, f64(x2)) <= RTOL[dtype]


@pytest.mark.gpu
def test_hopper_backward_is_not_used_for_float32():
    before = _sm90_bwd_calls()
    (q, k, v, do), _ = make_inputs(0, "float32", 1, 70, 90, 4, 2, 128, "gpu")
    jax.block_until_ready(forward_and_grads(q, k, v, do, causal=True))
    assert _sm90_bwd_calls() == before


# --- errors ---------------------------------------------------------------------------

def _arr(shape, dtype=jnp.float32):
    return jnp.zeros(shape, dtype)


B = (2, 8, 4, 64)
F32, BF16 = "float32", "bfloat16"
# (id, ((shape, dtype) of q, k, v), kwargs, exception, message regex)
BAD_INPUTS = [
    ("int dtype", ((B, "int32"), (B, F32), (B, F32)), {}, TypeError,
     r"q has dtype int32; supported dtypes are float32, bfloat16, float16"),
    ("float16 k", ((B, F32), (B, "float16"), (B, F32)), {}, TypeError, r"k has dtype float16 but q has float32"),
    ("mixed dtypes", ((B, F32), (B, BF16), (B, F32)), {}, TypeError, r"k has dtype bfloat16 but q has float32"),
    ("rank 3", ((B[1:], F32), (B, F32), (B, F32)), {}, ValueError,
     r"q must have rank 4 \[batch, seq_q, heads_q, head_dim\], got shape \(8, 4, 64\)"),
    ("k v differ", ((B, F32), (B, F32), ((2, 9, 4, 64), F32)), {}, ValueError,
     r"k and v must agree in \[batch, seq_k, heads_kv\]"),
    ("batch", ((B, F32), ((3, 8, 4, 64), F32), ((3, 8, 4, 64), F32)), {}, ValueError,
     r"batch size mismatch: q has 2, k and v have 3"),
    ("head_dim mismatch", ((B, F32), ((2, 8, 4, 128), F32), ((2, 8, 4, 128), F32)), {}, ValueError,
     r"head_dim mismatch: q has 64, k has 128"),
    ("heads", ((B, F32), ((2, 8, 3, 64), F32), ((2, 8, 3, 64), F32)), {}, ValueError,
     r"heads_q \(4\) must be a multiple of heads_kv \(3\)"),
    ("causal int", ((B, F32),) * 3, {"causal": 1}, TypeError, r"causal must be a Python bool"),
    ("scale array", ((B, F32),) * 3, {"softmax_scale": np.zeros(())}, TypeError,
     r"softmax_scale must be a Python float"),
    ("scale nan", ((B, F32),) * 3, {"softmax_scale": float("nan")}, ValueError, r"softmax_scale must be finite"),
]


@pytest.mark.parametrize("specs,kwargs,exc,msg", [b[1:] for b in BAD_INPUTS], ids=[b[0] for b in BAD_INPUTS])
def test_bad_inputs_name_the_problem(specs, kwargs, exc, msg):
    # NumPy arrays go through jnp.asarray, as jax.numpy converts them (float64 would become float32:
    # tests/ops/test_transformations.py); none of these reaches a kernel.
    args = [np.zeros(shape, jnp.dtype(dt)) for shape, dt in specs]
    with pytest.raises(exc, match=msg):
        jax_aiter.flash_attn_func(*args, **kwargs)


@pytest.mark.parametrize("device", DEVICES)
def test_kernel_checks_guard_the_c_abi(device):
    """A hand-written ffi_call that skips the Python checks still gets a clear error."""
    from jax_aiter import _loader
    from jax_aiter.ops import _ffi

    _loader.ensure_registered("mha_fwd")
    dev = jax.devices(device)[0]

    def call(q_shape, kv_shape):
        q, k = jax.device_put(_arr(q_shape), dev), jax.device_put(_arr(kv_shape), dev)
        out = (jax.ShapeDtypeStruct(q.shape, q.dtype),
               jax.ShapeDtypeStruct((q.shape[0], q.shape[2], q.shape[1]), jnp.float32),
               jax.ShapeDtypeStruct((q.shape[0], 0), jnp.float32))  # the (here empty) workspace
        absent = [jnp.zeros((0,), t) for t in (jnp.int32, jnp.float32, jnp.float32, jnp.uint32)]
        return jax.block_until_ready(
            _ffi.ffi_call("ja_mha_fwd", out, q, k, k, *absent, mask=np.int32(0), scale=np.float32(0.1),
                          softcap=np.float32(0.0), dropout_p=np.float32(0.0), implementation=np.int32(0)))

    with pytest.raises(Exception, match=r"mha_fwd: head_dim 300 \(q, k\) and head_dim_v 300 \(v\) must each be in "
                                        r"1\.\.256"):
        call((1, 4, 2, 300), (1, 4, 2, 300))
    # head_dim 48 has no instance of its own: the one of head dim 64 runs it (zero-padded on load), on every backend
    o, lse, _ = call((1, 4, 2, 48), (1, 4, 2, 48))
    assert o.shape == (1, 4, 2, 48) and bool(jnp.isfinite(o).all()) and bool(jnp.isfinite(lse).all())
    with pytest.raises(Exception, match=r"mha_fwd: heads_q \(2\) must be a multiple of heads_kv \(3\)"):
        call((1, 4, 2, 64), (1, 4, 3, 64))


def test_baseline_isa_build_matches_reference():
    """The portable (non-AVX2) CPU build, forced with JA_CPU_ISA=baseline, passes the same checks."""
    import os
    import subprocess
    import sys

    selection = "test_matches_reference and cpu and sq17-sk129 and 64 and (float32 or bfloat16)"
    proc = subprocess.run([sys.executable, "-m", "pytest", __file__, "-q", "-p", "no:cacheprovider", "-k", selection],
                          check=False, env={**os.environ, "JA_CPU_ISA": "baseline"}, capture_output=True, text=True,
                          cwd=ROOT, timeout=600)
    assert proc.returncode == 0 and " passed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]
