"""The producer-decision matrix: CI's producer runs when the store has no release of the checkout's cache id.

A scratch checkout's libraries are published to a store (a folder, as the release store is laid out); then each
input of the JIT cache id is changed, one at a time and committed, and `jit.decide` (what jit-libs.yml's plan
jobs run, against JA_FETCH_BASE_URL) is asked in a fresh process running the checkout's own code. Every input
must make it rebuild; what is no input (docs, tests, build code that writes the same command lines: docs/jit-libs.md
says why those need no new cache id) must reuse. The matrix is printed (pytest -s shows it).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.tooling.jit_libs_support import (
    REPO,
    git,
    hermetic_environ,
    make_checkout,
    make_release,
)

DECIDE = ("import json, sys; from jatools import config; from jatools.jitlibs import decide; "
          "d = decide.run_decide(config.load(), base_url=sys.argv[1], log=lambda m: None); "
          "print(json.dumps({'decision': d.decision, 'cache_id': d.cache_id, 'wanted': d.wanted}))")


def _edit(rel: str, change: Callable[[str], str]) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        path = root / rel
        new = change(path.read_text())
        assert new != path.read_text(), f"the {rel} edit changed nothing"
        path.write_text(new)
    return apply


def _append(rel: str, line: str) -> Callable[[Path], None]:
    return _edit(rel, lambda text: text + line)


def _json(rel: str, change: Callable[[dict], None]) -> Callable[[Path], None]:
    def edit(text: str) -> str:
        data = json.loads(text)
        change(data)
        return json.dumps(data, indent=2)
    return _edit(rel, edit)


def _extra_flag(cfg: dict) -> None:
    cfg["modules"]["rmsnorm_fwd"]["extra_flags"]["cxx"].append("-DJA_DECISION_MATRIX=1")


def _fewer_instances(cfg: dict) -> None:
    cfg["modules"]["rmsnorm_fwd"]["axes"]["dtype"].remove("f16")


# (backend, what changed, the edit, the decision wanted)
MATRIX = [
    ("cpu", "nothing", None, "reuse"),
    ("cpu", "a doc (docs/build.md)", _append("docs/build.md", "\nmore prose\n"), "reuse"),
    ("cpu", "a test (tests/ops/test_rmsnorm.py)", _append("tests/ops/test_rmsnorm.py", "\n# a comment\n"), "reuse"),
    ("cpu", "build code writing the same commands (jit_build.py comment)",
     _append("jatools/native/jit_build.py", "\n# a comment\n"), "reuse"),
    ("cpu", "the build_jit.py alias", _append("jax_aiter/jit/build_jit.py", "\n# a comment\n"), "reuse"),
    ("cpu", "a kernel header (csrc/kernels/rmsnorm/rmsnorm_cpu.h)",
     _append("csrc/kernels/rmsnorm/rmsnorm_cpu.h", "\n// a comment\n"), "rebuild"),
    ("cpu", "an instance template (cpu/fwd.inst.in)",
     _append("csrc/kernels/mha/cpu/fwd.inst.in", "\n// a comment\n"), "rebuild"),
    ("cpu", "a module's compile flags (optCompilerConfig.json)",
     _json("jax_aiter/jit/optCompilerConfig.json", _extra_flag), "rebuild"),
    ("cpu", "a module's instance axes (optCompilerConfig.json)",
     _json("jax_aiter/jit/optCompilerConfig.json", _fewer_instances), "rebuild"),
    ("cpu", "the FFI headers (third_party/xla_ffi)",
     _append("third_party/xla_ffi/include/xla/ffi/api/c_api.h", "\n// a comment\n"), "rebuild"),
    ("cpu", "the flags the build code writes (toolchain.py -O3 -> -O2)",
     _edit("jatools/native/toolchain.py", lambda t: t.replace('"-O3"', '"-O2"', 1)), "rebuild"),
    ("cpu", "the cache-id function (jax_aiter/download/reuse_gate.py)",
     _edit("jax_aiter/download/reuse_gate.py", lambda t: t.replace("json.dumps(gated, sort_keys=True).encode()",
                                                          "(json.dumps(gated, sort_keys=True) + ' v2').encode()")),
     "rebuild"),
    ("cuda", "nothing", None, "reuse"),
    ("cuda", "the CUDA archs (pyproject gpu_archs_cuda, which ci/build.py's GPU_ARCHS reads)",
     _edit("pyproject.toml", lambda t: re.sub(r'gpu_archs_cuda = "([^"]*)"', r'gpu_archs_cuda = "\1;sm_89"', t)),
     "rebuild"),
    ("cuda", "the pinned CUTLASS headers (pyproject nvidia-cutlass==)",
     _edit("pyproject.toml", lambda t: t.replace("nvidia-cutlass==4.2.0", "nvidia-cutlass==4.2.1")), "rebuild"),
    ("cuda", "an sm_90a template (sm90/fwd.inst.in)",
     _append("csrc/kernels/mha/sm90/fwd.inst.in", "\n// a comment\n"), "rebuild"),
]


def decide(root: Path, store: Path, backend: str) -> dict:
    env = {**hermetic_environ(), "PYTHONPATH": str(root), "JA_ROOT_DIR": str(root), "JA_BACKEND": backend}
    env.pop("GPU_ARCHS", None)  # CI's builds set it from pyproject (ci/build.py): unset reads the same default
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if "nvidia-smi" not in p)
    out = subprocess.run([sys.executable, "-c", DECIDE, store.as_uri()], cwd=root, env=env, capture_output=True,
                         text=True, check=False, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> tuple[Path, Path, dict[str, str]]:
    """A checkout (with the runtime package too: the cache-id function lives there) whose CPU and CUDA libraries
    are published in a store; (checkout, store, {backend: published cache id})."""
    root = make_checkout(tmp_path_factory.mktemp("checkout"))
    shutil.copytree(REPO / "jax_aiter", root / "jax_aiter", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__", "_lib"))
    git(root, "add", "-A")
    git(root, "commit", "-qm", "the runtime package")
    store = tmp_path_factory.mktemp("store")
    ids = {}
    for backend in ("cpu", "cuda"):  # without nvcc the CUDA identity comes from JA_BACKEND and the default archs
        first = decide(root, store, backend)
        assert first["decision"] == "rebuild", "an empty store has a release"
        ids[backend] = make_release(store, first["wanted"])["identity"]["cache_id"]
    return root, store, ids


@pytest.mark.parametrize(("backend", "what", "edit", "want"), MATRIX, ids=[f"{b}: {w}" for b, w, _, _ in MATRIX])
def test_the_producer_runs_exactly_when_an_input_of_the_cache_id_changed(published, backend, what, edit, want):
    root, store, ids = published
    base = {"cache_id": ids[backend]}
    if edit:
        edit(root)
        git(root, "commit", "-qam", f"change {what}")
    try:
        got = decide(root, store, backend)
    finally:
        if edit:
            git(root, "reset", "-q", "--hard", "HEAD~1")
    print(f"producer decision | {backend:<4} | {what:<80} | {got['decision']:<7} | cache id {got['cache_id']}")
    assert got["decision"] == want, f"changing {what}: {got['decision']} (cache id {got['cache_id']})"
    assert (got["cache_id"] != base["cache_id"]) == (want == "rebuild")
