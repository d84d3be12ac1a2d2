"""The sdist declares what its source build needs: ninja, through PEP 517's get_requires_for_build_wheel, which
pip and uv install into the isolated build environment before build_wheel runs the native build there."""
from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ASK = ("import sys; sys.path.insert(0, '.'); from jatools.wheel import build_backend as b; "
       "print(b.get_requires_for_build_wheel(), b.get_requires_for_build_editable())")


def test_an_unbuilt_sdist_asks_for_ninja_and_a_checkout_for_nothing(tmp_path):
    subprocess.run([sys.executable, "-m", "jatools.wheel.wheel_build", "--sdist", "--dist", str(tmp_path)], cwd=ROOT,
                   check=True, capture_output=True)
    (sdist,) = tmp_path.glob("jax_aiter-*.tar.gz")
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp_path, filter="data")
    src = tmp_path / sdist.name.removesuffix(".tar.gz")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    unbuilt = subprocess.run([sys.executable, "-c", ASK], cwd=src, env=env, capture_output=True, text=True, check=True)
    pin = next(r for r in __import__("tomllib").loads((ROOT / "pyproject.toml").read_text())
               ["dependency-groups"]["build"] if r.startswith("ninja"))
    assert unbuilt.stdout.strip() == f"[{pin!r}] []", unbuilt.stdout
    checkout = subprocess.run([sys.executable, "-c", ASK], cwd=ROOT, env=env, capture_output=True, text=True,
                              check=True)
    assert checkout.stdout.strip() == "[] []", checkout.stdout
