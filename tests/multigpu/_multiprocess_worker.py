"""One process of the multi-process case (test_multiprocess.py): 2 processes x 2 CPU devices joined by
jax.distributed.initialize on 127.0.0.1, one 2x2 mesh over all 4 devices, the ops jit-sharded across the
processes (forward and grad); process 0 writes the gathered results.

    python tests/multigpu/_multiprocess_worker.py PROCESS_ID PORT OUT.npz
"""
from __future__ import annotations

import sys

import numpy as np

SHAPES = {"x": (4, 8, 128), "w": (128,), "q": (4, 16, 4, 64), "k": (4, 24, 2, 64), "v": (4, 24, 2, 64)}


def inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(37)
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in SHAPES.items()}


def program():
    """fn(x, w, q, k, v) -> {name: array}: rms_norm and causal GQA attention, forward and gradients."""
    import jax
    import jax.numpy as jnp

    import jax_aiter

    def loss(x, w, q, k, v):
        h = jax_aiter.rms_norm(x, w)
        o = jax_aiter.flash_attn_func(q, k, v, causal=True)
        return jnp.sum(jnp.sin(h)) + jnp.sum(jnp.sin(o))

    def run(x, w, q, k, v):
        grads = jax.grad(loss, argnums=(0, 1, 2, 3, 4))(x, w, q, k, v)
        return {"norm": jax_aiter.rms_norm(x, w), "attn": jax_aiter.flash_attn_func(q, k, v, causal=True),
                **{f"d{n}": g for n, g in zip("xwqkv", grads)}}
    return run


SPECS = {"x": ("data", "model"), "w": (), "q": ("data", None, "model"), "k": ("data", None, "model"),
         "v": ("data", None, "model")}


def main(process_id: int, port: int, out: str) -> None:
    import jax

    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=process_id,
                               initialization_timeout=120)
    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    assert jax.process_count() == 2 and jax.device_count() == 4 and jax.local_device_count() == 2
    mesh = jax.make_mesh((2, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    host = inputs()
    args = [jax.make_array_from_callback(host[n].shape, NamedSharding(mesh, P(*SPECS[n])), lambda i, a=host[n]: a[i])
            for n in SHAPES]
    results = jax.jit(program())(*args)
    gathered = {name: np.asarray(multihost_utils.process_allgather(r, tiled=True)) for name, r in results.items()}
    shardings = {name: str(r.sharding.spec) for name, r in results.items()}
    if process_id == 0:
        np.savez(out, **gathered, shardings=np.array(repr(shardings)))
    jax.distributed.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
