"""The paged KV cache composed as a server composes it: a decode step (append_kv, then paged_attention) under a jit
that donates the pools, read from the compiled HLO and run for 500 steps; the same loop in lax.scan; vmap; grad;
jax.export of a decode step reloaded in a fresh process.

In place, proven three ways: the compiled module aliases each donated pool to its output and its ja_append_kv call
to its operands, and no instruction makes a pool-sized value other than the parameters and the call's results (a
control without donation shows the two copies XLA must then make); XLA's memory analysis counts both pools as
aliased and a temporary far smaller than a pool; across 500 steps the pools keep their buffers (their addresses do
not change), the live arrays' bytes do not grow, and the process's resident memory grows by less than one pool.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

import jax_aiter
from jax_aiter.ops import append_kv, paged_attention
from tests.ops.reference import TOL, f64, paged_attention_ref

ROOT = Path(__file__).resolve().parents[2]
PAGES, PAGE, KV_HEADS, HEADS, D, SEQS = 1024, 16, 2, 8, 64, 8
POOL = (PAGES, PAGE, KV_HEADS, D)
POOL_BYTES = int(np.prod(POOL)) * 2  # bfloat16


@pytest.fixture
def cpu(device):
    if device.platform != "cpu":
        pytest.skip("the paged KV cache has CPU kernels only so far (docs/serving.md, Backends)")
    return device


def step(k_pool, v_pool, k_new, v_new, slots, q, kv_indptr, kv_page_indices, kv_last_page_lens):
    """One decode step: each sequence's new token appended, then attended with its history."""
    k_pool, v_pool = append_kv(k_new, v_new, slots, k_pool, v_pool)
    out = paged_attention(q, k_pool, v_pool, kv_indptr, kv_page_indices, kv_last_page_lens, max_seq_len=1024)
    return k_pool, v_pool, out


class Server:
    """SEQS sequences, each on pages of its own (sequence s on pages s, s + SEQS, ...), one token a step; the page
    list padded to the pool's page count (entries past kv_indptr[-1] are not read)."""

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.lens = np.zeros(SEQS, np.int64)

    def inputs(self):
        """The next step's arguments after the pools: new K/V, slots, queries and the page table."""
        pos = self.lens.copy()
        self.lens += 1
        slots = (pos // PAGE * SEQS + np.arange(SEQS)) * PAGE + pos % PAGE
        used = (self.lens - 1) // PAGE + 1
        indptr = np.concatenate([[0], np.cumsum(used)]).astype(np.int32)
        indices = np.concatenate([np.arange(u) * SEQS + s for s, u in enumerate(used)]).astype(np.int32)
        indices = np.pad(indices, (0, PAGES - len(indices)))  # a fixed length, as a server's (one compilation)
        last = ((self.lens - 1) % PAGE + 1).astype(np.int32)
        new = [self.rng.standard_normal(s).astype(jnp.bfloat16) for s in ((SEQS, KV_HEADS, D),) * 2 +
               ((SEQS, HEADS, D),)]
        return new[0], new[1], slots.astype(np.int32), new[2], indptr, indices, last


def _pools():
    return jnp.zeros(POOL, jnp.bfloat16), jnp.zeros(POOL, jnp.bfloat16)


def pool_sized(hlo: str) -> list[str]:
    """The instructions of compiled HLO that make a pool-shaped value, each as `kind(` (parameter, copy, ...)."""
    shape = re.escape(f"bf16[{','.join(map(str, POOL))}]")
    return re.findall(rf"=\s*{shape}\{{[^}}]*\}}\s+([a-z-]+)\(", hlo)


# --- one step under jit with donation: the compiled HLO ----------------------------------------------------------

def test_a_donated_step_holds_no_pool_sized_copy(cpu, capsys):
    args = (*_pools(), *Server().inputs())
    donated = jax.jit(step, donate_argnums=(0, 1)).lower(*args).compile()
    text = donated.as_text()
    assert "input_output_alias={ {0}: (0, {}, may-alias), {1}: (1, {}, may-alias) }" in text
    call = next(line for line in text.splitlines() if 'custom_call_target="ja_append_kv"' in line)
    assert "output_to_operand_aliasing={{0}: (5, {}), {1}: (6, {})}" in call
    assert sorted(pool_sized(text)) == ["get-tuple-element"] * 2 + ["parameter"] * 2, pool_sized(text)
    memory = donated.memory_analysis()
    with capsys.disabled():
        print(f"\n[paged donation] compiled step: pools 2 x {POOL_BYTES} B, aliased {memory.alias_size_in_bytes} B, "
              f"temporaries {memory.temp_size_in_bytes} B")
    assert memory.alias_size_in_bytes == 2 * POOL_BYTES and memory.temp_size_in_bytes < POOL_BYTES // 64
    # the control: without donation XLA keeps the caller's pools and writes copies, one per pool
    kept = jax.jit(step).lower(*args).compile()
    assert sorted(pool_sized(kept.as_text())).count("copy") == 2 and kept.memory_analysis().alias_size_in_bytes == 0


def test_a_scan_of_decode_steps_writes_the_carried_pools_in_place(cpu):
    """A server loop written as lax.scan over steps, the pools in the carry: the loop body aliases them too."""
    server = Server()
    per_step = [server.inputs() for _ in range(4)]
    xs = tuple(np.stack(a) for a in zip(*per_step[-1:] * 4))  # one step's shapes, four times (the table's last)

    def loop(k_pool, v_pool, xs):
        def body(carry, x):
            k, v, out = step(*carry, *x)
            return (k, v), out
        (k_pool, v_pool), outs = jax.lax.scan(body, (k_pool, v_pool), xs)
        return k_pool, v_pool, outs

    text = jax.jit(loop, donate_argnums=(0, 1)).lower(*_pools(), xs).compile().as_text()
    assert "copy" not in pool_sized(text), pool_sized(text)


# --- 500 steps: the memory stays flat ------------------------------------------------------------------------------

def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_500_donated_steps_keep_the_pools_buffers_and_memory_flat(cpu, capsys):
    """The figures (docs/serving.md quotes them): pool bytes, the pools' addresses, live array bytes and resident
    memory after 10 warm-up steps and after 500 more."""
    server = Server()
    run = jax.jit(step, donate_argnums=(0, 1))
    k_pool, v_pool = _pools()
    for _ in range(10):
        k_pool, v_pool, out = run(k_pool, v_pool, *server.inputs())
    jax.block_until_ready(out)
    address = (k_pool.unsafe_buffer_pointer(), v_pool.unsafe_buffer_pointer())
    live, rss = sum(a.nbytes for a in jax.live_arrays()), _rss()
    for _ in range(500):
        k_pool, v_pool, out = run(k_pool, v_pool, *server.inputs())
    jax.block_until_ready(out)
    live_after, rss_after = sum(a.nbytes for a in jax.live_arrays()), _rss()
    with capsys.disabled():
        print(f"\n[paged donation] pools 2 x {POOL_BYTES} B; addresses {address[0]:#x}, {address[1]:#x} before, "
              f"{k_pool.unsafe_buffer_pointer():#x}, {v_pool.unsafe_buffer_pointer():#x} after 500 steps; live "
              f"arrays {live} -> {live_after} B; resident {rss} -> {rss_after} B ({rss_after - rss:+d})")
    assert (k_pool.unsafe_buffer_pointer(), v_pool.unsafe_buffer_pointer()) == address
    assert live_after == live
    assert rss_after - rss < POOL_BYTES
    # the control: without donation each step writes fresh pools (XLA's copies), at other addresses
    keep = jax.jit(step)
    seen = set()
    for _ in range(4):
        k_pool, v_pool, _ = keep(k_pool, v_pool, *server.inputs())
        seen.add(k_pool.unsafe_buffer_pointer())
    assert len(seen) > 1
    server.lens -= 4
    # and the step computed: the last step's attention against float64 over everything the pools hold
    _, _, _, q, indptr, indices, last = server.inputs()
    server.lens -= 1
    want, _ = paged_attention_ref(q, np.asarray(k_pool), np.asarray(v_pool), np.arange(SEQS + 1), indptr, indices,
                                  last, scale=D ** -0.5)
    got = paged_attention(q, k_pool, v_pool, indptr, indices, last, max_seq_len=1024)
    np.testing.assert_allclose(f64(got), want, rtol=TOL[jnp.dtype(jnp.bfloat16)]["rtol"], atol=2e-2)
    assert indptr[-1] == SEQS * 32  # 511 tokens a sequence: 32 pages each


# --- vmap, grad ------------------------------------------------------------------------------------------------

def test_vmap_of_decode_is_a_loop_of_calls_and_append_kv_refuses_it(cpu):
    """vmap over layers (a pool and a page table each): the same as calling each; append_kv writes its pools in
    place and refuses vmap, naming what to do."""
    server = Server()
    layers = []
    for layer in range(3):
        k_pool, v_pool = _pools()
        for _ in range(20):
            k_pool, v_pool, _ = jax.jit(step, donate_argnums=(0, 1))(k_pool, v_pool, *Server(layer).inputs())
        layers.append((k_pool, v_pool))
    k_new, v_new, slots, q, indptr, indices, last = server.inputs()
    k_pools, v_pools = (jnp.stack([x[i] for x in layers]) for i in (0, 1))
    qs = jnp.stack([q * (i + 1) for i in range(3)])
    decode = lambda q, k, v: paged_attention(q, k, v, indptr, indices, last, max_seq_len=64)
    got = jax.jit(jax.vmap(decode))(qs, k_pools, v_pools)
    for i in range(3):
        np.testing.assert_array_equal(np.asarray(got[i], np.float32),
                                      np.asarray(decode(qs[i], k_pools[i], v_pools[i]), np.float32))
    with pytest.raises(NotImplementedError, match="append_kv cannot be vmapped: it writes its pools in place"):
        jax.vmap(lambda k, v: append_kv(k_new, v_new, slots, k, v))(k_pools, v_pools)


def test_grad_is_refused_clearly(cpu):
    server = Server()
    k_new, v_new, slots, q, indptr, indices, last = server.inputs()
    k_pool, v_pool = append_kv(k_new, v_new, slots, *_pools())
    loss = lambda q: jnp.sum(paged_attention(q, k_pool, v_pool, indptr, indices, last, max_seq_len=8))
    with pytest.raises(NotImplementedError, match="paged_attention has no derivative"):
        jax.grad(loss)(jnp.asarray(q, jnp.float32).astype(jnp.bfloat16))


# --- jax.export of a decode step, reloaded in a fresh process -------------------------------------------------------

RELOAD = textwrap.dedent("""
    import sys, numpy as np, ml_dtypes
    import jax
    saved = np.load(sys.argv[1])
    data = {k: saved[k].view(ml_dtypes.bfloat16) if k in saved["bf16"] else saved[k] for k in saved.files}
    exp = jax.export.deserialize(bytearray(data["blob"].tobytes()))
    assert "jax_aiter._loader" not in sys.modules, "registered before the program ran"
    args = [data[f"arg{i}"] for i in range(int(data["n_args"]))]
    pools = args[:2]
    for n in range(int(data["steps"])):  # the exported step run as a loop, its pools fed back
        k, v, out = exp.call(*pools, *args[2 + 7 * n:9 + 7 * n])
        pools = [k, v]
    for got, name in zip((*pools, out), ("k_pool", "v_pool", "out")):
        np.testing.assert_array_equal(np.asarray(got), data[name])
    print("reloaded and ran", flush=True)
""")


def test_an_exported_decode_step_reloads_in_a_fresh_process(cpu, tmp_path):
    """A decode step with a symbolic number of sequences and pages in the table, exported, then run for three steps
    in an interpreter that never imports jax_aiter (JAX's plugin hook registers the handlers): the same pools and
    outputs bit for bit."""
    scope = export.SymbolicScope()
    n, p = export.symbolic_shape("n, p", scope=scope)
    avals = [jax.ShapeDtypeStruct(POOL, jnp.bfloat16)] * 2 + [
        jax.ShapeDtypeStruct(s, t) for s, t in (((n, KV_HEADS, D), jnp.bfloat16), ((n, KV_HEADS, D), jnp.bfloat16),
                                                ((n,), jnp.int32), ((n, HEADS, D), jnp.bfloat16),
                                                ((n + 1,), jnp.int32), ((p,), jnp.int32), ((n,), jnp.int32))]
    exp = export.export(jax.jit(step), disabled_checks=jax_aiter.disabled_checks(["append_kv", "paged_attn"]))(*avals)
    server = Server(5)
    k_pool, v_pool = _pools()
    saved = {"arg0": np.asarray(k_pool), "arg1": np.asarray(v_pool), "steps": np.array(3)}
    for i in range(3):
        args = server.inputs()
        saved.update({f"arg{2 + 7 * i + j}": np.asarray(a) for j, a in enumerate(args)})
        k_pool, v_pool, out = jax.jit(step)(k_pool, v_pool, *args)
    saved.update(n_args=np.array(2 + 7 * 3), blob=np.frombuffer(bytes(exp.serialize()), np.uint8),
                 k_pool=np.asarray(k_pool), v_pool=np.asarray(v_pool), out=np.asarray(out))
    bf16 = [k for k, a in saved.items() if a.dtype == jnp.bfloat16]  # npz keeps no bfloat16: saved as its bits
    saved = {k: a.view(np.uint16) if k in bf16 else a for k, a in saved.items()}
    np.savez(tmp_path / "step.npz", bf16=np.array(bf16), **saved)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.run([sys.executable, "-c", RELOAD, str(tmp_path / "step.npz")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0 and "reloaded and ran" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-4000:]
