"""The standard front-ends and clients, offline, with real tools (issue 29).

`python -m build`, `pip wheel .` and `uv build` go through the in-tree PEP 517 backend
and must make the bytes `nox -s wheel_lite|wheel_full` makes; `pip install [-e] .` and
`uv pip install [-e] .` install into fresh venvs that then run an op; twine,
check-wheel-contents and `wheel unpack`/`pack` accept the wheels and the sdist; the
sdist holds what a rebuild needs and rebuilds into a wheel that passes every check.
The build isolation and the installs read only the checkout's wheelhouse
(`invoke wheelhouse`, filled once from the index when cold).
"""
from __future__ import annotations

import email.parser
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest
from conftest import EPOCH, ROOT, copy_build, cpu_env
from packaging.metadata import Metadata
from wheel_plant import rewrite_wheel

from jatools import config
from jatools.validate import cleanroom_env, wheelhouse
from jatools.wheel import build_backend, wheel_clients, wheel_contents, wheel_floor
from jatools.wheel import sdist as sdist_module

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
RUN_OP = ("import jax.numpy as jnp, jax_aiter, json; y = jax_aiter.silu_and_mul(jnp.ones((2, 8), jnp.float32)); "
          "print(json.dumps({'sum': float(y.sum()), 'file': jax_aiter.__file__}))")
SILU_1_SUM = 8 * 0.7310585786  # silu(1) * 1 over the 2 x 4 output


@pytest.fixture(scope="session")
def build_wheelhouse() -> Path:
    """The checkout's wheelhouse with the build backend's requirements too (filled once, then offline)."""
    python = cleanroom_env.find_python(config.python_version(ROOT))
    path = wheelhouse.location(ROOT)
    try:
        wheelhouse.ensure(path, wheelhouse.requirements(ROOT, build=True), python, allow_fill=True,
                          log=lambda m: print(m, file=sys.stderr))
    except wheelhouse.WheelhouseError as e:
        pytest.skip(f"the wheelhouse is cold and cannot be filled here (no package index?): {e}")
    return path


@pytest.fixture(scope="session")
def fe_build(native_build, tmp_path_factory) -> Path:
    """A private copy of the CPU test build for the front-ends: they stage wheels in its wheel_stage/, never in
    the one the other wheel tests (other xdist workers) stage in."""
    return copy_build(native_build, tmp_path_factory.mktemp("frontends") / "build").build_dir


def offline_env(wh: Path, build_dir: Path | None = None, **extra: str) -> dict[str, str]:
    """A CPU build (absolute, so also found from an unpacked sdist), a fixed SOURCE_DATE_EPOCH, and pip / uv
    told to read nothing but the wheelhouse."""
    env = cpu_env(build_dir) if build_dir else cpu_env()
    env.update(SOURCE_DATE_EPOCH=str(EPOCH), PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wh), PIP_CONFIG_FILE=os.devnull,
               PIP_DISABLE_PIP_VERSION_CHECK="1", UV_OFFLINE="1", UV_NO_INDEX="1", UV_FIND_LINKS=str(wh),
               UV_NO_CONFIG="1", UV_PYTHON_DOWNLOADS="never", UV_CACHE_DIR=str(wh / ".uv-cache"), **extra)
    return env


def run(cmd: list[str], env: dict[str, str], cwd: Path = ROOT, timeout: int = 900) -> str:
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False, timeout=timeout)
    assert out.returncode == 0, f"{' '.join(cmd)} failed (exit {out.returncode}):\n{out.stdout[-3000:]}\n" \
                                f"{out.stderr[-3000:]}"
    return out.stdout + out.stderr


def uv() -> str:
    found = cleanroom_env.find_uv()
    if found is None:
        pytest.skip("uv is not installed (it is in the test dependency group: pip install --group test)")
    return str(found)


def only_wheel(folder: Path) -> Path:
    found = sorted(folder.glob("*.whl"))
    assert len(found) == 1, f"expected one wheel in {folder}, found {[p.name for p in found]}"
    return found[0]


@pytest.fixture(scope="session")
def nox_wheels(fe_build, build_wheelhouse, tmp_path_factory) -> dict[str, Path]:
    """What `nox -s wheel_lite|wheel_full` run (python -m jatools.wheel.wheel_build), with the test epoch."""
    env = offline_env(build_wheelhouse, fe_build)
    out = {}
    for variant in ("lite", "full"):
        dist = tmp_path_factory.mktemp(f"nox-{variant}")
        run([sys.executable, "-m", "jatools.wheel.wheel_build", "--variant", variant, "--dist", str(dist)], env)
        out[variant] = only_wheel(dist)
    return out


@pytest.fixture(scope="session")
def sdist(build_wheelhouse, tmp_path_factory) -> Path:
    """`python -m build --sdist` in an isolated environment from the wheelhouse."""
    dist = tmp_path_factory.mktemp("sdist")
    run([sys.executable, "-m", "build", "--sdist", "--outdir", str(dist), "."], offline_env(build_wheelhouse))
    found = sorted(dist.glob("*.tar.gz"))
    assert [p.name for p in found] == [f"jax_aiter-{PYPROJECT['project']['version']}.tar.gz"]
    return found[0]


# --- metadata --------------------------------------------------------------------------------------------

def test_metadata_follows_the_core_metadata_spec(wheels):
    for result in wheels.values():
        with zipfile.ZipFile(result.wheel) as zf:
            dist_info = f"jax_aiter-{result.version}.dist-info"
            raw = zf.read(f"{dist_info}/METADATA")
            assert zf.read(f"{dist_info}/licenses/LICENSE") == (ROOT / "LICENSE").read_bytes()
        fields = list(email.parser.BytesParser().parsebytes(raw).keys())
        assert fields[0] == "Metadata-Version" and {"Name", "Version", "Requires-Python", "License-Expression",
                                                     "License-File", "Project-URL", "Classifier"} <= set(fields)
        assert all(f[0].isupper() for f in fields), f"non-canonical field names: {fields}"
        meta = Metadata.from_email(raw, validate=True)
        assert str(meta.metadata_version) == "2.4"  # License-Expression / License-File are 2.4 fields
        assert meta.license_expression == "MIT" and meta.license_files == ["LICENSE"]
        assert str(meta.requires_python) == ">=3.12"
        assert meta.provides_extra == ["fetch"], "development dependencies must not be extras"
        assert not any("extra == \"test\"" in str(r) for r in meta.requires_dist)
        assert meta.project_urls["Homepage"].startswith("https://") and meta.classifiers
        assert meta.description_content_type == "text/markdown"


def test_dev_dependencies_are_groups_and_the_wheel_group_is_the_backends_requires():
    groups = PYPROJECT["dependency-groups"]
    assert {"test", "tooling", "wheel", "clients"} <= set(groups)
    assert set(PYPROJECT["project"]["optional-dependencies"]) == {"fetch"}
    assert groups["wheel"] == PYPROJECT["build-system"]["requires"], \
        "the `wheel` dependency group and [build-system].requires must name the same packages"
    assert PYPROJECT["build-system"]["build-backend"] == "jatools.wheel.build_backend"
    assert PYPROJECT["build-system"]["backend-path"] == ["."]


# --- front-ends: the same bytes as the nox sessions --------------------------------------------------------

FRONTS = {
    "python -m build": lambda out, cs: [sys.executable, "-m", "build", "--wheel", "--outdir", str(out), *cs, "."],
    "pip wheel": lambda out, cs: [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out),
                                  *[c.replace("-C", "--config-settings") for c in cs], "."],
    "uv build": lambda out, cs: [uv(), "build", "--wheel", "-q", "--python", sys.executable, "-o", str(out), *cs],
    # Plain `python -m build`: the sdist, then the wheel from it in a temporary folder (libraries: JA_BUILD_DIR).
    "python -m build (sdist, then wheel)": lambda out, cs: [sys.executable, "-m", "build", "--outdir", str(out), *cs,
                                                           "."],
}


@pytest.mark.parametrize("front", [pytest.param(f, marks=[pytest.mark.packaging] if f != "python -m build" else [])
                                   for f in FRONTS])
def test_frontends_build_the_nox_sessions_bytes(front, nox_wheels, fe_build, build_wheelhouse, tmp_path):
    """Each front-end (isolated, offline) makes byte-identical wheels to the nox sessions', both variants."""
    env = offline_env(build_wheelhouse, fe_build)
    for variant, reference in nox_wheels.items():
        out = tmp_path / variant
        run(FRONTS[front](out, ["-C", "variant=full"] if variant == "full" else []), env)
        got = only_wheel(out)
        assert got.name == reference.name, f"{front} ({variant})"
        assert got.read_bytes() == reference.read_bytes(), f"{front} -C variant={variant} differs from nox's"


def test_backend_hooks_refuse_an_unknown_setting_and_missing_libraries(native_build, tmp_path, monkeypatch):
    """The PEP 517 hooks, called as a front-end calls them (in the source tree): clear errors, no wheel."""
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit, match=r"unknown config setting\(s\) flavour; known: variant"):
        build_backend.build_wheel(str(tmp_path), {"flavour": "full"})
    monkeypatch.setenv("JA_BUILD_DIR", str(tmp_path / "no-build"))
    with pytest.raises(SystemExit) as e:
        build_backend.build_wheel(str(tmp_path), {"variant": "full"})
    assert "never runs build_jit.py" in str(e.value) and "make (or nox -s umbrella)" in str(e.value)
    assert "nox -s jit -- --module mha_fwd" in str(e.value)
    assert not list(tmp_path.glob("*.whl"))


def test_prepare_metadata_gives_the_wheels_metadata_without_a_build(sdist, wheels, tmp_path, monkeypatch):
    """prepare_metadata_for_build_wheel / _editable in the unpacked sdist (what pip and uv call first): the
    lite wheel's METADATA, licenses and entry points at the sdist's version (no libraries: a source build, which
    keeps the public version, not a lane's), and nothing is built or staged."""
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp_path, filter="data")
    src = tmp_path / sdist.name.removesuffix(".tar.gz")
    monkeypatch.chdir(src)
    monkeypatch.delenv("JA_BUILD_DIR", raising=False)
    monkeypatch.delenv("JA_ROOT_DIR", raising=False)
    lite = wheels["lite"]
    public = lite.version.split("+")[0]
    dist_info = f"jax_aiter-{public}.dist-info"
    with zipfile.ZipFile(lite.wheel) as zf:
        want = {n: zf.read(f"jax_aiter-{lite.version}.dist-info/{n}") for n in
                ("METADATA", "entry_points.txt", "licenses/LICENSE")}
    want["METADATA"] = want["METADATA"].replace(f"Version: {lite.version}\n".encode(), f"Version: {public}\n".encode())
    for hook in (build_backend.prepare_metadata_for_build_wheel, build_backend.prepare_metadata_for_build_editable):
        out = tmp_path / hook.__name__
        assert hook(str(out)) == dist_info
        assert {n: (out / dist_info / n).read_bytes() for n in want} == want
    assert not (src / "build").exists(), "metadata must not build anything"
    with pytest.raises(SystemExit, match=r"unknown config setting\(s\) flavour"):
        build_backend.prepare_metadata_for_build_wheel(str(tmp_path / "x"), {"flavour": "full"})


# --- clients -------------------------------------------------------------------------------------------

def test_clients_accept_both_wheels_and_the_sdist(wheels, sdist):
    dists = [wheels["lite"].wheel, wheels["full"].wheel, sdist]
    assert wheel_clients.client_problems(dists) == []
    for result in wheels.values():  # auditwheel show's sym_tag is the floor the build measured and tagged
        report = wheel_floor.check_floor(result.wheel)
        assert report.ok and report.sym_tag == result.platform_tag, report.message


def test_clients_reject_what_users_clients_reject(wheels, tmp_path):
    lite = wheels["lite"].wheel
    dist_info = f"jax_aiter-{wheels['lite'].version}.dist-info"
    with zipfile.ZipFile(lite) as zf:
        meta = zf.read(f"{dist_info}/METADATA").decode()
        init = zf.read("jax_aiter/ops/__init__.py")
    lower = "\n".join(line.split(":", 1)[0].lower() + ":" + line.split(":", 1)[1] if ": " in line and
                      not line.startswith(" ") else line for line in meta.split("\n\n", 1)[0].splitlines())
    old_style = rewrite_wheel(lite, tmp_path / lite.name, put={f"{dist_info}/METADATA": lower.encode() + b"\n"})
    said = wheel_clients.client_problems([old_style])
    assert any("twine check --strict rejects it" in s and "Metadata-Version" in s for s in said), said
    (tmp_path / "dup").mkdir()
    dup = rewrite_wheel(lite, tmp_path / "dup" / lite.name,
                        put={"jax_aiter/ops/copy_of_init.py": init + b"# a copy\n",
                             "jax_aiter/ops/another_copy.py": init + b"# a copy\n"})
    said = wheel_clients.client_problems([dup])
    assert any("check-wheel-contents rejects it" in s and "W002" in s for s in said), said


def test_wheel_unpack_then_pack_gives_the_same_members(wheels):
    for result in wheels.values():
        assert wheel_clients.repack_problems(result.wheel) == []


# --- sdist -------------------------------------------------------------------------------------------------

def test_sdist_holds_exactly_what_a_rebuild_needs(sdist, tmp_path, monkeypatch):
    base = sdist.name.removesuffix(".tar.gz")
    with tarfile.open(sdist) as tar:
        members = tar.getmembers()
        names = [m.name.removeprefix(base + "/") for m in members]
        pkg_info = tar.extractfile(f"{base}/PKG-INFO").read()
    assert {"PKG-INFO", "pyproject.toml", "Makefile", "README.md", "LICENSE"} <= set(names)
    tops = {n.split("/")[0] for n in names}
    assert tops == {"PKG-INFO", "pyproject.toml", "Makefile", "README.md", "LICENSE", "csrc", "jax_aiter",
                    "jatools", "third_party"}, tops
    assert not [n for n in names if "__pycache__" in n or n.endswith((".pyc", ".so", ".o")) or "/." in n]
    assert not [n for n in names if n.startswith("jatools/bench/")], "benchmarks are not needed to rebuild"
    assert {"jax_aiter/jit/build_jit.py", "jatools/wheel/build_backend.py", "jatools/wheel/wheel_layout.toml",
            "third_party/xla_ffi/include/xla/ffi/api/ffi.h"} <= set(names)
    assert all(m.uid == 0 and m.gid == 0 and m.mtime == EPOCH for m in members)
    meta = Metadata.from_email(pkg_info, validate=True)
    assert str(meta.metadata_version) == "2.4" and str(meta.version) == PYPROJECT["project"]["version"]
    monkeypatch.setenv("SOURCE_DATE_EPOCH", str(EPOCH))
    again = sdist_module.sdist(ROOT, tmp_path)  # the function build_sdist calls, in-process, same epoch
    assert again.read_bytes() == sdist.read_bytes(), "the sdist is not reproducible"


# What a packager or a user on a platform with no wheel runs: each front-end builds the sdist itself (the backend
# runs the native build in the unpacked sdist: JA_BACKEND=cpu here, so no CUDA compile), away from any checkout.
SDIST_FRONTS = {
    "pip install <sdist>": lambda py, sd, out: [py, "-m", "pip", "install", "-q", str(sd)],
    "uv pip install <sdist>": lambda py, sd, out: [uv(), "pip", "install", "-q", "--python", py, str(sd)],
    "pip wheel <sdist>": lambda py, sd, out: [py, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(sd)],
    # build is the test environment's (the fresh venv has no index to install it from); its isolated build
    # environment comes from the wheelhouse like the others'
    "python -m build <unpacked sdist>": lambda py, sd, out: [sys.executable, "-m", "build", "--wheel", "--outdir",
                                                             str(out), str(sd).removesuffix(".tar.gz")],
}


@pytest.mark.packaging
@pytest.mark.parametrize("front", sorted(SDIST_FRONTS))
def test_sdist_builds_a_working_source_wheel_with_each_front_end(front, sdist, build_wheelhouse, tmp_path):
    """A fresh venv in a folder away from the checkout; the front-end builds the sdist (metadata first, then the
    native build and the wheel) offline from the wheelhouse; the wheel passes every check, says source_build
    in its identity, installs, and rms_norm runs from it."""
    env = {k: v for k, v in offline_env(build_wheelhouse).items() if k not in ("JA_ROOT_DIR", "JA_BUILD_DIR")}
    work = tmp_path / "elsewhere"
    work.mkdir()
    shutil.copy2(sdist, work / sdist.name)
    with tarfile.open(sdist) as tar:
        tar.extractall(work, filter="data")
    venv = fresh_venv(work / "venv", build_wheelhouse, env)
    py = str(venv / "bin/python")
    run(SDIST_FRONTS[front](py, work / sdist.name, work / "out"), env, cwd=work, timeout=1800)
    if (work / "out").is_dir():
        wheel = only_wheel(work / "out")
        assert wheel_contents.check_contents(wheel).ok, wheel_contents.check_contents(wheel).message
        assert wheel_floor.check_floor(wheel).ok
        assert wheel_clients.client_problems([wheel]) == []
        run([py, "-m", "pip", "install", "-q", "--no-deps", str(wheel)], env)
    check = ("import jax.numpy as jnp, jax_aiter as ja, json; from jax_aiter import _loader; "
             "y = ja.rms_norm(jnp.ones((2, 64), jnp.float32), jnp.ones(64, jnp.float32), 1e-6); "
             "print(json.dumps({'sum': float(y.sum()), 'file': ja.__file__, 'id': _loader.build_identity()}))")
    got = json.loads(run([py, "-c", check], env, cwd=work).strip().splitlines()[-1])
    assert abs(got["sum"] - 128.0) < 1e-3 and Path(got["file"]).is_relative_to(venv), got
    assert got["id"]["source_build"] is True and got["id"]["backend"] == "cpu" and got["id"]["variant"] == "source"


# --- install with each front-end into a fresh venv, then run an op ------------------------------------------

def fresh_venv(path: Path, wh: Path, env: dict[str, str]) -> Path:
    """`python -m venv` (so pip is there), with jax and the runtime dependencies installed from the wheelhouse
    by uv (fast: hard links from its cache); the front-end under test then installs jax-aiter itself."""
    python = cleanroom_env.find_python(config.python_version(ROOT))
    run([str(python), "-m", "venv", str(path)], env)
    run([uv(), "pip", "install", "-q", "--python", str(path / "bin/python"),
         *wheelhouse.requirements(ROOT)], env)
    return path


def check_op(venv: Path, env: dict[str, str], expect_under: Path, cwd: Path | None = None) -> dict:
    out = run([str(venv / "bin/python"), "-c", RUN_OP], env, cwd=cwd or venv)
    got = json.loads(out.strip().splitlines()[-1])
    assert abs(got["sum"] - SILU_1_SUM) < 1e-4, got
    assert Path(got["file"]).resolve().is_relative_to(expect_under.resolve()), got
    return got


INSTALLS = {
    "pip install .": lambda py, ed: [py, "-m", "pip", "install", "-q", *(["-e"] if ed else []), "."],
    "uv pip install .": lambda py, ed: [uv(), "pip", "install", "-q", "--python", py, *(["-e"] if ed else []), "."],
}


@pytest.mark.packaging
@pytest.mark.parametrize("editable", [False, True], ids=["install", "editable"])
@pytest.mark.parametrize("front", sorted(INSTALLS))
def test_install_from_the_checkout_then_run_an_op(front, editable, fe_build, build_wheelhouse, tmp_path):
    """A fresh venv, the front-end installs the checkout, an op runs. Installed: the wheel's own code and
    libraries. Editable (PEP 660): the checkout's code, with its libraries from the build tree (a copy of the
    CPU test build here: JA_BUILD_DIR), nothing of the package copied into site-packages."""
    env = offline_env(build_wheelhouse, fe_build)
    venv = fresh_venv(tmp_path / "venv", build_wheelhouse, env)
    run(INSTALLS[front](str(venv / "bin/python"), editable), env)
    use = {k: v for k, v in env.items() if k != "JA_ROOT_DIR" and (editable or not k.startswith("JA_"))}
    package = Path(check_op(venv, use, expect_under=ROOT / "jax_aiter" if editable else venv)["file"]).parent
    info = json.loads(run([str(venv / "bin/python"), "-m", "jax_aiter", "info", "--json"], use, cwd=venv))
    where = {lib["library"]: lib["path"] for lib in info["libraries"]}
    lib_dir = fe_build / "jax_aiter_build" if editable else package / "_lib"
    assert where["silu_and_mul_ja.so"] == str(lib_dir / "silu_and_mul_ja.so"), where
    listed = [p.name for p in (venv / "lib").glob("python3*/site-packages/*")]
    assert (build_backend.EDITABLE_PTH in listed) == editable and ("jax_aiter" in listed) != editable, listed
    if not editable:
        assert info["variant"] == "lite" and lib_dir.is_relative_to(venv)
    shutil.rmtree(venv)
