"""Every install command README.md and docs/ give for the lanes, run as written with pip and with uv, each in a fresh
venv, against the store's index served on 127.0.0.1 (issue 84, goal 1).

The commands are read from the documents, not copied here: every `pip install ...` / `uv pip install ...` that
installs jax-aiter from the store (`<store>`, `<host>`) or from a release's assets page (GitHub's
`expanded_assets/<tag>`), in a fenced block or an inline code span. Each runs in both forms (a documented
`pip install ARGS` also as `uv pip install ARGS`, and the other way round: the README says the arguments are the
same), as a user runs it in an activated venv: `pip` is the venv's (`python -m venv`), `uv pip install` installs
into VIRTUAL_ENV (`uv venv`). The placeholders become the served store; PyPI becomes a second server on 127.0.0.1
holding the checkout's wheelhouse (jax, jaxlib, numpy and what they need, `invoke wheelhouse`) and, as PyPI does,
the jax-aiter sdist (a stand-in whose build stops at once: an install that falls back to it fails fast). The lane
wheels are stand-ins with the project's real dependencies (tests/release/standins.py).

What each must install: the pinned version when the command pins one, else the full wheel of the lane whose index
root it names; JAX and numpy must import from the venv. The README's table is also read as "host -> command": the
NVIDIA row must be one of those commands and install the cuda13 lane, the AMD row the rocm7 lane.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name, parse_wheel_filename

from jatools import config, release_index
from jatools.ci.local_store import LocalStore
from jatools.validate import cleanroom_env, wheelhouse
from tests.release.standins import LANES, published, stand_in_sdist, stand_in_wheel

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
ASSETS = re.compile(r"https://github\.com/[\w-]+/jax-aiter/releases/expanded_assets/([\w.+-]+)")
PLACEHOLDER = re.compile(r"(?:https?://)?<(?:store|host)>")
TAG = "v0.1.0"


def documented_commands() -> dict[str, list[str]]:
    """{the arguments after `pip install`: [where each was found]} of every documented lane install."""
    found: dict[str, list[str]] = {}
    for doc in DOCS:
        text = doc.read_text()
        blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
        lines = [ln.split(" #")[0] for b in blocks for ln in b.splitlines()]
        spans = [" ".join(s.split()) for s in re.findall(r"`([^`]+)`", re.sub(r"^```.*?^```", "", text,
                                                                               flags=re.MULTILINE | re.DOTALL))]
        for cmd in (*lines, *spans):
            m = re.match(r"\s*(?:uv )?pip install (.*\bjax-aiter\b.*)$", cmd)
            if m and (PLACEHOLDER.search(m.group(1)) or ASSETS.search(m.group(1))):  # <host> is a store too
                args = " ".join(PLACEHOLDER.sub("https://<store>", m.group(1)).split())
                found.setdefault(args, []).append(doc.relative_to(ROOT).as_posix())
    return found


COMMANDS = documented_commands()


def expected(args: list[str]) -> str:
    """The version the command must install: its pin, else the full wheel of the lane root it names."""
    spec = next(a for a in args if a.startswith("jax-aiter"))
    if "==" in spec:
        return spec.split("==")[1]
    lane = next(m.group(1) for a in args if (m := re.search(r"/([\w.]+)/simple/?$", a)))
    return f"0.1.0+{lane}.full"


@pytest.fixture(scope="session")
def indexes(tmp_path_factory):
    """(the store's URL, the PyPI stand-in's URL): the lanes' stand-ins published under v0.1.0 and indexed per lane;
    the wheelhouse's wheels and the sdist as a simple index."""
    python = cleanroom_env.find_python(config.python_version(ROOT))
    house = wheelhouse.location(ROOT)
    try:
        wheelhouse.ensure(house, wheelhouse.requirements(ROOT), python, allow_fill=True,
                          log=lambda m: print(m, file=sys.stderr))
    except wheelhouse.WheelhouseError as e:
        pytest.skip(f"the wheelhouse is cold and cannot be filled here (no package index?): {e}")
    work = tmp_path_factory.mktemp("install-commands")
    deps = tuple(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"])
    store = work / "store"
    release_index.add(store, TAG, published(*[stand_in_wheel(work / "made", v, deps) for v in LANES]))
    pypi = work / "pypi"
    (pypi / "files").mkdir(parents=True)
    projects: dict[str, list[dict]] = {}
    for f in [*sorted(house.glob("*.whl")), stand_in_sdist(work / "sdist")]:
        shutil.copyfile(f, pypi / "files" / f.name)
        name, version = (parse_wheel_filename(f.name)[:2] if f.name.endswith(".whl")
                         else ("jax-aiter", "0.1.0"))
        entry = published(f)[0]
        projects.setdefault(canonicalize_name(name), []).append({
            "filename": f.name, "url": f"../../files/{f.name}", "sha256": entry.sha256, "size": entry.size,
            "version": str(version), "requires-python": None})
    release_index.write_root(pypi / "simple", projects)
    (work / "cache").mkdir()
    with LocalStore(store) as served, LocalStore(pypi) as mirror:
        yield served.url, mirror.url, work / "cache"


def concrete(args: str, store: str) -> list[str]:
    """The documented arguments with the store and the release's assets page served here."""
    text = ASSETS.sub(lambda m: f"{store}/{m.group(1)}/", PLACEHOLDER.sub(store, args))
    return shlex.split(text)


def user_env(tmp: Path, pypi: str, venv: Path, cache: Path) -> dict[str, str]:
    """A user's shell in an activated venv, with PyPI at `pypi`: nothing of this test run's own settings (the
    installers' caches, shared by the tests, only save downloads)."""
    uv = cleanroom_env.find_uv()
    return {"PATH": os.pathsep.join([str(venv / "bin"), *([str(uv.parent)] if uv else []), "/usr/bin", "/bin"]),
            "HOME": str(tmp / "home"), "VIRTUAL_ENV": str(venv), "PIP_INDEX_URL": f"{pypi}/simple",
            "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1",
            "PIP_NO_COMPILE": "1",  # pip's bytecode pass over JAX takes a minute here; uv skips it by default
            "PIP_CACHE_DIR": str(cache / "pip"), "UV_DEFAULT_INDEX": f"{pypi}/simple", "UV_NO_CONFIG": "1",
            "UV_CACHE_DIR": str(cache / "uv"), "UV_PYTHON_DOWNLOADS": "never", "LANG": "C.UTF-8"}


def install(installer: str, args: list[str], tmp: Path, indexes: tuple) -> tuple[subprocess.CompletedProcess, Path]:
    """A fresh venv (`python -m venv` for pip, `uv venv` for uv), then the command as a user types it in it."""
    python = cleanroom_env.find_python(config.python_version(ROOT))
    venv = tmp / "venv"
    (tmp / "home").mkdir(parents=True)
    env = user_env(tmp, indexes[1], venv, indexes[2])
    if installer == "pip":
        made = [str(python), "-m", "venv", str(venv)]
    else:
        uv = cleanroom_env.find_uv()
        if uv is None:
            pytest.skip("uv is not installed (it is in the test dependency group: pip install --group test)")
        made = [str(uv), "venv", "-q", "--python", str(python), str(venv)]
    subprocess.run(made, env=env, check=True, capture_output=True, timeout=300)
    cmd = ["pip", "install", *args] if installer == "pip" else ["uv", "pip", "install", *args]
    out = subprocess.run(cmd, env=env, cwd=tmp, capture_output=True, text=True, timeout=600, check=False)
    print(f"$ {shlex.join(cmd)}\n{out.stdout[-4000:]}{out.stderr[-4000:]}")
    return out, venv


def imported(venv: Path) -> dict:
    probe = ("import json, jax, numpy, jax_aiter; print(json.dumps({'lane': jax_aiter.LANE, 'jax': jax.__version__, "
             "'numpy': numpy.__version__, 'where': jax_aiter.__file__}))")
    out = subprocess.run([str(venv / "bin/python"), "-c", probe], capture_output=True, text=True, timeout=300,
                         check=False, cwd=venv)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_documents_give_the_lane_installs():
    """The extraction finds what the README and docs/wheels.md document (so a test below runs each)."""
    assert any("README.md" in w for w in COMMANDS.values()) and any("docs/wheels.md" in w for w in COMMANDS.values())
    assert {expected(shlex.split(a)) for a in COMMANDS} >= {"0.1.0+cuda13.full", "0.1.0+rocm7.full", "0.1.0+cuda13"}
    assert not [a for a in COMMANDS if re.search(r"--index-url\b", a)], "--index-url hides PyPI: jax and numpy"


@pytest.mark.parametrize("installer", ["pip", "uv"])
@pytest.mark.parametrize("args", sorted(COMMANDS))
def test_every_documented_install_command_works_verbatim(indexes, tmp_path, args, installer):
    out, venv = install(installer, concrete(args, indexes[0]), tmp_path, indexes)
    assert out.returncode == 0, f"{installer} install {args} (from {', '.join(COMMANDS[args])}) failed"
    got = imported(venv)
    want = expected(shlex.split(args))
    assert got["lane"] == want.split("+")[1], f"{args}: installed {got['lane']}, the command asks for {want}"
    assert Path(got["where"]).is_relative_to(venv), got


README_ROWS = re.compile(r"^\| (NVIDIA|AMD)[^|]*\| `((?:uv )?pip install [^`]+)` \|$", re.MULTILINE)


def test_a_user_who_follows_the_readme_gets_their_gpus_lane():
    """The README's table, read as host -> command: the NVIDIA row is a documented command (so the test above runs
    it with pip and uv) that installs the cuda13 lane's full wheel, and the AMD row the rocm7 lane's."""
    rows = dict(README_ROWS.findall((ROOT / "README.md").read_text()))
    assert set(rows) == {"NVIDIA", "AMD"}, rows
    for gpus, lane in (("NVIDIA", "cuda13"), ("AMD", "rocm7")):
        args = " ".join(PLACEHOLDER.sub("https://<store>", rows[gpus].split(" install ", 1)[1]).split())
        assert args in COMMANDS and "README.md" in COMMANDS[args], (gpus, args)
        assert expected(shlex.split(args)) == f"0.1.0+{lane}.full", f"the README's {gpus} row installs another lane"
