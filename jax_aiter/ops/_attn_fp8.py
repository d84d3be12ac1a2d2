"""FP8 attention: float8_e4m3fn q, k and v, each with its descale ([1] or [batch, heads_kv]: the value an element
stands for is element * descale), bfloat16 out; causal, windows, softcap, GQA and packed sequences (docs/serving.md,
"FP8 attention"). It runs on the paged attention kernel (paged.attend_fp8); attention.attend sends float8 inputs
here."""
from __future__ import annotations

from jax_aiter.ops import _attn_args, _attn_shapes, _checks, _paged_args, paged


def is_fp8(q, k, v) -> bool:
    return any(x.dtype == paged.FP8 for x in (q, k, v))


def refuse_descales(op: str, q, descales: dict) -> None:
    """Descales belong to float8 inputs: given with compute-dtype q, k and v they are refused."""
    for name, value in descales.items():
        if value is not None:
            raise TypeError(f"{op}: {name} is for float8_e4m3fn inputs (it multiplies their values), but q is "
                            f"{q.dtype.name}; drop {name}, or pass float8_e4m3fn q, k and v")


def attend(op: str, q, k, v, descales: dict, *, implementation, causal, softmax_scale, dropout_p, window_size,
           softcap, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_k, return_lse, unsupported: dict):
    """(out, lse or None, None), as attention.attend returns; `unsupported` names the features FP8 attention does
    not take, with the values given (refused unless None)."""
    if implementation not in (None, "cpu"):
        raise ValueError(f"{op}: FP8 attention (float8_e4m3fn q, k, v) runs on the CPU's paged kernel only; "
                         f"implementation {implementation!r} does not take it: pass implementation=None")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dtype != paged.FP8:
            raise TypeError(f"{op}: FP8 attention takes float8_e4m3fn q, k and v alike, but {name} is "
                            f"{x.dtype.name}; cast it (with its descale) or pass all three in one compute dtype")
    given = [name for name, value in unsupported.items() if value is not None]
    if given or _attn_args.dropout_p(op, dropout_p) > 0:
        raise ValueError(f"{op}: FP8 attention (float8_e4m3fn q, k, v) takes causal, window_size, softcap, GQA and "
                         f"cu_seqlens; {', '.join(given) or 'dropout_p > 0'} is not supported with float8 inputs: "
                         "dequantize to bfloat16 (x.astype(jnp.bfloat16) * descale) for those features")
    window = _attn_args.window(op, window_size)
    cap = _attn_args.softcap(op, softcap)
    causal = _attn_args.check_bool(op, "causal", causal)
    q4, k4, v4, packed = _attn_shapes.layout(op, q, k, v, _attn_shapes.varlen(op, cu_seqlens_q, cu_seqlens_kv))
    _attn_shapes.check(op, q4, k4, v4)
    heads_kv = k4.shape[2]
    scale = _checks.check_scale(op, softmax_scale, _attn_args.default_scale(q4.shape[3]))
    if packed:
        max_q, max_k = _attn_shapes.max_seqlens(op, max_seqlen_q, max_seqlen_k)
        cu_q, cu_k = _attn_shapes.cu_seqlens_pair(op, cu_seqlens_q, cu_seqlens_kv, q4.shape[1], k4.shape[1],
                                                  max_q, max_k)
        batch, args = cu_q.shape[0] - 1, (q4[0], k4[0], v4[0])
    else:
        cu_q = cu_k = None
        batch, args = q4.shape[0], (q4, k4, v4)
    scales = tuple(_paged_args.descale(op, n, x, batch, heads_kv) for n, x in descales.items())
    out, lse = paged.attend_fp8(op, *args, descales=scales, causal=causal, window=window, softcap=cap, scale=scale,
                                cu_seqlens_q=cu_q, cu_seqlens_kv=cu_k, return_lse=return_lse)
    return out, lse, None
