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


# --- attention's features (tests/ops/test_attention_features.py): float64 NumPy, written from the
# definitions in docs/attention.md with explicit loops over the sequences, independent of
# jax_aiter/ops/_attn_mask.py and _attn_dropout.py. ---

def window_mask_ref(sq: int, sk: int, causal: bool, window=(-1, -1), q0: int = 0, k0: int = 0,
                    total_k: int | None = None) -> np.ndarray:
    """bool [sq, total_k]: query i (of a sequence of sq queries) sees key k0 + j iff j <= i + sk - sq
    (causal), i + sk - sq - left <= j (left >= 0) and j <= i + sk - sq + right (right >= 0)."""
    left, right = window
    if causal:
        right = 0
    out = np.zeros((sq, sk if total_k is None else total_k), bool)
    for i in range(sq):
        diag = i + sk - sq
        for j in range(sk):
            ok = (left < 0 or j >= diag - left) and (right < 0 or j <= diag + right)
            out[i, k0 + j] = ok
    return out


def window_diag_ref(sq: int, sk: int) -> np.ndarray:
    return np.arange(sq) + sk - sq


def varlen_mask_ref(cu_q, cu_k, causal: bool, window=(-1, -1)):
    """(bool [total_q, total_k], diag [total_q]) of packed sequences: each sequence alone, bottom-right aligned."""
    cu_q, cu_k = list(map(int, cu_q)), list(map(int, cu_k))
    total_q, total_k = cu_q[-1], cu_k[-1]
    mask = np.zeros((total_q, total_k), bool)
    diag = np.zeros(total_q, np.int64)
    for s in range(len(cu_q) - 1):
        lq, lk = cu_q[s + 1] - cu_q[s], cu_k[s + 1] - cu_k[s]
        mask[cu_q[s]:cu_q[s + 1]] = window_mask_ref(lq, lk, causal, window, k0=cu_k[s], total_k=total_k)
        diag[cu_q[s]:cu_q[s + 1]] = cu_k[s] + window_diag_ref(lq, lk)
    return mask, diag


def segment_mask_ref(ids, causal: bool, window=(-1, -1)):
    """(bool [batch, seq, seq], diag [batch, seq]): each run of equal ids of a row is one sequence."""
    ids = np.asarray(ids)
    masks, diags = [], []
    for row in ids:
        cu = [0] + [i for i in range(1, len(row)) if row[i] != row[i - 1]] + [len(row)]
        m, d = varlen_mask_ref(cu, cu, causal, window) if len(row) else (np.zeros((0, 0), bool), np.zeros(0))
        masks.append(m)
        diags.append(d)
    return np.stack(masks), np.stack(diags)


def philox4x32_ref(counter, key) -> list[int]:
    """Philox4x32-10 (Salmon et al., SC'11) of four 32-bit counter words under a two-word key, in Python ints."""
    m = 0xFFFFFFFF
    c, (k0, k1) = list(counter), key
    for r in range(10):
        if r:
            k0, k1 = (k0 + 0x9E3779B9) & m, (k1 + 0xBB67AE85) & m
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k0, p1 & m, (p0 >> 32) ^ c[3] ^ k1, p0 & m]
    return c


def dropout_keep_ref(seed, p: float, batch: int, heads: int, sq: int, sk: int) -> np.ndarray:
    """bool [batch, heads, sq, sk]: element (b, h, i, j) is kept iff word j % 4 of Philox((j // 4, i, h + seed[3],
    b + seed[2]), (seed[0], seed[1])) is >= floor(float32(p) * 2^32)."""
    seed = [int(s) for s in seed]
    thr = int(float(np.float32(p)) * 2.0 ** 32)
    out = np.zeros((batch, heads, sq, sk), bool)
    for b in range(batch):
        for h in range(heads):
            for i in range(sq):
                for jb in range(0, sk, 4):
                    words = philox4x32_ref([jb // 4, i, h + seed[3], b + seed[2]], seed[:2])
                    for j in range(jb, min(jb + 4, sk)):
                        out[b, h, i, j] = words[j % 4] >= thr
    return out


def attention_features_ref(q, k, v, do, *, scale: float, mask, diag=None, softcap: float = 0.0, alibi=None,
                           bias=None, keep=None, dropout_p: float = 0.0, dlse=None):
    """float64 attention with every feature, and its gradients.

    q [b, sq, hq, d], k [b, sk, hkv, d], v [b, sk, hkv, dv], do [b, sq, hq, dv]; mask bool [1 or b, sq, sk];
    diag int [1 or b, sq] (ALiBi's origin); alibi [1 or b, hq]; bias [bb, bh, sq, sk] (broadcast); keep bool
    [b, hq, sq, sk] with dropout_p; dlse [b, hq, sq] a cotangent of lse (d lse / d s = P). The score is
    s = scale q.k, then softcap * tanh(s / softcap), minus
    alibi * |diag_i - j|, plus bias; P = softmax over the visible keys (0 for a row that sees none, whose
    lse is +inf); O = (P * keep / (1 - p)) V. Returns (o, lse [b, hq, sq], (dq, dk, dv, dbias [b, hq, sq, sk])).
    A key a row does not see never reaches it, NaN or infinite K and V included (the products over keys skip
    P's zeros, the hidden pairs' dS is 0), nor a row's Q or dO the key's dk and dv (the products over rows skip
    them too), while a row that sees one gets its NaN or infinity."""
    q, k, v, do = (np.asarray(x, np.float64) for x in (q, k, v, do))
    b, _, hq, d = q.shape
    sk, hkv, dv = k.shape[1], k.shape[2], v.shape[3]
    g = hq // hkv
    ke, ve = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)
    z = np.einsum("bqhd,bkhd->bhqk", q, ke) * scale
    s = softcap * np.tanh(z / softcap) if softcap else z
    if alibi is not None:
        dist = np.abs(np.asarray(diag, np.float64)[:, None, :, None] - np.arange(sk)[None, None, None, :])
        s = s - np.asarray(alibi, np.float64)[:, :, None, None] * dist
    if bias is not None:
        s = s + np.asarray(bias, np.float64)
    vis = np.broadcast_to(np.asarray(mask, bool)[:, None], s.shape)
    s = np.where(vis, s, -np.inf)
    m = s.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.where(vis, np.exp(s - m), 0.0)
    den = e.sum(-1, keepdims=True)
    empty = den == 0  # (a NaN den, from a NaN score the row sees, is not empty)
    p = np.where(empty | ~vis, 0.0, e / np.where(empty, 1.0, den))  # a NaN row's NaN stays on the keys it sees
    lse = np.where(empty[..., 0], np.inf, np.log(np.where(empty[..., 0], 1.0, den[..., 0])) + m[..., 0])
    drop = np.ones_like(p) if keep is None else np.asarray(keep, np.float64) / (1.0 - dropout_p)
    pd = p * drop
    o = _over_keys(pd, ve)
    dov = np.einsum("bqhd->bhqd", do)
    dvv = _over_keys(np.swapaxes(pd, 2, 3), do)  # over the rows: a dO row a key does not see never reaches it
    dp = np.where(vis, np.einsum("bhqd,bkhd->bhqk", dov, ve), 0.0) * drop
    ds = p * (dp - (p * dp).sum(-1, keepdims=True))
    if dlse is not None:
        ds = ds + p * np.asarray(dlse, np.float64)[..., None]
    ds = np.where(vis, ds, 0.0)
    dz = ds * (1.0 - (np.where(vis, s_soft(z, softcap), 0.0) / softcap) ** 2) if softcap else ds
    dq = _over_keys(dz, ke) * scale
    dk = _over_keys(np.swapaxes(dz, 2, 3), q) * scale  # the same for a Q row
    dk = dk.reshape(b, sk, hkv, g, d).sum(3)
    dvv = dvv.reshape(b, sk, hkv, g, dv).sum(3)
    return o, lse, (dq, dk, dvv, ds)


def _over_keys(w, x):
    """einsum("bhqk,bkhd->bqhd", w, x) where a zero of w never meets x: 0 * inf is NaN, and a key that a row
    does not see (or dropped) must not reach it whatever K or V hold there. The non-finite elements of x (few)
    are added one by one to the rows whose w is not 0."""
    bad = ~np.isfinite(x)
    out = np.einsum("bhqk,bkhd->bqhd", w, np.where(bad, 0.0, x))
    for b, j, h, c in zip(*np.nonzero(bad)):
        wj = w[b, h, :, j]
        hit = wj != 0  # (NaN != 0: a NaN weight reaches the row)
        out[b, hit, h, c] += wj[hit] * x[b, j, h, c]
    return out


def s_soft(z, softcap: float):
    return softcap * np.tanh(z / softcap)


def sum_to(x: np.ndarray, shape) -> np.ndarray:
    """x summed over the axes that `shape` broadcasts (the gradient of a broadcast operand)."""
    lead = x.ndim - len(shape)
    x = x.sum(axis=tuple(range(lead))) if lead else x
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and x.shape[i] != 1)
    return x.sum(axis=axes, keepdims=True) if axes else x


# --- the paged KV cache (tests/ops/test_paged.py): float64 NumPy from docs/serving.md's definitions, with the pages
# gathered by explicit loops, independent of jax_aiter/ops/paged.py and of the kernels. ---

def paged_keys_ref(pool, indptr, indices, last, s: int) -> np.ndarray:
    """Sequence s's keys (or values) [seq_k, kv_heads, dim], float64: its pages in order, the last one cut at
    last[s] tokens."""
    pool = f64(pool)
    rows = []
    pages = list(np.asarray(indices)[int(indptr[s]):int(indptr[s + 1])])
    for n, page in enumerate(pages):
        count = int(last[s]) if n == len(pages) - 1 else pool.shape[1]
        rows += [pool[int(page), r] for r in range(count)]
    return np.stack(rows) if rows else np.zeros((0, *pool.shape[2:]))


def paged_attention_ref(q, k_pool, v_pool, cu_q, indptr, indices, last, *, scale: float, causal: bool = True,
                        window=(-1, -1), softcap: float = 0.0, descales=(1.0, 1.0, 1.0)):
    """float64 attention of packed queries q [total_q, heads, d] over each sequence's paged keys: query token t of
    sequence s (seq_q tokens, seq_k keys) sees the keys window_mask_ref gives (bottom-right aligned); the score is
    scale * qd * kd * q.k, through softcap; out = vd * softmax . V; a row without keys gives 0 (lse +inf), as do the
    rows past cu_q[-1]. descales: three floats, or arrays [num_seqs, kv_heads]. Returns (out, lse [heads, total_q])."""
    q = f64(q)
    total_q, heads, _ = q.shape
    kv_heads = k_pool.shape[2]
    group = heads // kv_heads
    out = np.zeros((total_q, heads, v_pool.shape[3]))
    lse = np.full((heads, total_q), np.inf)
    n = len(cu_q) - 1
    d_of = [np.broadcast_to(np.asarray(x, np.float64).reshape(-1, kv_heads) if np.size(x) > 1 else
                            np.full((1, kv_heads), float(np.asarray(x).reshape(-1)[0])), (n, kv_heads))
            for x in descales]
    for s in range(n):
        keys, vals = (paged_keys_ref(p, indptr, indices, last, s) for p in (k_pool, v_pool))
        q0, sq, sk = int(cu_q[s]), int(cu_q[s + 1] - cu_q[s]), keys.shape[0]
        visible = window_mask_ref(sq, sk, causal, window)
        for t in range(sq):
            for h in range(heads):
                hk = h // group
                z = keys[:, hk] @ q[q0 + t, h] * scale * d_of[0][s, hk] * d_of[1][s, hk]
                z = softcap * np.tanh(z / softcap) if softcap else z
                z = z[visible[t]]
                if z.size == 0:
                    continue
                m = z.max()
                p = np.exp(z - m)
                out[q0 + t, h] = d_of[2][s, hk] * (p / p.sum()) @ vals[visible[t], hk]
                lse[h, q0 + t] = m + np.log(p.sum())
    return out, lse
