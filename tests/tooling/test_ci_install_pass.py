"""CI's install pass installs the JAX GPU plugin (issue 40).

ci/build.py runs each session twice: `nox -s S --install-only`, then `nox -R -s S`. In the first pass
session.run does nothing and in the second session.install does nothing, so a plugin chosen by a command's
output must be chosen with session.run_install. Here the real noxfile runs CI's own install command of a GPU
build (from the registry, unedited but for the venv folder) against stand-in plugin wheels: small real wheels
named and versioned like the plugin (with a +standin local version, so they win over an index's) in a
--find-links folder. Everything else installs as usual (uv, its cache, the index)."""
from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from jatools.testing import tiers
from tests.tooling.test_ci_build import ROOT, ci_build


def _wheel(folder: Path, dist: str, version: str) -> Path:
    """A minimal, valid py3-none-any wheel of `dist` (METADATA, WHEEL, RECORD and one module)."""
    name = dist.replace("-", "_")
    info = f"{name}-{version}.dist-info"
    files = {f"{name}_standin.py": "STANDIN = True\n",
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{p},sha256="
                     f"{base64.urlsafe_b64encode(hashlib.sha256(t.encode()).digest()).rstrip(b'=').decode()},"
                     f"{len(t.encode())}\n" for p, t in files.items()) + f"{info}/RECORD,,\n"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for p, t in {**files, f"{info}/RECORD": record}.items():
            z.writestr(p, t)
    return path


def _install_command(build: str, session: str) -> list[str]:
    """CI's own install-pass command of `session` in `build`: `env K=V ... nox -s S --install-only [-- ARGS]`."""
    cmds = [c for c in ci_build.get_build(build).commands()
            if "--install-only" in c and c[c.index("-s") + 1] == session]
    assert len(cmds) == 1, cmds
    return cmds[0]


@pytest.mark.parametrize(("build", "session", "backend"), [
    ("pr_gpu_rocm_mi355", "tests", "rocm"),  # (the CUDA lane's GPU jobs install the plugin into the lane's venv)
    ("nightly_cuda_h200_bench", "bench", "cuda"),
    ("weekly_convergence", "convergence", "rocm"),
])
def test_the_install_pass_of_a_gpu_build_installs_the_plugin(build, session, backend, tmp_path):
    if not shutil.which("nox") or not shutil.which("uv"):
        pytest.fail("nox and uv must be on PATH (the tooling group installs them): this test runs CI's nox pass")
    wanted = tiers.plugin_requirements(backend)
    assert wanted, f"no plugin configured for {backend}"
    index = tmp_path / "index"
    index.mkdir()
    for req in wanted:
        dist, version = req.split("==")
        _wheel(index, dist, f"{version}+standin")
    cmd = _install_command(build, session)
    assert cmd[0] == "env" and f"JA_BACKEND={backend}" in cmd
    envdir = tmp_path / "envs"
    at = cmd.index("nox")
    argv = [*cmd[1:at], "nox", "-f", str(ROOT / "noxfile.py"), "--envdir", str(envdir), *cmd[at + 1:]]
    env = {**os.environ, "UV_FIND_LINKS": str(index), "PIP_FIND_LINKS": str(index), "CI": "true"}
    env.pop("VIRTUAL_ENV", None)
    r = subprocess.run(["env", *argv], check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    # The one venv of the pass: named after the session, or hashed by nox when the path would be too long.
    py = next(envdir.glob("*/bin/python"), None)
    assert py, f"the install pass made no {session} venv in {envdir}:\n{r.stdout[-3000:]}{r.stderr[-3000:]}"
    show = subprocess.run([str(py), "-c", ("import importlib.metadata as m, sys; "
                                           "print(' '.join(m.version(d) for d in sys.argv[1:]))"),
                           *(r.split("==")[0] for r in wanted)], check=False, capture_output=True, text=True)
    assert show.returncode == 0, f"the install pass left the plugin out of {py}: {show.stderr[-800:]}"
    assert show.stdout.split() == [f"{r.split('==')[1]}+standin" for r in wanted]
