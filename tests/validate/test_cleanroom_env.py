"""The room: outside the checkout, an allow-listed environment, a real interpreter, the installer choice."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from jatools.validate import cleanroom_env as cenv
from tests.validate.conftest import REPO

LEAKY = {"PYTHONPATH": str(REPO), "JA_ROOT_DIR": str(REPO), "JAX_AITER_LIB_DIR": str(REPO / "build"),
         "LD_LIBRARY_PATH": str(REPO / "build/jax_aiter_build"), "PIP_FIND_LINKS": "/opt/wheels",
         "PIP_INDEX_URL": "https://example.invalid/simple", "UV_INDEX_URL": "https://example.invalid/simple",
         "VIRTUAL_ENV": "/somewhere", "PYTHONHOME": "/usr", "XDG_CACHE_HOME": "/root/.cache"}


def test_nothing_of_the_developer_environment_leaks(tmp_path):
    room = cenv.Room.create(REPO, tmp_path)
    env = cenv.clean_env(room, cenv.Installer("pip"), {**LEAKY, "CUDA_VISIBLE_DEVICES": "1", "HOME": "/root"})
    for name, value in LEAKY.items():
        assert env.get(name) != value, f"{name} leaked into the clean room"
    assert env["HOME"] == str(room.home) and env["XDG_CACHE_HOME"] == str(room.cache)
    assert env["CUDA_VISIBLE_DEVICES"] == "1", "GPU selection must pass through"
    assert env["PIP_CONFIG_FILE"] == os.devnull and env["PIP_NO_INDEX"] == "1"
    assert env["PATH"].split(":")[0] == str(room.venv / "bin")
    assert not any(str(REPO) in v for v in env.values())


def test_an_index_cannot_be_reached_from_the_room(tmp_path):
    """pip in the room finds no index; told to use one anyway (PIP_NO_INDEX gone), the dead proxy stops it."""
    room = cenv.Room.create(REPO, tmp_path)
    env = cenv.clean_env(room, cenv.Installer("pip"))
    # The base interpreter's pip: a uv-made test venv (nox's default backend) has none of its own.
    python = cenv.find_python(f"{sys.version_info[0]}.{sys.version_info[1]}")
    cmd = [str(python), "-m", "pip", "download", "--no-deps", "-d", str(room.tmp), "--index-url",
           "https://pypi.org/simple", "--retries", "1", "--timeout", "5", "six"]
    for e, says in ((env, "from versions: none"), ({k: v for k, v in env.items() if k != "PIP_NO_INDEX"}, "Proxy")):
        out = subprocess.run(cmd, env=e, cwd=room.work, check=False, capture_output=True, text=True, timeout=120)
        assert out.returncode != 0 and says in out.stdout + out.stderr, out.stdout + out.stderr
    assert not list(room.tmp.iterdir()), "nothing may be downloaded"


def test_the_room_is_outside_the_checkout(tmp_path):
    room = cenv.Room.create(REPO, tmp_path)
    assert not cenv.inside(room.root, REPO) and room.work.is_dir() and room.smoke.is_dir()
    with pytest.raises(cenv.CleanRoomError, match="inside the checkout"):
        cenv.Room.create(REPO, REPO / "build")
    cenv.remove(room)
    assert not room.root.exists(), "a one-off room is deleted"


def test_find_python(tmp_path, python312):
    assert cenv.find_python("3.12", env={"JA_VALIDATE_PYTHON": "/opt/py"}) == Path("/opt/py")
    out = subprocess.run([str(python312), "-c", "import sys; print(sys.version_info[:2])"], check=False,
                         capture_output=True, text=True)
    assert out.stdout.strip() == "(3, 12)"
    with pytest.raises(cenv.CleanRoomError, match="JA_VALIDATE_PYTHON"):
        cenv.find_python("2.1", env={"PYENV_ROOT": str(tmp_path)})


def test_installer_choice(tmp_path):
    assert cenv.choose_installer("pip", None) == cenv.Installer("pip")
    with pytest.raises(cenv.CleanRoomError, match="unknown installer"):
        cenv.choose_installer("conda", None)
    inst = cenv.choose_installer("auto", tmp_path)
    if cenv.find_uv() is None:
        assert inst.kind == "pip"
        with pytest.raises(cenv.CleanRoomError, match="uv is not installed"):
            cenv.choose_installer("uv", None)
    else:
        assert inst.kind == "uv" and inst.env()["UV_CACHE_DIR"] == str(tmp_path)
        assert "--offline" in inst.install("/v", "/wh", ["x"]) and "--no-index" in inst.install("/v", "/wh", ["x"])


def test_reusable_rooms_and_the_bytecode_they_keep(tmp_path):
    """A fixed slot per concurrent validation; only the dependencies' bytecode survives into the next room."""
    a = cenv.Room.create(REPO, tmp_path, reusable=True)
    b = cenv.Room.create(REPO, tmp_path, reusable=True)
    assert a.root != b.root and a.root.parent == b.root.parent, "a held slot is not handed out twice"
    prefix = tmp_path / "pycache"
    site = prefix / a.root.relative_to("/") / "venv/lib/python3.12/site-packages"
    for rel in ("jax/__pycache__/core.cpython-312.pyc", "jax_aiter/__pycache__/_loader.cpython-312.pyc",
                "jax_aiter/ops/__pycache__/rmsnorm.cpython-312.pyc"):
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(b"pyc")
    (prefix / a.root.relative_to("/") / "smoke/__pycache__").mkdir(parents=True)
    cenv.remove(a)
    (a.venv / "stale").mkdir(parents=True)
    again = cenv.Room.create(REPO, tmp_path, reusable=True)
    assert again.root == a.root and not again.venv.exists(), "a claimed slot starts empty"
    cenv.bytecode_cache(prefix, again)
    assert (site / "jax/__pycache__/core.cpython-312.pyc").is_file()
    assert not (site / "jax_aiter").exists(), "the wheel under test must always be compiled afresh"
    assert not (prefix / a.root.relative_to("/") / "smoke").exists()
    for r in (b, again):
        cenv.remove(r)
