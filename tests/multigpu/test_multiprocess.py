"""Multi-process: 2 processes x 2 CPU devices joined by jax.distributed.initialize (JAX's own
coordination service on 127.0.0.1, a free port; cross-process collectives through gloo), the ops
jit-sharded over one 2x2 mesh of all 4 devices. The forward and the gradients equal the
single-process result, and the results keep the inputs' sharding. The worker is
_multiprocess_worker.py; the processes run on the CPU whatever the host has."""
from __future__ import annotations

import ast
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _mesh_cases import assert_close
from _multiprocess_worker import SHAPES, SPECS, inputs, program

WORKER = Path(__file__).with_name("_multiprocess_worker.py")
ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.multigpu(devices=1)
def test_two_processes_equal_one(tmp_path):
    import jax

    out = tmp_path / "results.npz"
    # the checkout first on the path, so an uninstalled checkout's jax_aiter is the one the workers import
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
           "PYTHONPATH": path}
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(i), str(port), str(out)], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=300)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("a worker did not finish within 300 s:\n"
                        + "\n".join(q.communicate()[0][-3000:] for q in procs))
    assert all(p.returncode == 0 for p in procs), "\n---\n".join(log[-4000:] for log in logs)

    got = np.load(out)
    host = inputs()
    want = jax.jit(program())(*(host[n] for n in SHAPES))
    for name, w in want.items():
        assert_close(got[name], w, np.float32, f"2 processes vs 1: {name}")
    shardings = ast.literal_eval(str(got["shardings"]))
    spec_of = {"norm": "x", "attn": "q", **{f"d{n}": n for n in SHAPES}}
    for name, arg in spec_of.items():
        want_spec = str(jax.sharding.PartitionSpec(*SPECS[arg]))
        assert shardings[name] == want_spec, f"{name}: sharding {shardings[name]}, expected {want_spec}"
