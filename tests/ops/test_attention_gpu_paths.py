"""The GPU attention kernels, each forced in turn, with every feature, against the float64 reference.

On the GPU a call takes the first kernel that handles all of its features (csrc/kernels/mha/fwd_gpu.cuh,
bwd_gpu.cuh): the Hopper kernels where they apply, the split-KV decode kernel (decode shapes), the mma.sync kernel
(bfloat16/float16), the SIMT kernel (everything: float32, bias, dropout). A forced case names its kernel's family
in the call (the implementation attribute: "sm90", "decode", "mma", "simt"), so it runs there, and the libraries'
call counters (ja_mha_fwd_gpu_path_calls, ja_mha_bwd_gpu_path_calls) must show that it ran there; the other cases
let the dispatch choose and must land where the features send them: a feature a kernel does not take is never
silently dropped, it moves the call. The Hopper cases (path "hopper") must be counted by ja_mha_fwd_sm90_calls /
ja_mha_bwd_sm90_calls (on an sm_90 device only: elsewhere they are skipped, saying so); the bias and dropout
cases with the Hopper kernels on must still run on SIMT (the Hopper kernels decline them).

The calls go through the FFI targets ja_mha_fwd / ja_mha_bwd with the operands of docs/attention.md (rows, cols,
alibi, bias, seed; absent ones as shape-(0,) arrays), by tests/ops/mha_ffi_calls.py.
Masks come from jax_aiter/ops/_attn_mask.py (what the
kernels take); the reference's masks from tests/ops/reference.py's loop-written definitions, and its dropout
mask from the plain-Python Philox there, so neither side checks itself. Error measure and bounds: rel_err and
ATTENTION_RTOL (tests/ops/reference.py). The NaN/Inf cases plant non-finite values in K and V at keys some
rows do not see: those rows must stay finite and match the reference; the rows that see them must not be
finite (issue 58). Deterministic backward cases run twice and must agree bit for bit.
"""
from __future__ import annotations

import ctypes
import re
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_aiter import settings
from jax_aiter.ops import _attn_mask
from tests.ops import mha_ffi_calls as ffi
from tests.ops.reference import (
    ATTENTION_RTOL,
    attention_features_ref,
    dropout_keep_ref,
    f64,
    rel_err,
    varlen_mask_ref,
    window_mask_ref,
)

pytestmark = pytest.mark.gpu

SIMT, MMA, DECODE = 0, 1, 2  # ja::MhaGpuPath (csrc/kernels/mha/common/gpu_calls.h)
HOPPER = 3  # not a MhaGpuPath: the sm_90a kernels, counted by ja_mha_{fwd,bwd}_sm90_calls
PATH_NAMES = {SIMT: "simt", MMA: "mma", DECODE: "decode", HOPPER: "hopper"}
SEED = np.array([0x12345678, 0x9ABCDEF0, 0, 0], np.uint32)


def _path_calls(module: str, path: int) -> int:
    """Calls the kernel `path` ran in libmha_fwd.so / libmha_bwd.so."""
    from jax_aiter import _loader

    lib = ctypes.CDLL(str(_loader.find_library(f"lib{module}.so")))
    if path == HOPPER:
        fn = getattr(lib, f"ja_{module}_sm90_calls")
        fn.restype, fn.argtypes = ctypes.c_int64, []
        return int(fn())
    fn = getattr(lib, f"ja_{module}_gpu_path_calls")
    fn.restype, fn.argtypes = ctypes.c_int64, [ctypes.c_int]
    return int(fn(path))


def _is_sm90() -> bool:
    """The first GPU is an NVIDIA device of compute capability 9.0 (what the sm_90a kernels run on)."""
    cc = str(getattr(jax.devices("gpu")[0], "compute_capability", ""))
    return re.fullmatch(r"9\.0", cc) is not None


FAMILIES = {SIMT: "simt", MMA: "mma", DECODE: "decode", HOPPER: "sm90"}  # the implementation each path names


def _implementation(path: int | None, force: bool) -> int:
    """The implementation attribute of a call (JaMhaImpl's code): the family of `path` when forced, else 0
    (automatic)."""
    return settings.MHA_IMPLEMENTATIONS.index(FAMILIES[path]) if force and path is not None else 0


class Case:
    """One call: shapes, mask, features, and the kernels it must run on."""

    def __init__(self, name, fwd, bwd, *, dtype="bfloat16", b=2, sq=77, sk=131, hq=4, hkv=2, d=64, dv=None,
                 causal=False, window=None, varlen=None, softcap=0.0, alibi=None, bias=None, dropout=0.0,
                 deterministic=False, nan=False, nan_rows=False, force=True, sm90=None):
        self.name, self.fwd, self.bwd, self.dtype, self.force = name, fwd, bwd, dtype, force
        self.sm90 = fwd == HOPPER if sm90 is None else sm90  # the Hopper kernels left on
        self.b, self.sq, self.sk, self.hq, self.hkv, self.d, self.dv = b, sq, sk, hq, hkv, d, dv or d
        self.causal, self.window, self.varlen = causal, window, varlen
        self.softcap, self.alibi, self.bias, self.dropout = softcap, alibi, bias, dropout
        self.deterministic, self.nan, self.nan_rows = deterministic, nan, nan_rows

    def __repr__(self):
        return self.name


def _mask(c: Case):
    """(kind, rows or empty, cols or empty, reference mask [1 or b, sq, sk], diag [1 or b, sq])."""
    if c.varlen is not None:
        cu_q = np.concatenate([[0], np.cumsum(c.varlen[0])]).astype(np.int32)
        cu_k = np.concatenate([[0], np.cumsum(c.varlen[1])]).astype(np.int32)
        rows = _attn_mask.varlen_rows(jnp.asarray(cu_q), jnp.asarray(cu_k), c.sq, c.sk, c.causal,
                                      c.window or (-1, -1))
        ref_mask, diag = varlen_mask_ref(cu_q, cu_k, c.causal, c.window or (-1, -1))
        full = np.zeros((c.sq, c.sk), bool)
        full[:ref_mask.shape[0], :ref_mask.shape[1]] = ref_mask
        dfull = np.arange(c.sq, dtype=np.int64)
        dfull[:diag.shape[0]] = diag
        kind = _attn_mask.MASK_ROWS
        ref_mask, diag = full[None], dfull[None]
    else:
        kind, rows = _attn_mask.dense_mask(c.sq, c.sk, c.causal, c.window or (-1, -1))
        ref_mask = window_mask_ref(c.sq, c.sk, c.causal, c.window or (-1, -1))[None]
        diag = (np.arange(c.sq) + c.sk - c.sq)[None]
    if kind != _attn_mask.MASK_ROWS:
        return kind, None, None, ref_mask, diag
    rows = jnp.asarray(rows, jnp.int32)
    return kind, rows, _attn_mask.cols_from_rows(rows, c.sk), ref_mask, diag


def _inputs(c: Case, seed: int):
    rng = np.random.default_rng(seed)
    dt = jnp.dtype(c.dtype)
    shapes = [(c.b, c.sq, c.hq, c.d), (c.b, c.sk, c.hkv, c.d), (c.b, c.sk, c.hkv, c.dv), (c.b, c.sq, c.hq, c.dv)]
    host = [rng.standard_normal(s, np.float32).astype(dt) for s in shapes]
    if c.nan:  # keys some rows see and others do not (causal / window masks below them)
        k1, k2, k3 = min(c.sk - 1, c.sk // 4 + 1), min(c.sk - 1, c.sk // 3 + 2), min(c.sk - 1, 2 * c.sk // 3)
        host[2][:, k1, :, min(3, c.dv - 1)] = np.inf
        host[2][:, k1, :, 0] = -np.inf
        host[1][:, k2, :, min(5, c.d - 1)] = np.nan
        host[2][:, k3, :, :] = np.nan
    if c.nan_rows:  # query rows that see some keys of a tile and not others: NaN in their q and dO
        host[0][:, c.sq // 3 + 1, :, min(2, c.d - 1)] = np.nan
        host[3][:, c.sq // 2 + 3, :, 0] = np.nan
    alibi = bias = None
    if c.alibi is not None:
        alibi = (0.05 * (1 + np.arange(np.prod(c.alibi)) % 7)).astype(np.float32).reshape(c.alibi)
    if c.bias is not None:
        bias = rng.standard_normal(c.bias + (c.sq, c.sk), np.float32)
    return host, alibi, bias


def _compare(name, got, ref, rtol):
    """got within rtol of ref where ref is finite; non-finite exactly where ref is."""
    got = np.asarray(got, np.float64)
    fin = np.isfinite(ref)
    bad = np.isfinite(got) != fin
    assert not bad.any(), f"{name}: {int(bad.sum())} elements finite in one and not the other"
    if fin.all():
        err = rel_err(got, ref)
    else:
        err = rel_err(np.where(fin, got, 0.0), np.where(fin, ref, 0.0))
    assert err <= rtol, f"{name}: relative error {err:.2e} above {rtol}"


def run_case(c: Case):
    if c.sm90 and not _is_sm90():
        pytest.skip(f"{c.name}: the sm_90a kernels run on compute capability 9.0 only; this GPU is "
                    f"{getattr(jax.devices('gpu')[0], 'compute_capability', '?')}")
    gpu = jax.devices("gpu")[0]
    host, alibi, bias = _inputs(c, zlib.crc32(c.name.encode()))
    q, k, v, do = (jax.device_put(h, gpu) for h in host)
    kind, rows, cols, ref_mask, diag = _mask(c)
    scale = c.d ** -0.5
    dev = lambda x, dt: None if x is None else jax.device_put(jnp.asarray(x, dt), gpu)
    ops = {"rows": dev(rows, jnp.int32), "alibi": dev(alibi, jnp.float32), "bias": dev(bias, jnp.float32),
           "seed": dev(SEED if c.dropout else None, jnp.uint32)}
    attrs = {"mask": kind, "scale": scale, "softcap": c.softcap, "dropout_p": c.dropout}
    keep = dropout_keep_ref(SEED, c.dropout, c.b, c.hq, c.sq, c.sk) if c.dropout else None
    ref_o, ref_lse, ref_grads = attention_features_ref(
        *(f64(h) for h in host), scale=scale, mask=ref_mask, diag=diag, softcap=c.softcap, alibi=alibi,
        bias=bias, keep=keep, dropout_p=c.dropout)
    rtol = ATTENTION_RTOL[c.dtype]

    before = _path_calls("mha_fwd", c.fwd)
    ws = (1 << 21) // c.b  # the split-KV decode kernel's workspace: room for its splits (it takes what fits)
    fwd = jax.jit(lambda q, k, v, ops: ffi.fwd(q, k, v, **ops, **attrs, ws=ws,
                                               implementation=_implementation(c.fwd, c.force)))
    o, lse = jax.block_until_ready(fwd(q, k, v, ops))
    assert _path_calls("mha_fwd", c.fwd) == before + 1, f"the forward did not run on {PATH_NAMES[c.fwd]}"
    _compare("o", o, ref_o, rtol)
    lse, ref_lse = np.asarray(lse, np.float64), np.asarray(ref_lse)
    assert np.array_equal(np.isposinf(lse), np.isposinf(ref_lse)), "lse +inf (no visible key) differs"
    fin = np.isfinite(ref_lse)
    assert np.array_equal(np.isfinite(lse), fin), "lse finite where the reference is not, or the reverse"
    np.testing.assert_allclose(lse[fin], ref_lse[fin], rtol=0, atol=1e-3)
    if c.bwd is None:
        return
    ops["cols"] = dev(cols, jnp.int32)
    bwd = jax.jit(lambda q, k, v, o, do, lse, ops: ffi.bwd(q, k, v, o, do, lse, **ops, **attrs,
                                                          deterministic=c.deterministic, dbias=c.bias is not None,
                                                          implementation=_implementation(c.bwd, c.force)))
    args = (q, k, v, o, do, jnp.asarray(lse, jnp.float32), ops)
    before = _path_calls("mha_bwd", c.bwd)
    grads = jax.block_until_ready(bwd(*args))
    assert _path_calls("mha_bwd", c.bwd) == before + 1, f"the backward did not run on {PATH_NAMES[c.bwd]}"
    names = ("dq", "dk", "dv", "dbias")
    for name, got, ref in zip(names, grads, ref_grads):
        if name == "dbias" and c.bias is None:
            continue
        _compare(name, got, ref, rtol)
    if c.deterministic:
        again = jax.block_until_ready(bwd(*args))
        for name, x, y in zip(names, grads, again):
            assert np.asarray(x).tobytes() == np.asarray(y).tobytes(), f"{name} differs between two runs"


def _cases():
    cs = []
    for p in (SIMT, MMA):
        n = PATH_NAMES[p]
        cs += [
            Case(f"{n}-causal-gqa", p, p, causal=True),
            Case(f"{n}-causal-sq>sk", p, p, b=1, sq=131, sk=77, causal=True),
            Case(f"{n}-window-noncausal", p, p, sq=150, sk=150, window=(20, 5)),
            Case(f"{n}-window-0-0", p, p, b=1, sq=100, sk=100, window=(0, 0)),
            Case(f"{n}-window-wider-than-seq", p, p, b=1, sq=60, sk=60, window=(500, 500)),
            Case(f"{n}-varlen-causal-window-empty-seq", p, p, b=1, sq=200, sk=230, causal=True, window=(30, 0),
                 varlen=([37, 0, 80, 60, 23], [50, 10, 80, 70, 20])),
            Case(f"{n}-varlen-keyless-seq", p, p, b=1, sq=90, sk=90, causal=True,
                 varlen=([30, 20, 40], [40, 0, 50])),
            Case(f"{n}-window-softcap-d256", p, p, b=1, sq=90, sk=90, d=256, causal=True, window=(40, 0),
                 softcap=30.0),
            Case(f"{n}-gqa-alibi", p, p, hq=8, hkv=2, causal=True, alibi=(1, 8)),
            Case(f"{n}-alibi-batch-window", p, p, alibi=(2, 4), window=(16, 16)),
            Case(f"{n}-head-dim-59", p, p, d=59, causal=True),
            Case(f"{n}-head-dim-192-128", p, p, b=1, sq=50, sk=70, d=192, dv=128, causal=True),
            Case(f"{n}-deterministic-varlen-softcap", p, p, b=1, sq=200, sk=200, causal=True,
                 varlen=([90, 110], [90, 110]), softcap=4.0, deterministic=True),
            Case(f"{n}-deterministic-causal-d128", p, p, sq=150, sk=170, d=128, causal=True, deterministic=True),
            Case(f"{n}-nan-hidden-causal", p, p, b=1, sq=96, sk=96, hq=2, hkv=1, causal=True, nan=True),
            Case(f"{n}-nan-hidden-window", p, p, b=1, sq=160, sk=160, hq=2, hkv=1, window=(8, 0), nan=True,
                 nan_rows=True),
        ]
    cs += [
        Case("mma-float16-window-softcap-alibi", MMA, MMA, dtype="float16", sq=120, sk=120, window=(30, 10),
             softcap=6.0, alibi=(1, 4)),
        Case("mma-nan-rows-d192-window", MMA, MMA, b=1, sq=160, sk=160, hq=2, hkv=1, d=192, window=(8, 0),
             nan=True, nan_rows=True),
        # bias and dropout: the SIMT kernels, also where mma.sync is allowed
        Case("bias-broadcast-dbias", SIMT, SIMT, bias=(1, 1), force=False),
        Case("bias-per-batch-causal", SIMT, SIMT, bias=(2, 1), causal=True, force=False),
        Case("bias-per-head-window-softcap", SIMT, SIMT, b=1, sq=100, sk=100, bias=(1, 4), window=(20, 0),
             softcap=5.0, force=False),
        Case("dropout", SIMT, SIMT, dropout=0.3, force=False),
        Case("dropout-varlen-deterministic", SIMT, SIMT, b=1, sq=150, sk=150, causal=True,
             varlen=([70, 80], [70, 80]), dropout=0.2, deterministic=True, force=False),
        Case("float32-every-feature", SIMT, SIMT, dtype="float32", b=2, sq=60, sk=70, d=100, dv=128,
             causal=True, softcap=4.0, alibi=(2, 4), bias=(2, 4), dropout=0.1, deterministic=True),
        # split-KV decode
        Case("decode-window", DECODE, None, b=2, sq=1, sk=3000, hq=8, hkv=2, d=128, causal=True, window=(700, 0)),
        Case("decode-varlen", DECODE, None, b=1, sq=3, sk=2500, hq=8, hkv=1, d=128,
             varlen=([1, 1, 1], [900, 0, 1600])),
        Case("decode-draft-causal", DECODE, None, b=2, sq=4, sk=777, hq=8, hkv=1, causal=True),
        Case("decode-softcap-alibi", DECODE, None, b=2, sq=1, sk=999, hq=4, hkv=4, softcap=8.0, alibi=(2, 4)),
        Case("decode-nan-at-sequence-starts", DECODE, None, b=1, sq=4, sk=900, hq=16, hkv=4,
             varlen=([1, 1, 1, 1], [226, 76, 298, 300]), nan=True),
        Case("decode-odd-head-dim-takes-mma", MMA, None, b=1, sq=1, sk=300, hq=8, hkv=2, d=59, force=False),
    ]
    h = HOPPER  # the sm_90a kernels: every feature they take, head dims multiples of 8 (others go to mma.sync)
    cs += [
        Case("hopper-causal-gqa-d128", h, h, sq=300, sk=300, hq=8, hkv=2, d=128, causal=True),
        Case("hopper-causal-sq>sk", h, h, b=1, sq=331, sk=200, d=64, causal=True),
        Case("hopper-causal-sq<sk", h, h, b=1, sq=200, sk=513, d=64, causal=True),
        Case("hopper-window-noncausal", h, h, sq=400, sk=400, d=128, window=(70, 20)),
        Case("hopper-window-0-0", h, h, b=1, sq=300, sk=300, d=64, window=(0, 0)),
        Case("hopper-window-wider-than-seq", h, h, b=1, sq=260, sk=260, d=64, window=(900, 900)),
        Case("hopper-varlen-causal-window-empty-seq", h, h, b=1, sq=600, sk=650, d=128, causal=True,
             window=(100, 0), varlen=([137, 0, 280, 160, 23], [150, 10, 280, 190, 20])),
        Case("hopper-varlen-keyless-seq", h, h, b=1, sq=390, sk=390, d=64, causal=True,
             varlen=([130, 120, 140], [240, 0, 150])),
        Case("hopper-window-softcap-d256", h, h, b=1, sq=400, sk=400, d=256, causal=True, window=(140, 0),
             softcap=30.0),
        Case("hopper-gqa-alibi", h, h, sq=300, sk=300, hq=8, hkv=2, d=128, causal=True, alibi=(1, 8)),
        Case("hopper-alibi-batch-window-softcap", h, h, sq=300, sk=300, d=96, alibi=(2, 4), window=(60, 60),
             softcap=10.0),
        *(Case(f"hopper-head-dim-{d}", h, h, b=1, sq=300, sk=300, d=d, causal=True) for d in (40, 80, 112, 160, 192)),
        Case("hopper-head-dim-192-128", h, h, b=1, sq=300, sk=340, d=192, dv=128, causal=True),
        Case("hopper-head-dim-128-64", h, h, b=1, sq=300, sk=300, d=128, dv=64),
        # The forward's head-dim-80 kernel (sm90/dims.h): whole, zero-filled past 72, and beside dv != d.
        Case("hopper-head-dim-72", h, h, b=1, sq=300, sk=300, d=72, causal=True),
        Case("hopper-head-dim-80-64", h, h, b=1, sq=300, sk=320, d=80, dv=64),
        Case("hopper-head-dim-64-80", h, h, b=1, sq=300, sk=300, d=64, dv=80, causal=True),
        Case("hopper-d80-gqa-window-softcap-alibi", h, h, sq=300, sk=300, hq=8, hkv=2, d=80, window=(60, 10),
             softcap=20.0, alibi=(2, 8)),
        Case("hopper-float16-d80-varlen-causal", h, h, dtype="float16", b=1, sq=400, sk=400, d=80, causal=True,
             varlen=([150, 0, 250], [150, 0, 250])),
        Case("hopper-nan-hidden-d80", h, h, b=1, sq=300, sk=300, hq=2, hkv=1, d=80, causal=True, nan=True,
             nan_rows=True),
        # The forward's kernel of head dim 160 (the backward's 192 kernel behind it): zero-filled past 152,
        # every score term, the deterministic order, grouped kv heads, varlen, and non-finite keys.
        Case("hopper-head-dim-152", h, h, b=1, sq=300, sk=300, d=152, causal=True),
        Case("hopper-d160-gqa-window-softcap-alibi", h, h, sq=300, sk=300, hq=8, hkv=2, d=160, window=(60, 10),
             softcap=20.0, alibi=(2, 8)),
        Case("hopper-deterministic-d160-gqa-causal", h, h, sq=450, sk=470, hq=8, hkv=2, d=160, causal=True,
             deterministic=True),
        Case("hopper-float16-d160-varlen-causal", h, h, dtype="float16", b=1, sq=400, sk=400, d=160, causal=True,
             varlen=([150, 0, 250], [150, 0, 250])),
        Case("hopper-nan-hidden-d160-window", h, h, b=1, sq=300, sk=300, hq=2, hkv=1, d=160, window=(40, 0),
             nan=True, nan_rows=True),
        Case("hopper-deterministic-varlen-softcap", h, h, b=1, sq=500, sk=500, d=128, causal=True,
             varlen=([190, 310], [190, 310]), softcap=4.0, deterministic=True),
        Case("hopper-deterministic-gqa-causal-d128", h, h, sq=450, sk=470, hq=8, hkv=2, d=128, causal=True,
             deterministic=True),
        Case("hopper-deterministic-d256-window", h, h, b=1, sq=400, sk=400, d=256, window=(100, 0),
             deterministic=True),
        Case("hopper-nan-hidden-causal", h, h, b=1, sq=300, sk=300, hq=2, hkv=1, d=64, causal=True, nan=True),
        Case("hopper-nan-hidden-window-d128", h, h, b=1, sq=400, sk=400, hq=4, hkv=2, d=128, window=(40, 0),
             nan=True),
        Case("hopper-nan-rows-causal-gqa", h, h, b=1, sq=300, sk=300, hq=4, hkv=1, d=128, causal=True, nan_rows=True),
        Case("hopper-nan-rows-varlen-deterministic", h, h, b=1, sq=330, sk=330, hq=2, hkv=1, d=64,
             varlen=([100, 130, 100], [100, 130, 100]), causal=True, nan=True, nan_rows=True, deterministic=True),
        Case("hopper-nan-hidden-d256-window", h, h, b=1, sq=260, sk=260, hq=2, hkv=1, d=256, window=(30, 0),
             nan=True, nan_rows=True),
        Case("hopper-nan-hidden-softcap-alibi", h, h, b=2, sq=300, sk=300, hq=4, hkv=2, d=128, causal=True,
             softcap=20.0, alibi=(2, 4), nan=True, nan_rows=True),
        Case("hopper-float16-window-softcap-alibi", h, h, dtype="float16", sq=320, sk=320, d=64,
             window=(90, 10), softcap=6.0, alibi=(1, 4)),
        # the Hopper kernels left on decline bias and dropout: the call moves to SIMT
        Case("hopper-on-bias-takes-simt", SIMT, SIMT, b=1, sq=200, sk=200, d=128, bias=(1, 4), causal=True,
             force=False, sm90=True),
        Case("hopper-on-dropout-takes-simt", SIMT, SIMT, b=1, sq=200, sk=200, d=128, dropout=0.25, force=False,
             sm90=True),
    ]
    return cs


@pytest.mark.parametrize("case", _cases(), ids=repr)
def test_gpu_kernel_matches_reference(case):
    run_case(case)
