"""The definitions attention's kernels share with the Python op: the masks' rows and cols, and the dropout draw.

Masks (jax_aiter/ops/_attn_mask.py) are compared with masks written from the definitions in
docs/attention.md with explicit loops (tests/ops/reference.py): dense windows causal and not, varlen
batches with empty sequences, segment ids; the backward's cols must cover every row that sees a key,
and every construction keeps lo, hi monotone inside [0, seq_k], also for malformed traced boundaries.
The dropout draw (jax_aiter/ops/_attn_dropout.py) is checked against Philox4x32-10's published
known-answer vectors and against a plain-Python Philox, bit for bit.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_aiter.ops import _attn_dropout, _attn_mask
from tests.ops.reference import (
    dropout_keep_ref,
    philox4x32_ref,
    segment_mask_ref,
    varlen_mask_ref,
    window_mask_ref,
)

WINDOWS = [(-1, -1), (0, 0), (2, -1), (-1, 1), (3, 2), (1, 0), (50, 50)]
SEQS = [(5, 9), (9, 5), (7, 7), (1, 13), (13, 1)]


def _rows_of(kind, rows, sq, sk):
    if rows is None:
        return jnp.asarray(_attn_mask.dense_rows_np(sq, sk, -1, 0 if kind == _attn_mask.MASK_CAUSAL else -1))
    return jnp.asarray(rows)


def _assert_valid(rows, sk, ref_mask, ref_diag=None):
    """rows describe exactly ref_mask, lo and hi are monotone in [0, sk], and cols cover every visible pair."""
    r = np.asarray(rows)
    vis = np.asarray(_attn_mask.visible(jnp.asarray(r), sk))
    np.testing.assert_array_equal(vis, np.broadcast_to(ref_mask, vis.shape))
    lo, hi = r[:, 0], r[:, 1]
    assert (lo >= 0).all() and (hi <= sk).all() and (lo <= hi).all()
    assert (np.diff(lo, axis=-1) >= 0).all() and (np.diff(hi, axis=-1) >= 0).all()
    if ref_diag is not None:
        np.testing.assert_array_equal(r[:, 2], np.broadcast_to(ref_diag, r[:, 2].shape))
    cols = np.asarray(_attn_mask.cols_from_rows(jnp.asarray(r), sk))
    for b in range(r.shape[0]):
        m = np.broadcast_to(ref_mask, vis.shape)[b]
        for j in range(sk):
            seen = np.nonzero(m[:, j])[0]
            if seen.size:
                assert cols[b, 0, j] <= seen.min() and seen.max() < cols[b, 1, j], (b, j, cols[b, :, j], seen)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("window", WINDOWS, ids=str)
@pytest.mark.parametrize("seqs", SEQS, ids=lambda s: f"sq{s[0]}-sk{s[1]}")
def test_dense_rows_match_the_definition(causal, window, seqs):
    sq, sk = seqs
    kind, rows = _attn_mask.dense_mask(sq, sk, causal, window)
    left, right = _attn_mask.effective_window(causal, window)
    if left < 0 and right < 0:
        assert kind == _attn_mask.MASK_NONE
    _assert_valid(_rows_of(kind, rows, sq, sk), sk, window_mask_ref(sq, sk, causal, window),
                  np.arange(sq) + sk - sq)


def test_window_wider_than_the_sequence_needs_no_rows():
    """A window covering every key is the plain (or causal) mask: no rows operand, the kernels' fast path."""
    assert _attn_mask.dense_mask(8, 8, False, (7, 7)) == (_attn_mask.MASK_NONE, None)
    assert _attn_mask.dense_mask(8, 8, True, (100, -1)) == (_attn_mask.MASK_CAUSAL, None)
    assert _attn_mask.dense_mask(8, 8, False, (6, 7))[0] == _attn_mask.MASK_ROWS


def test_symbolic_lengths_give_the_same_rows():
    """Under jax.export the lengths are symbolic and the rows are computed in the program: same values."""
    from jax import export

    def rows_of(q):
        return _attn_mask.dense_mask(q.shape[0], q.shape[0] + 3, True, (2, 0))[1]

    s, = export.symbolic_shape("s")
    exp = export.export(jax.jit(rows_of))(jax.ShapeDtypeStruct((s,), jnp.float32))
    for n in (1, 6, 11):
        np.testing.assert_array_equal(exp.call(np.zeros(n, np.float32)), _attn_mask.dense_rows_np(n, n + 3, 2, 0))


CU = [([0, 3, 3, 8, 9], [0, 5, 6, 6, 10]), ([0, 4], [0, 4]), ([0, 0, 5], [0, 2, 2]), ([0, 1, 2, 3], [0, 7, 8, 20])]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("window", WINDOWS, ids=str)
@pytest.mark.parametrize("cu", CU, ids=lambda c: "-".join(map(str, c[0])))
def test_varlen_rows_match_the_definition(causal, window, cu):
    """Each packed sequence alone, bottom-right aligned in its own keys; zero-length sequences on either side."""
    cu_q, cu_k = (np.asarray(c, np.int32) for c in cu)
    rows = jax.jit(_attn_mask.varlen_rows, static_argnums=(2, 3, 4, 5))(cu_q, cu_k, int(cu_q[-1]), int(cu_k[-1]),
                                                                        causal, window)
    mask, diag = varlen_mask_ref(cu_q, cu_k, causal, window)
    _assert_valid(rows, int(cu_k[-1]), mask[None], diag)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("window", [(-1, -1), (1, 0), (2, 1), (0, 0)], ids=str)
def test_segment_rows_match_the_definition(causal, window):
    """A document is a run of equal ids: the two runs of id 1 in the first row are two documents."""
    ids = np.array([[1, 1, 1, 2, 2, 3, 3, 3, 3, 1, 1], [0] * 11, list(range(11))])
    rows = jax.jit(_attn_mask.segment_rows, static_argnums=(1, 2))(ids, causal, window)
    mask, diag = segment_mask_ref(ids, causal, window)
    _assert_valid(rows, 11, mask, diag)
    assert not mask[0, 9, :3].any()  # unlike an equality mask (Flax's make_attention_mask(ids, ids, jnp.equal))


@pytest.mark.parametrize("cu_q,cu_k", [([0, 9, 3, 12], [0, 2, 8, 10]), ([5, -3, 40], [0, 99, 1]),
                                       ([0, 2, 4], [0, 6, 3])])
def test_malformed_traced_boundaries_stay_in_bounds(cu_q, cu_k):
    """Traced cu_seqlens cannot be checked in Python: whatever they hold, the rows stay valid for the kernels."""
    total_q, total_k = 9, 10
    rows = jax.jit(lambda a, b: _attn_mask.varlen_rows(a, b, total_q, total_k, True, (3, 0)))(
        np.asarray(cu_q, np.int32), np.asarray(cu_k, np.int32))
    r = np.asarray(rows)[0]
    assert r.shape == (3, total_q)
    assert (r[0] >= 0).all() and (r[1] <= total_k).all() and (r[0] <= r[1]).all()
    assert (np.diff(r[0]) >= 0).all() and (np.diff(r[1]) >= 0).all()


# --- dropout: Philox4x32-10 ---------------------------------------------------------------------

# Random123's known-answer vectors for philox4x32 with 10 rounds (kat_vectors): counter, key, result.
PHILOX_KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF, 0xFFFFFFFF), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("counter,key,want", PHILOX_KAT)
def test_philox_known_answers(counter, key, want):
    got = jax.jit(_attn_dropout.philox4x32)(*(np.uint32(c) for c in counter), *(np.uint32(k) for k in key))
    assert tuple(int(x) for x in got) == want
    assert tuple(philox4x32_ref(counter, key)) == want


def test_mulhilo_is_the_64_bit_product():
    a = np.random.default_rng(0).integers(0, 2 ** 32, 4096, dtype=np.uint64)
    a[:4] = [0, 1, 0xFFFF, 0xFFFFFFFF]
    for b in (0xD2511F53, 0xCD9E8D57, 0xFFFFFFFF, 0x10000, 1):
        hi, lo = jax.jit(lambda x, b=b: _attn_dropout.mulhilo(x, b))(a.astype(np.uint32))
        prod = a * np.uint64(b)
        np.testing.assert_array_equal(np.asarray(hi), (prod >> np.uint64(32)).astype(np.uint32))
        np.testing.assert_array_equal(np.asarray(lo), (prod & np.uint64(0xFFFFFFFF)).astype(np.uint32))


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_keep_mask_matches_the_definition(p):
    """Indices, offsets and the threshold as mha_dropout_keep has them; about 1 - p of the elements kept."""
    seed = np.array([0x12345678, 0x9ABCDEF0, 3, 5], np.uint32)
    got = np.asarray(jax.jit(lambda s: _attn_dropout.keep_mask(s, p, 2, 3, 5, 11))(seed))
    want = dropout_keep_ref(seed, p, 2, 3, 5, 11)
    np.testing.assert_array_equal(got, want)
    big = np.asarray(_attn_dropout.keep_mask(seed, p, 2, 4, 64, 64))
    assert abs(big.mean() - (1 - p)) < 0.02


def test_seed_from_key_is_a_pure_function_of_the_key():
    k1, k2 = jax.random.key(1), jax.random.key(2)
    s1 = np.asarray(jax.jit(_attn_dropout.seed_from_key)(k1))
    assert s1.dtype == np.uint32 and s1.shape == (4,) and (s1[2:] == 0).all()
    np.testing.assert_array_equal(s1, _attn_dropout.seed_from_key(k1))
    assert (s1[:2] != np.asarray(_attn_dropout.seed_from_key(k2))[:2]).any()
    np.testing.assert_array_equal(_attn_dropout.seed_from_key(jax.random.PRNGKey(1)),
                                  _attn_dropout.seed_from_key(jax.random.wrap_key_data(jax.random.PRNGKey(1))))


def test_threshold_is_the_kernels():
    """floor(float32(p) * 2^32), as mha_dropout_threshold computes it from the float attribute."""
    for p in (0.0, 0.1, 0.3, 0.5, 1.0 - 2 ** -24):
        assert _attn_dropout.threshold(p) == int(float(np.float32(p)) * 2.0 ** 32)
    assert _attn_dropout.threshold(0.5) == 2 ** 31


def test_every_combination_is_monotone():
    """Random dense and varlen configurations: the kernels' invariants (lo <= hi, both non-decreasing) hold."""
    rng = np.random.default_rng(3)
    for _ in range(10):
        n = int(rng.integers(1, 5))
        lq, lk = rng.integers(0, 7, n), rng.integers(0, 7, n)
        cu_q, cu_k = np.concatenate([[0], np.cumsum(lq)]), np.concatenate([[0], np.cumsum(lk)])
        window = tuple(int(w) for w in rng.integers(-1, 5, 2))
        for causal in (False, True):
            rows = _attn_mask.varlen_rows(jnp.asarray(cu_q), jnp.asarray(cu_k), int(cu_q[-1]), int(cu_k[-1]),
                                          causal, window)
            mask, diag = varlen_mask_ref(cu_q, cu_k, causal, window)
            _assert_valid(rows, int(cu_k[-1]), mask[None], diag)


# The kernels' own definition (csrc/include/ja/kernels/mha_features.h), compiled here with the host C++
# compiler: for a grid of (b, h, i, j) and seeds with nonzero batch/head offsets, one char per element.
_DRIVER = r"""
#include <cstdio>
#include <cstdlib>
#include "ja/kernels/mha_features.h"
int main(int argc, char** argv) {
  uint32_t seed[4];
  for (int n = 0; n < 4; ++n) seed[n] = uint32_t(std::strtoul(argv[1 + n], nullptr, 10));
  const float p = std::strtof(argv[5], nullptr);
  const int B = std::atoi(argv[6]), H = std::atoi(argv[7]), Q = std::atoi(argv[8]), K = std::atoi(argv[9]);
  const uint32_t thr = ja::mha_dropout_threshold(p);
  for (int b = 0; b < B; ++b) for (int h = 0; h < H; ++h) for (int i = 0; i < Q; ++i) for (int j = 0; j < K; ++j)
    std::putchar(ja::mha_dropout_keep(seed, thr, b, h, i, j) ? '1' : '0');
  return 0;
}
"""


def test_keep_mask_equals_the_kernels_definition_bit_for_bit(tmp_path):
    import shutil
    import subprocess
    from pathlib import Path

    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no host C++ compiler (g++ or c++) on PATH to compile csrc/include/ja/kernels/mha_features.h")
    root = Path(__file__).resolve().parents[2]
    (tmp_path / "drv.cpp").write_text(_DRIVER)
    subprocess.run([cxx, "-std=c++17", "-O1", f"-I{root / 'csrc/include'}", str(tmp_path / "drv.cpp"), "-o",
                    str(tmp_path / "drv")], check=True, capture_output=True, timeout=300)
    for seed, p, shape in (([0xDEADBEEF, 7, 3, 5], 0.3, (2, 3, 9, 13)), ([1, 0xFFFFFFFF, 0, 0], 0.9, (1, 2, 5, 33)),
                           ([12345, 67890, 4000000000, 17], 0.05, (2, 2, 3, 7))):
        out = subprocess.run([str(tmp_path / "drv"), *map(str, seed), repr(p), *map(str, shape)], check=True,
                             capture_output=True, text=True, timeout=60).stdout
        want = np.array([c == "1" for c in out]).reshape(shape)
        got = np.asarray(_attn_dropout.keep_mask(np.asarray(seed, np.uint32), p, *shape))
        np.testing.assert_array_equal(got, want)
