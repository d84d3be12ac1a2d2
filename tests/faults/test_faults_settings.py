"""Every numeric setting goes through jax_aiter.settings: nan, inf, out-of-range and non-numbers stop with the
variable, the value and the accepted range. The table is checked whole, and the entry points by real processes."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jax_aiter import settings

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", sorted(settings.NUMERIC))
def test_faults_every_numeric_setting_is_bounded(name):
    spec = settings.NUMERIC[name]
    for bad in ("nan", "inf", "-inf", "abc", "", str(spec.hi * 10 + 1), str(spec.lo - 1)):
        with pytest.raises(settings.SettingError) as e:
            settings.number(name, bad)
        assert (f"{name}={bad!r} is not valid: give" in str(e.value)
                and f"from {spec.show(spec.lo)} to {spec.show(spec.hi)}" in str(e.value))
    assert settings.number(name, str(spec.kind(spec.lo))) == spec.lo
    assert settings.from_env(name, {}) == spec.default


def _run(args: list[str], **env: str) -> subprocess.CompletedProcess:
    full = {**{k: v for k, v in os.environ.items() if not k.startswith("JA_")}, "PYTHONPATH": str(ROOT), **env}
    return subprocess.run([sys.executable, *args], env=full, cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=False)


@pytest.mark.parametrize("name, value", [("JA_TEST_RERUNS", "nan"), ("JA_TEST_WORKERS", "-2"),
                                         ("JA_TESTS_PER_GPU", "0")])
def test_faults_test_tier_runner_names_a_bad_setting(name, value):
    r = _run(["-m", "jatools.testing.tiers", "--dry-run"], **{name: value, "JA_GPU_COUNT": "1"})
    assert r.returncode == 2 and f"{name}={value!r} is not valid" in r.stderr and "Traceback" not in r.stderr


def test_faults_wheel_build_names_a_bad_source_date_epoch():
    r = _run(["-m", "jatools.wheel.wheel_build", "--variant", "lite", "--dist", "/nonexistent"],
             SOURCE_DATE_EPOCH="yesterday", JA_ROOT_DIR=str(ROOT))
    assert r.returncode == 2 and "SOURCE_DATE_EPOCH='yesterday' is not valid" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


# --- one validation for every setting: real processes, the messages users see --------------------------------

# (variable, value, what the message must say about what is allowed): each was silently ignored, or accepted
# into the build identity, before jax_aiter/settings.py checked every setting.
BAD_ENV = [("GPU_ARCHS", "gfx9;;$(rm)", "'gfx9', an empty entry, '$(rm)' are not a GPU arch name"),
           ("JA_TOOLCHAIN_STRICT", "maybe", "give 1 or 0"),
           ("AITER_SYMBOL_VISIBLE", "perhaps", "give 1 or 0"),
           ("JA_BACKEND", "quantum", "give one of auto, cpu, cuda, rocm"),
           ("JA_SANITIZE", "adress", "'adress' not one of them"),
           ("JA_WHEEL_ARCH", "gfx942;gfx950", "more than one arch"),
           # checked as pyproject's build_dir is (it was not checked at all); outside the checkout the environment
           # may put a build anywhere, but not in a folder of other files
           ("JA_BUILD_DIR", "/etc", "it is outside the checkout"),
           ("JA_BUILD_DIR", " build", "it has spaces around it (did you mean 'build'?)")]


@pytest.mark.parametrize("name, value, allowed", BAD_ENV, ids=[b[0] for b in BAD_ENV])
def test_faults_bad_build_variable_is_named_by_the_build(name, value, allowed):
    """The build's first step (the Makefile's configuration) stops with the variable, the value, what is allowed
    and where it came from; exit 2, no traceback, nothing in the identity."""
    r = _run(["-m", "jatools.native.toolchain", "--json"], **{name: value})
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert f"{name}={value!r} is not valid" in r.stderr and allowed in r.stderr, r.stderr
    assert "(from the environment)" in r.stderr and "Traceback" not in r.stderr and not r.stdout


@pytest.mark.parametrize("name, value, allowed", [
    ("JA_NUM_THREADS", "-3", "an integer from 1 to 4096"), ("JA_NUM_THREADS", "abc", "an integer from 1 to 4096"),
    ("JA_CPU_ISA", "avx9000", "one of baseline"), ("JA_POISON_OUTPUTS", "maybe", "one of 1, 0"),
    ("JAX_AITER_LIB_DIR", "/nonexistent", "it does not exist; give an existing folder")])
def test_faults_bad_runtime_variable_is_named_by_info(name, value, allowed):
    """`python -m jax_aiter info` (what people run when something is wrong) names a bad runtime setting; a
    JAX_AITER_LIB_DIR that does not exist no longer falls back to other libraries silently."""
    r = _run(["-m", "jax_aiter", "info"], **{name: value})
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert f"{name}={value!r} is not valid" in r.stderr and allowed in r.stderr and "Traceback" not in r.stderr


def test_faults_a_library_lookup_checks_the_lib_dir_not_every_runtime_setting(monkeypatch, tmp_path):
    """The lookup reads JAX_AITER_LIB_DIR only, and checks only it; the settings the kernels read are checked
    where an op's libraries are loaded (once per op), so a bad one still stops with its name."""
    from jax_aiter import _loader

    monkeypatch.delenv(_loader.LIB_DIR_ENV, raising=False)
    monkeypatch.setenv("JA_NUM_THREADS", "abc")
    assert [label for label, _ in _loader.search_dirs(_loader.UMBRELLA)][:1] == ["wheel"]
    monkeypatch.setenv(_loader.LIB_DIR_ENV, str(tmp_path))
    assert _loader.search_dirs(_loader.UMBRELLA)[0] == (_loader.LIB_DIR_ENV, tmp_path)
    monkeypatch.setenv(_loader.LIB_DIR_ENV, str(tmp_path / "nonexistent"))
    with pytest.raises(_loader.LibraryNotFoundError, match=r"JAX_AITER_LIB_DIR=.*nonexistent'? is not valid"):
        _loader.search_dirs(_loader.UMBRELLA)
    monkeypatch.setenv(_loader.LIB_DIR_ENV, str(tmp_path))
    op = next(iter(_loader.OPS))
    monkeypatch.setattr(_loader, "_registered", set())  # this process may have registered it already
    with pytest.raises(settings.SettingError, match="JA_NUM_THREADS='abc' is not valid"):
        _loader.ensure_registered(op)


def test_faults_accepted_values_still_pass():
    for name, value in [("GPU_ARCHS", "gfx942;gfx950, sm_90a,gfx942:xnack+"), ("JA_TOOLCHAIN_STRICT", "true"),
                        ("JA_SANITIZE", "address;undefined"), ("JA_NUM_THREADS", "8"), ("JA_CPU_ISA", "baseline")]:
        settings.check(settings.BY_NAME[name], value)


def _checkout_with(tmp_path: Path, edit) -> Path:
    """A copy of pyproject.toml in a folder that stands for a checkout, edited by `edit(text) -> text`."""
    root = tmp_path / "checkout with space"
    root.mkdir()
    (root / "pyproject.toml").write_text(edit((ROOT / "pyproject.toml").read_text()))
    return root


def _key(key: str, value: str):
    def edit(text: str) -> str:
        out, n = re.subn(rf"^{key} = .*$", f"{key} = {value}", text, count=1, flags=re.MULTILINE)
        return out if n else text.replace("[tool.jax-aiter]\n", f"[tool.jax-aiter]\n{key} = {value}\n", 1)
    return edit


BAD_PYPROJECT = [
    ("wheel_compress_level", '"high"', ("[tool.jax-aiter] wheel_compress_level='high' is not valid: a string, not an "
                                      "integer; give an integer")),
    ("wheel_compress_level", "99", "[tool.jax-aiter] wheel_compress_level=99 is not valid: give an integer from 0"),
    ("backend", '"quantum"', "[tool.jax-aiter] backend='quantum' is not valid: give one of auto, cpu, cuda, rocm"),
    ("jit_libs_asset_limit", "-1", "[tool.jax-aiter] jit_libs_asset_limit=-1 is not valid: give an integer from 1"),
    ("build_dir", '"../elsewhere"', "[tool.jax-aiter] build_dir='../elsewhere' is not valid: it leads outside"),
    ("build_dir", '"/tmp/abs"', "[tool.jax-aiter] build_dir='/tmp/abs' is not valid: it is absolute"),
    ("gpu_archs_rocm", '"gfx9;;x"', "[tool.jax-aiter] gpu_archs_rocm='gfx9;;x' is not valid"),
    ("toolchain_strict", '"maybe"', "[tool.jax-aiter] toolchain_strict='maybe' is not valid: give 1 or 0"),
    ("packages", '"jax_aiter"', "[tool.jax-aiter] packages='jax_aiter' is not valid: give a list of strings"),
    ("wheel_compres_level", "6", "unknown key(s) wheel_compres_level under [tool.jax-aiter]"),
    # an integer setting takes a TOML integer, as a flag takes true or false: "1000" split a release into 318 assets
    ("jit_libs_asset_limit", '"1000"', ("[tool.jax-aiter] jit_libs_asset_limit='1000' is not valid: a string, not an "
                                       "integer; give an integer from 1 to")),
    ("wheel_compress_level", "6.0", ("[tool.jax-aiter] wheel_compress_level=6.0 is not valid: a fraction, not an "
                                    "integer; give an integer from 0 to 12")),
    ("jit_libs_zstd_level", "true", ("[tool.jax-aiter] jit_libs_zstd_level=True is not valid: true or false, not an "
                                    "integer")),
    ("build_dir", '"  build  "', ("[tool.jax-aiter] build_dir='  build  ' is not valid: it has spaces around it (did "
                                 "you mean 'build'?)")),
]


@pytest.mark.parametrize("key, value, said", BAD_PYPROJECT, ids=[f"{b[0]}={b[1]}" for b in BAD_PYPROJECT])
def test_faults_bad_pyproject_key_is_named_with_its_file(key, value, said, tmp_path):
    """A real pyproject.toml with one bad key, read by a real process (the wheel build's first step): the error
    names the key, the value, what is allowed and the file, before anything is built."""
    root = _checkout_with(tmp_path, _key(key, value))
    r = _run(["-m", "jatools.wheel.wheel_build", "--variant", "lite", "--dist", str(tmp_path / "dist")],
             JA_ROOT_DIR=str(root))
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert said in r.stderr and str(root / "pyproject.toml") in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "dist").exists()


def test_faults_pyproject_syntax_error_names_the_file(tmp_path):
    root = _checkout_with(tmp_path, lambda t: t.replace("backend = \"auto\"", "backend = \"auto", 1))
    r = _run(["-m", "jatools.native.toolchain", "--json"], JA_ROOT_DIR=str(root))
    assert r.returncode == 2 and f"{root / 'pyproject.toml'} is not valid TOML" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_faults_root_dir_that_does_not_exist_is_named(tmp_path):
    r = _run(["-m", "jatools.native.toolchain", "--json"], JA_ROOT_DIR=str(tmp_path / "gone"))
    assert r.returncode == 2 and f"JA_ROOT_DIR={str(tmp_path / 'gone')!r} is not valid: it does not exist" in r.stderr
    assert "Traceback" not in r.stderr


def _invoke(root: Path, *task: str, **env: str) -> subprocess.CompletedProcess:
    """A real `invoke` (this checkout's tasks.py) working on the checkout `root`."""
    return _run(["-m", "invoke", *task], JA_ROOT_DIR=str(root), **env)


@pytest.mark.parametrize("edit, said", [
    (_key("jit_libs_asset_limit", '"1000"'), "[tool.jax-aiter] jit_libs_asset_limit='1000' is not valid: a string"),
    (lambda t: t.replace('backend = "auto"\n', 'backend = "auto"\nbackend = "cpu"\n', 1),
     "is not valid TOML: Cannot overwrite a value (at line"),
    (lambda t: t.replace('backend = "auto"', 'backend = "auto', 1), "is not valid TOML: "),
], ids=["string-for-int", "duplicate-key", "syntax-error"])
def test_faults_invoke_prints_a_settings_error_as_one_line(tmp_path, edit, said):
    """invoke printed a settings error as the last line of a 20-line traceback, and a TOML error without naming
    pyproject.toml: now one line naming the file, exit 2."""
    root = _checkout_with(tmp_path, edit)
    r = _invoke(root, "jit.identity")
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and said in r.stderr and str(root / "pyproject.toml") in r.stderr, r.stderr


@pytest.mark.parametrize("table", ["jax_aiter", "jaxaiter", "jax-aitr", "Jax-Aiter"])
def test_faults_near_miss_pyproject_table_is_refused(tmp_path, table):
    """[tool.jax_aiter] (an underscore) was ignored whole, backend = "quantum" with it: a table that looks like
    [tool.jax-aiter] and is not stops every command, naming it and the file."""
    root = _checkout_with(tmp_path, lambda t: t + f'\n[tool.{table}]\nbackend = "quantum"\n')
    for argv in (["-m", "jatools.native.toolchain", "--json"],
                 ["-m", "jatools.wheel.wheel_build", "--variant", "lite", "--dist", str(tmp_path / "dist")]):
        r = _run(argv, JA_ROOT_DIR=str(root))
        assert r.returncode == 2, (argv, r.stdout, r.stderr)
        assert f"[tool.{table}] in {root / 'pyproject.toml'} is not read by jax-aiter: its table is " \
               "[tool.jax-aiter]" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_faults_build_dir_from_the_environment_may_leave_the_checkout_but_not_into_other_files(tmp_path):
    """JA_BUILD_DIR from the environment: a folder of other files is refused (it was not checked: /etc was used);
    an empty or new folder, or a build tree, outside the checkout is a build of its own (the tests' builds)."""
    others = tmp_path / "others"
    others.mkdir()
    (others / "notes.txt").write_text("mine\n")
    r = _run(["-m", "jatools.native.toolchain", "--json"], JA_BUILD_DIR=str(others), JA_BACKEND="cpu")
    assert r.returncode == 2 and f"JA_BUILD_DIR={str(others)!r} is not valid: it is outside the checkout" in r.stderr
    assert f"{others} holds files that are not a build (notes.txt)" in r.stderr, r.stderr
    for ok in (tmp_path / "new", tmp_path / "empty", tmp_path / "tree"):
        (ok / "aiter_build").mkdir(parents=True) if ok.name == "tree" else ok.mkdir() if ok.name == "empty" else None
        r = _run(["-m", "jatools.native.toolchain", "--json"], JA_BUILD_DIR=str(ok), JA_BACKEND="cpu")
        assert r.returncode == 0, (ok, r.stderr)


def test_faults_symlinked_build_dir_is_described_as_a_symlink(tmp_path):
    """build/ a symlink to another disk: a build tree there is used (it was "leads outside the checkout"); one that
    holds other files is refused, naming the symlink and its target."""
    root = _checkout_with(tmp_path, lambda t: t)
    disk = tmp_path / "disk"
    (disk / "aiter_build").mkdir(parents=True)
    (root / "build").symlink_to(disk)
    r = _run(["-m", "jatools.native.toolchain", "--json"], JA_ROOT_DIR=str(root), JA_BACKEND="cpu")
    assert r.returncode == 0, r.stderr
    (disk / "aiter_build").rmdir()
    (disk / "photos").mkdir()
    r = _run(["-m", "jatools.native.toolchain", "--json"], JA_ROOT_DIR=str(root), JA_BACKEND="cpu")
    assert r.returncode == 2, r.stderr
    assert f"build is a symlink to {disk}, so the path leads to {disk}, outside the checkout" in r.stderr, r.stderr
    assert f"{disk} holds files that are not a build (photos)" in r.stderr and "Traceback" not in r.stderr


def test_faults_nox_names_a_pyproject_it_cannot_read(tmp_path):
    """A duplicate key in pyproject.toml: `nox -l` (the noxfile reads pyproject as it loads) stops with one line
    naming the file and the line, not nox's 20-line traceback from tomllib."""
    root = _checkout_with(tmp_path, lambda t: t.replace('backend = "auto"\n', 'backend = "auto"\nbackend = "cpu"\n', 1))
    shutil.copy2(ROOT / "noxfile.py", root)
    for pkg in ("jatools", "jax_aiter"):
        shutil.copytree(ROOT / pkg, root / pkg, ignore=shutil.ignore_patterns("__pycache__", "_lib", "*.so"))
    r = subprocess.run([sys.executable, "-m", "nox", "-l"], cwd=root, capture_output=True, text=True, timeout=120,
                       check=False, env={**{k: v for k, v in os.environ.items() if not k.startswith("JA_")},
                                         "JA_ROOT_DIR": str(root)})
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert r.stderr.strip().splitlines() == [
        (f"nox: error: {root / 'pyproject.toml'} is not valid TOML: Cannot overwrite a value (at line "
        f"{(root / 'pyproject.toml').read_text().splitlines().index('backend = \"cpu\"') + 1}, column 16) (a syntax "
        "error, or a key or table given twice); fix the file (https://toml.io)")], r.stderr


@pytest.mark.parametrize("argv", [["-m", "invoke", "--list"], ["-m", "jax_aiter", "info"],
                                  ["-m", "jatools.release", "--dry-run"], ["-m", "jatools.native.build"],
                                  ["ci/build.py", "--list"]],
                         ids=["invoke", "info", "release", "native-build", "ci-build"])
def test_faults_a_checkout_whose_pyproject_is_not_toml_says_so_in_one_line(tmp_path, argv):
    """The probe broke the checkout's own pyproject.toml (the one beside the jax_aiter package): invoke, `python -m
    jax_aiter info`, the release and the native build printed tomllib's raw traceback, which named neither the file
    nor what to do. Now each prints one line naming the file, tomllib's line and column, and the fix."""
    from tests.build.scratch import make_scratch

    root = make_scratch(tmp_path / "src")
    for extra in ("tasks.py", "ci"):
        (shutil.copytree if (ROOT / extra).is_dir() else shutil.copy2)(ROOT / extra, root / extra)
    text = (root / "pyproject.toml").read_text()
    (root / "pyproject.toml").write_text(text.replace('name = "jax-aiter"', 'name = "jax-aiter', 1))
    line = text.splitlines().index('name = "jax-aiter"') + 1
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("JA_")}, "JA_ROOT_DIR": str(root),
           "JA_BACKEND": "cpu", "PYTHONPATH": str(root)}
    r = subprocess.run([sys.executable, *argv], cwd=root, env=env, capture_output=True, text=True, timeout=300,
                       check=False)
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    said = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(said) == 1 and f"{root / 'pyproject.toml'} is not valid TOML: " in said[0], r.stderr
    assert f"(at line {line}, column " in said[0] and "fix the file" in said[0], said
    assert not (root / "build" / "obj").exists()
