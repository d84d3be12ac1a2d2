"""Faults of the libraries a user loads: truncated, altered or swapped files, and op arguments that are not
finite in float32. Real libraries from the build tree, copied into a real install layout (jax_aiter/_lib plus
the build identity's pins) or a checkout layout (build/ with its build_record.json), loaded by real processes."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jax_aiter import op_table

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("JA_ROOT_DIR") or ROOT) / "build"
UMBRELLA_DIR, JIT_DIR = BUILD / "jax_aiter_build", BUILD / "aiter_build"
_OPS = op_table.load()
# the umbrella, every op's shim, every JIT library: what a full wheel ships (the op table says which)
LIBS = ["libjax_aiter.so", *(op.shim for op in _OPS.values()), *op_table.jit_libraries(_OPS).values()]
RMS = ("import jax.numpy as jnp, jax_aiter as ja\n"
       "print(float(ja.rms_norm(jnp.ones((2, 64), jnp.float32), jnp.ones(64, jnp.float32), 1e-6).sum()))")
ATTN = ("import jax.numpy as jnp, jax_aiter as ja\n"
        "q = jnp.ones((1, 16, 2, 64), jnp.float32)\nprint(float(ja.flash_attn_func(q, q, q).sum()))")


def _built() -> None:
    missing = [n for n in LIBS if not ((UMBRELLA_DIR if not n.startswith("lib") or n == LIBS[0] else JIT_DIR) / n)
               .is_file()]
    if missing:
        pytest.skip(f"needs the built libraries in {BUILD} ({', '.join(missing)} missing): run `make && python3 "
                    "jax_aiter/jit/build_jit.py && make ja_mods`")


def _src(name: str) -> Path:
    return (UMBRELLA_DIR if name == "libjax_aiter.so" or name.endswith("_ja.so") else JIT_DIR) / name


@pytest.fixture
def install(tmp_path):
    """An installed full wheel's layout: the package, its libraries in jax_aiter/_lib, pins in its identity."""
    _built()
    from jax_aiter.integrity import file_entry

    site = tmp_path / "site"
    pkg = site / "jax_aiter"
    shutil.copytree(ROOT / "jax_aiter", pkg, ignore=shutil.ignore_patterns("__pycache__", "_lib", "*.json.tmp*"))
    (pkg / "_lib").mkdir()
    for n in LIBS:
        shutil.copyfile(_src(n), pkg / "_lib" / n)
    ident = {"version": "0.1.0", "variant": "full", "cache_id": "0123456789abcdef", "backend": "cpu",
             "pins": [file_entry(pkg / "_lib" / n) for n in LIBS]}
    (pkg / "_build_identity.json").write_text(json.dumps(ident))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JA_", "JAX_AITER"))}
    env.update(PYTHONPATH=str(site), XDG_CACHE_HOME=str(tmp_path / "cache"), JAX_PLATFORMS="cpu")
    return pkg / "_lib", env


@pytest.fixture
def checkout(tmp_path):
    """A checkout's build tree (copied): build/jax_aiter_build and build/aiter_build with its record."""
    _built()
    root = tmp_path / "root"
    for d in (UMBRELLA_DIR, JIT_DIR):
        dst = root / "build" / d.name
        dst.mkdir(parents=True)
        for p in d.iterdir():
            if p.is_file() and (p.suffix == ".so" or p.name == "build_record.json"):
                shutil.copyfile(p, dst / p.name)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JA_", "JAX_AITER"))}
    env.update(PYTHONPATH=str(ROOT), JA_ROOT_DIR=str(root), JAX_PLATFORMS="cpu")
    return root / "build", env


def _py(env: dict, code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=300, check=False)


def _info(env: dict, cwd: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "jax_aiter", "info", *flags], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=60, check=False)


def _truncate(path: Path, keep: float = 0.5) -> None:
    with open(path, "r+b") as f:
        f.truncate(int(path.stat().st_size * keep))


def test_faults_truncated_umbrella_in_a_wheel_is_a_clear_error_not_sigbus(install, tmp_path):
    lib, env = install
    assert _info(env, tmp_path).returncode == 0
    _truncate(lib / "libjax_aiter.so")
    r = _py(env, RMS, tmp_path)
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])  # a Python error, not a signal
    assert "LibraryCheckError" in r.stderr and f"{lib / 'libjax_aiter.so'}:" in r.stderr
    assert "the file is truncated or was replaced" in r.stderr and "pip install --force-reinstall" in r.stderr
    i = _info(env, tmp_path)
    assert i.returncode == 1 and "PROBLEM:" in i.stdout and "libjax_aiter.so with a problem" not in i.stdout
    assert "1 library with a problem: libjax_aiter.so" in i.stdout


def test_faults_truncated_mha_library_in_a_checkout_is_a_clear_error(checkout, tmp_path):
    build, env = checkout
    _truncate(build / "aiter_build" / "libmha_fwd.so")
    r = _py(env, ATTN, tmp_path)
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
    assert f"{build / 'aiter_build' / 'libmha_fwd.so'}:" in r.stderr and "build_record.json records" in r.stderr
    assert "nox -s jit -- --module mha_fwd" in r.stderr
    assert _info(env, tmp_path).returncode == 1


def test_faults_swapped_library_names_its_soname(checkout, tmp_path):
    """libmha_fwd.so holding libmha_bwd.so's bytes, and no record to compare sizes with."""
    build, env = checkout
    (build / "aiter_build" / "build_record.json").unlink()
    shutil.copyfile(build / "aiter_build" / "libmha_bwd.so", build / "aiter_build" / "libmha_fwd.so")
    i = _info(env, tmp_path)
    assert i.returncode == 1
    assert "its SONAME is libmha_bwd.so, not libmha_fwd.so: it holds another library's bytes" in i.stdout
    r = _py(env, ATTN, tmp_path)
    assert r.returncode == 1 and "its SONAME is libmha_bwd.so, not libmha_fwd.so" in r.stderr, r.stderr[-2000:]


def test_faults_swapped_shim_names_the_missing_handlers(checkout, tmp_path):
    """A real library (g++) with the shim's name and SONAME but none of its handlers, recorded as linked (as
    make records what it links), so the size check passes and the handler check is the one that speaks."""
    from jax_aiter.integrity import record_files

    build, env = checkout
    src = tmp_path / "empty.cc"
    src.write_text('extern "C" int unrelated() { return 1; }\n')
    shim = build / "jax_aiter_build" / "rmsnorm_fwd_ja.so"
    subprocess.run(["g++", "-shared", "-fPIC", "-Wl,-soname,rmsnorm_fwd_ja.so", "-o", str(shim), str(src)], check=True)
    if (shim.parent / "build_record.json").is_file():
        record_files([shim])
    r = _py(env, RMS, tmp_path)
    assert r.returncode == 1, r.stderr[-2000:]
    assert f"{shim} does not export ja_ffi_api_version, JaRmsNormFwdCpu, JaRmsNormFwdAddCpu" in r.stderr
    assert "make ja_mods" in r.stderr and "AttributeError" not in r.stderr


def test_faults_info_verify_hashes_what_size_cannot_see(install, tmp_path):
    lib, env = install
    target = lib / "librmsnorm_fwd.so"
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF
    target.write_bytes(bytes(data))
    assert _info(env, tmp_path).returncode == 0  # same size, same SONAME: only the hash tells
    v = _info(env, tmp_path, "--verify")
    assert v.returncode == 1 and "librmsnorm_fwd.so" in v.stdout and "the file was altered" in v.stdout
    j = json.loads(_info(env, tmp_path, "--verify", "--json").stdout)
    assert [x["library"] for x in j["libraries"] if x.get("problems")] == ["librmsnorm_fwd.so"]


def test_faults_info_rejects_an_unknown_option(install, tmp_path):
    _, env = install
    r = _info(env, tmp_path, "--verfy")
    assert r.returncode == 2 and "unknown option '--verfy'" in r.stderr


@pytest.mark.parametrize("value", [1e39, -1e39, float("inf"), float("nan")])
def test_faults_eps_not_finite_in_float32_is_rejected(value):
    import jax.numpy as jnp

    import jax_aiter as ja

    with pytest.raises(ValueError, match="eps must be finite in float32"):
        ja.rms_norm(jnp.ones((2, 8), jnp.float32), jnp.ones(8, jnp.float32), value)
    with pytest.raises(ValueError, match="eps must be finite in float32"):
        ja.rms_norm_with_add(jnp.ones((2, 8)), jnp.ones((2, 8)), jnp.ones(8), value)


@pytest.mark.parametrize("value", [1e39, float("-inf"), float("nan")])
def test_faults_softmax_scale_not_finite_in_float32_is_rejected(value):
    import jax.numpy as jnp

    import jax_aiter as ja

    q = jnp.ones((1, 4, 1, 64), jnp.float32)
    with pytest.raises(ValueError, match="softmax_scale must be finite in float32"):
        ja.flash_attn_func(q, q, q, softmax_scale=value)


def test_faults_largest_float32_eps_is_still_accepted():
    from jax_aiter.ops import _checks

    assert _checks.check_eps("rms_norm", 3.0e38) == 3.0e38


def test_faults_truncated_library_in_lib_dir_without_a_record_is_refused(checkout, tmp_path):
    """JAX_AITER_LIB_DIR with a truncated libjax_aiter.so and no build record beside it (nothing to compare
    sizes with): the ELF headers describe bytes past the end of the file, so it is refused before dlopen
    instead of killing the process with SIGBUS (exit 135) at the first op call."""
    build, env = checkout
    lib_dir = tmp_path / "lib dir"
    lib_dir.mkdir()
    shutil.copyfile(build / "jax_aiter_build" / "libjax_aiter.so", lib_dir / "libjax_aiter.so")
    _truncate(lib_dir / "libjax_aiter.so", 0.6)
    assert not (lib_dir / "build_record.json").exists()
    env = {**env, "JAX_AITER_LIB_DIR": str(lib_dir)}
    r = _py(env, RMS, tmp_path)
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])  # a Python error, not a signal
    assert f"{lib_dir / 'libjax_aiter.so'}:" in r.stderr and "a truncated file" in r.stderr, r.stderr[-2000:]
    i = _info(env, tmp_path)
    assert i.returncode == 1 and "ELF headers describe" in i.stdout


def test_faults_lib_dir_that_does_not_exist_is_an_error_not_a_fallback(checkout, tmp_path):
    _, env = checkout
    r = _py({**env, "JAX_AITER_LIB_DIR": str(tmp_path / "nonexistent")}, RMS, tmp_path)
    assert r.returncode == 1 and f"JAX_AITER_LIB_DIR={str(tmp_path / 'nonexistent')!r} is not valid" in r.stderr
    assert "it does not exist" in r.stderr


def test_faults_library_deleted_from_an_install_fails_info(install, tmp_path):
    """A library the installed wheel ships is gone: info (and --verify) say the install is damaged and exit 1,
    where they printed NOT FOUND, then 'every library found is sound', and exited 0."""
    lib, env = install
    (lib / "silu_and_mul_ja.so").unlink()
    for flags in ((), ("--verify",)):
        i = _info(env, tmp_path, *flags)
        assert i.returncode == 1, (flags, i.stdout)
        assert "1 library the wheel ships is missing: silu_and_mul_ja.so" in i.stdout
        assert "pip install --force-reinstall --no-deps jax-aiter" in i.stdout


def test_faults_info_into_a_closed_pipe_prints_no_traceback(install, tmp_path):
    """`python -m jax_aiter info | head -0`: the reader is gone before info writes (a pipe whose read end is
    closed); info ends without a BrokenPipeError traceback (issue 37)."""
    _, env = install
    read, write = os.pipe()
    os.close(read)
    try:
        r = subprocess.run([sys.executable, "-m", "jax_aiter", "info"], env=env, cwd=tmp_path, stdout=write,
                           stderr=subprocess.PIPE, text=True, timeout=60, check=False)
    finally:
        os.close(write)
    assert "Traceback" not in r.stderr and "BrokenPipeError" not in r.stderr, r.stderr
    assert r.returncode == 0


@pytest.mark.parametrize("where", ["lib_dir", "library"])
def test_faults_library_others_may_write_is_not_loaded(checkout, tmp_path, where):
    """Root (this test runs as whoever runs the suite: root in CI) loaded libraries from a mode-777
    JAX_AITER_LIB_DIR, where any user could swap one for code that then runs as root. A library whose folder, or
    the file itself, others may write is refused before dlopen, naming it, the mode and the fix (not a new
    download: the folder would still be open); info says the same."""
    build, env = checkout
    lib_dir = tmp_path / "libs"
    lib_dir.mkdir()
    for n in ("libjax_aiter.so", "rmsnorm_fwd_ja.so"):
        shutil.copyfile(build / "jax_aiter_build" / n, lib_dir / n)
    shutil.copyfile(build / "aiter_build" / "librmsnorm_fwd.so", lib_dir / "librmsnorm_fwd.so")
    env = {**env, "JAX_AITER_LIB_DIR": str(lib_dir)}
    assert _py(env, RMS, tmp_path).returncode == 0  # the same libraries in a folder of one's own load
    shared = lib_dir if where == "lib_dir" else lib_dir / "libjax_aiter.so"
    shared.chmod(0o777)
    r = _py(env, RMS, tmp_path)
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
    said = f"{'its folder ' if where == 'lib_dir' else ''}{shared}: group and others may write to it (mode 777)"
    assert said in r.stderr and "could replace it with code that runs as you; it is not loaded" in r.stderr, \
        r.stderr[-2000:]
    assert f"chmod go-w {shared}" in r.stderr and "--force" not in r.stderr
    i = _info(env, tmp_path)
    assert i.returncode == 1 and said in i.stdout, i.stdout


def test_faults_library_this_user_cannot_read_is_not_answered_with_force(tmp_path):
    """A fetched attention library another user's umask left unreadable to this one: Permission denied was answered
    with `jax-aiter-fetch-mha --force`, which cannot help (the fetch reuses the folder). Now the fix is the
    permission. Run by a real user without the right (nobody) under the system Python 3 (pyenv's is under /root)."""
    import tempfile

    _built()
    python = shutil.which("python3", path="/usr/bin")
    if os.getuid() != 0 or python is None:
        pytest.skip(f"needs root to run a process as nobody (uid {os.getuid()}) and /usr/bin/python3 ({python})")
    world = Path(tempfile.mkdtemp(prefix="ja-perm-", dir="/tmp"))
    try:
        world.chmod(0o755)
        pkg = world / "site" / "jax_aiter"
        shutil.copytree(ROOT / "jax_aiter", pkg, ignore=shutil.ignore_patterns("__pycache__", "_lib", "*.json.tmp*"))
        ident = {"version": "0.1.0", "variant": "lite", "cache_id": "0123456789abcdef", "backend": "cpu"}
        (pkg / "_build_identity.json").write_text(json.dumps(ident))
        cache = world / "cache" / "jax-aiter" / "0.1.0" / "0123456789abcdef"
        cache.mkdir(parents=True)
        shutil.copyfile(JIT_DIR / "libmha_fwd.so", cache / "libmha_fwd.so")
        (cache / "libmha_fwd.so").chmod(0o600)  # root's, unreadable to anyone else
        for d in [world, *world.rglob("*")]:
            if d.is_dir():
                d.chmod(0o755)
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(world / "site"), "XDG_CACHE_HOME": str(world / "cache"),
               "HOME": str(world)}
        r = subprocess.run([python, "-m", "jax_aiter", "info"], env=env, cwd=world, capture_output=True, text=True,
                           timeout=60, check=False, user=65534, group=65534)
    finally:
        shutil.rmtree(world, ignore_errors=True)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "Permission denied" in r.stdout and f"make it readable to you (chmod a+r {cache / 'libmha_fwd.so'}" \
        in r.stdout, r.stdout
    assert "jax-aiter-fetch-mha --force" not in r.stdout


def test_faults_jit_libraries_of_another_commit_are_named_at_run_time(tmp_path):
    """build/aiter_build built at one commit, the checkout at another: attention ran from the checkout without a
    word. The loader names the difference (a StaleLibraryWarning, and the log): another kernel revision, or kernel
    edits since the build; libraries of the checkout's own sources load silently."""
    from tests.tooling.jit_libs_support import git, make_checkout

    _built()
    root = make_checkout(tmp_path / "repo")
    for d in (UMBRELLA_DIR, JIT_DIR):
        (root / "build" / d.name).mkdir(parents=True)
        for p in d.iterdir():
            if p.is_file() and (p.suffix == ".so" or p.name == "build_record.json"):
                shutil.copyfile(p, root / "build" / d.name / p.name)
    record_path = root / "build" / "aiter_build" / "build_record.json"
    record = json.loads(record_path.read_text())
    record["identity"] = dict(record["identity"], kernel_source_revision=git(root, "rev-parse", "HEAD:csrc/kernels")
                              .strip(), kernel_source_dirty=False)
    record_path.write_text(json.dumps(record))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JA_", "JAX_AITER"))}
    env.update(PYTHONPATH=str(ROOT), JA_ROOT_DIR=str(root), JAX_PLATFORMS="cpu")
    same = _py(env, RMS, tmp_path)
    assert same.returncode == 0 and "StaleLibraryWarning" not in same.stderr, same.stderr[-2000:]
    kernel = next((root / "csrc" / "kernels").rglob("*.h"))
    kernel.write_text(kernel.read_text() + "\n// an edit after the build\n")
    edited = _py(env, RMS, tmp_path)
    assert edited.returncode == 0 and "StaleLibraryWarning" in edited.stderr, edited.stderr[-2000:]
    assert f"the kernel sources in {root / 'csrc/kernels'} changed since the JIT libraries in " \
           f"{root / 'build' / 'aiter_build'} were built (uncommitted edits: " in edited.stderr, edited.stderr[-2000:]
    git(root, "commit", "-qam", "a kernel change")
    moved = _py(env, RMS, tmp_path)
    assert "StaleLibraryWarning" in moved.stderr and "but the checkout" in moved.stderr, moved.stderr[-2000:]
    assert f"were built from kernel sources {record['identity']['kernel_source_revision']} (csrc/kernels)" in \
        moved.stderr and "nox -s jit" in moved.stderr
