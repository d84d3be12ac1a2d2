"""Clean-room validation end to end: real wheels, real venvs, a real offline install, real smoke runs.

A good wheel passes; each planted defect fails validation with a message that
names its cause.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from jatools.validate import cleanroom, cleanroom_inputs
from jatools.wheel import wheel_scan
from tests.validate import plants
from tests.validate.conftest import REPO, failures, member
from tests.wheel.wheel_plant import patch_dynamic_string, rewrite_wheel

LIB = "jax_aiter/_lib"


def test_good_full_wheel_passes_every_check(good_wheels, validate_wheels, tmp_path):
    res = validate_wheels(good_wheels["full"]).results[0]
    assert res.ok, failures(res)
    names = {c.name for c in res.checks}
    for must in ("wheel-record", "venv", "install", "isolation", "installed-bytes", "identity", "load-alone",
                 "core-ops[cpu]", "attention[cpu]", "library-origin"):
        assert must in names, f"{must} did not run: {sorted(names)}"
    assert "fetch" not in names, "a full wheel must not need a fetch"


def test_good_lite_wheel_fetches_then_runs_attention(good_wheels, validate_wheels):
    res = validate_wheels(good_wheels["lite"]).results[0]
    assert res.ok, failures(res)
    names = [c.name for c in res.checks]
    order = ["release-server", "core-ops[cpu]", "attention-needs-fetch", "fetch", "attention[cpu]", "library-origin"]
    assert [n for n in names if n in order] == order, names


def test_dependencies_from_a_hosts_interpreter(good_wheels, validate_wheels, host_python):
    """--deps-from (an offline GPU host's JAX): the room sees that interpreter's packages and installs only the
    wheel (and what the host lacks); the checkout stays unreachable."""
    res = validate_wheels(good_wheels["full"], deps_from=host_python, keep=True).results[0]
    try:
        assert res.ok, failures(res)
        assert res.route.endswith(f"dependencies of {host_python}") and any("jax 0." in n for n in res.notes)
        site = next(Path(res.kept).glob("venv/lib/python*/site-packages"))
        assert (site / "ja-host-deps.pth").is_file() and (site / "jax_aiter").is_dir()
        assert not (site / "jax").exists() and not (site / "jaxlib").exists(), "JAX was installed, not taken"
    finally:
        shutil.rmtree(res.kept, ignore_errors=True)


def test_host_dependencies_inside_the_checkout_fail_isolation(good_wheels, validate_wheels):
    """A --deps-from interpreter whose site-packages lie in the checkout would put the checkout on sys.path."""
    inside = REPO / "build" / "tests-host-in-checkout"
    shutil.rmtree(inside, ignore_errors=True)
    try:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(inside)], check=True)
        site = next(inside.glob("lib/python*/site-packages"))
        import jax  # the test's own JAX: the stand-in host reaches it through a .pth

        (site / "host-jax.pth").write_text(str(Path(jax.__file__).parents[1]) + "\n")
        res = validate_wheels(good_wheels["full"], deps_from=inside / "bin" / "python").results[0]
        assert not res.ok and "the --deps-from interpreter's site-packages are inside the checkout" in failures(res)
    finally:
        shutil.rmtree(inside, ignore_errors=True)


def test_dependencies_from_an_interpreter_without_jax_are_refused(good_wheels, validate_wheels, tmp_path):
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    with pytest.raises(cleanroom.ValidationError, match="has no jax/jaxlib installed"):
        validate_wheels(good_wheels["full"], deps_from=bare / "bin" / "python")


def test_missing_library_is_named(good_wheels, validate_wheels, tmp_path):
    wheel = rewrite_wheel(good_wheels["full"], tmp_path / good_wheels["full"].name,
                          drop=(f"{LIB}/librmsnorm_fwd.so",))
    res = validate_wheels(wheel).results[0]
    text = failures(res)
    assert "load-alone: rmsnorm_fwd_ja.so does not load on its own: librmsnorm_fwd.so" in text, text
    assert "core-ops[cpu]" in text and "librmsnorm_fwd.so not found" in text, text


@pytest.mark.parametrize("how", ["into-build-tree", "nowhere"])
def test_broken_runpath_is_named(good_wheels, native_build, validate_wheels, tmp_path, how):
    src = good_wheels["full"]
    shim = tmp_path / "rmsnorm_fwd_ja.so"
    # the shim as linked (its RUNPATH, $ORIGIN:$ORIGIN/../aiter_build, leaves room; the wheel's says $ORIGIN)
    shim.write_bytes((native_build.umbrella_dir / "rmsnorm_fwd_ja.so").read_bytes())
    old = ":".join(wheel_scan.read_dynamic(shim).runpath)
    if how == "into-build-tree":  # works on the build machine only: the classic absolute build-tree RUNPATH
        links = plants.short_links([native_build.build_dir / "jax_aiter_build", native_build.build_dir / "aiter_build"],
                                   tmp_path.name[-4:])
        patch_dynamic_string(shim, "DT_RUNPATH", old, ":".join(map(str, links)))
    else:
        patch_dynamic_string(shim, "DT_RUNPATH", old, "$ORIGIN/../nolib")
    wheel = rewrite_wheel(src, tmp_path / src.name, put={f"{LIB}/rmsnorm_fwd_ja.so": shim.read_bytes()},
                          repin=True)
    res = validate_wheels(wheel).results[0]
    text = failures(res)
    assert not res.ok
    if how == "into-build-tree":
        assert f"(the checkout {REPO})" in text and "when rmsnorm_fwd_ja.so was loaded on its own" in text, text
    else:
        assert "rmsnorm_fwd_ja.so does not load on its own" in text and "RUNPATH" in text, text


def test_tampered_file_fails_the_record_check(good_wheels, validate_wheels, tmp_path):
    name = "jax_aiter/ops/rmsnorm.py"
    src = good_wheels["full"]
    wheel = rewrite_wheel(src, tmp_path / src.name, put={name: member(src, name) + b"\n# edited\n"},
                          fix_record=False)
    res = validate_wheels(wheel).results[0]
    assert [c.name for c in res.checks] == ["wheel-record"], "nothing may be installed from a tampered wheel"
    assert not res.ok
    assert name in res.checks[0].message and "RECORD" in res.checks[0].message, res.checks[0].message


def test_libraries_built_against_a_newer_ffi_api_are_named(good_wheels, native_build, validate_wheels, tmp_path):
    shim = plants.newer_ffi_shim(tmp_path / "scratch", native_build.build_dir)
    src = good_wheels["full"]
    wheel = rewrite_wheel(src, tmp_path / src.name, put={f"{LIB}/rmsnorm_fwd_ja.so": shim.read_bytes()},
                          repin=True)
    text = failures(validate_wheels(wheel).results[0])
    assert "core-ops[cpu]" in text and "FfiVersionError" in text and "built against XLA FFI API 0.4" in text, text
    assert "supports API 0.3" in text, text


def test_wheel_that_only_works_from_the_checkout_fails(good_wheels, validate_wheels, tmp_path):
    """An editable-style wheel: a .pth that puts the checkout on sys.path instead of the package."""
    src = good_wheels["full"]
    with zipfile.ZipFile(src) as zf:
        package = tuple(n for n in zf.namelist() if n.startswith("jax_aiter/") and n.endswith(".py"))
    wheel = rewrite_wheel(src, tmp_path / src.name, drop=package, put={"jax_aiter_dev.pth": f"{REPO}\n".encode()})
    res = validate_wheels(wheel, keep=True).results[0]
    try:
        text = failures(res)
        assert "isolation" in text, text
        assert "jax_aiter resolves to" in text and "inside the checkout" in text, text
        assert "added by jax_aiter_dev.pth" in text, text
        # Proof that the plant is the real thing: from the checkout the same install "works".
        dev = plants.run_from_checkout(Path(res.kept) / "venv", REPO, "import jax_aiter; print(jax_aiter.__file__)")
        assert dev.returncode == 0 and str(REPO) in dev.stdout, dev.stderr
    finally:
        shutil.rmtree(res.kept, ignore_errors=True)


def test_wheel_missing_a_module_names_it(good_wheels, validate_wheels, tmp_path):
    src = good_wheels["full"]
    wheel = rewrite_wheel(src, tmp_path / src.name, drop=("jax_aiter/ops/activation.py",))
    text = failures(validate_wheels(wheel).results[0])
    assert "jax_aiter.ops.activation" in text and "the checkout has it" in text, text


def test_report_json_and_summary(good_wheels, tmp_path, warm_wheelhouse):
    """The CLI: one screen of summary, the same as JSON; the tampered wheel's exit status is 1."""
    name = "jax_aiter/_loader.py"
    src = good_wheels["full"]
    bad = rewrite_wheel(src, tmp_path / src.name, put={name: b"# nothing\n"}, fix_record=False)
    report = tmp_path / "report.json"
    out = subprocess.run(["bash", str(REPO / "scripts/validate_wheel.sh"), str(bad), "--engine", "none",
                          "--no-fill", "--wheelhouse", str(warm_wheelhouse), "--report", str(report)],
                         check=False, capture_output=True, text=True,
                         env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"})
    assert out.returncode == 1, out.stderr
    assert "FAIL  wheel-record" in out.stdout and "FAIL: 0 of 1 wheel(s)" in out.stdout, out.stdout
    data = json.loads(report.read_text())
    assert data["ok"] is False and data["kind"] == "jax-aiter-validation"
    (w,) = data["wheels"]
    assert w["wheel"] == bad.name and len(w["sha256"]) == 64 and w["variant"] == "full"
    assert set(w["phases"]) >= {"wheel", "environment", "install", "smoke", "total"}
    assert w["checks"][0]["name"] == "wheel-record" and name in w["checks"][0]["message"]


def test_a_report_covers_exactly_the_wheels_it_validated(good_wheels, validate_wheels, tmp_path):
    from jatools.validate.cleanroom_report import covers

    report = validate_wheels(good_wheels["full"])
    path = tmp_path / "report.json"
    report.write(path)
    assert covers(path, [good_wheels["full"]])
    assert not covers(path, [good_wheels["full"], good_wheels["lite"]]), "the lite wheel was not validated"
    (tmp_path / "x").mkdir()
    changed = rewrite_wheel(good_wheels["full"], tmp_path / "x" / good_wheels["full"].name, drop=("jax_aiter/info.py",))
    assert not covers(path, [changed]), "a wheel with other bytes is not covered"
    assert not covers(tmp_path / "missing.json", [good_wheels["full"]])


def test_no_wheel_is_an_error_naming_the_build_command(tmp_path):
    with pytest.raises(cleanroom.ValidationError, match="scripts/build_wheel.sh --variant full"):
        cleanroom_inputs.find_wheels(tmp_path, "full")


def _identity_only_wheel(folder: Path, version: str, identity: bytes | None) -> Path:
    """A zip named as a wheel of `version`, holding only the identity file (what choosing wheels reads)."""
    path = folder / f"jax_aiter-{version}-py3-none-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(path, "w") as zf:
        if identity is not None:
            zf.writestr("jax_aiter/_build_identity.json", identity)
    return path


@pytest.mark.parametrize(("version", "named", "variant"), [
    ("0.1.0", "source", "source"),  # a source build keeps the sdist's public version
    ("0.1.0", None, "source"),       # no identity: no lane label means a source build
    ("0.1.0+cpu", "lite", "lite"),  # a lane's label, then the variant's (docs/wheels.md "Lanes")
    ("0.1.0+cpu", None, "lite"),
    ("0.1.0+cuda13.full", "full", "full"),
])
def test_a_wheels_variant_comes_from_the_layout_and_its_identity(tmp_path, version, named, variant):
    ident = None if named is None else json.dumps({"variant": named, "backend": "cpu"}).encode()
    wheel = _identity_only_wheel(tmp_path, version, ident)
    assert cleanroom_inputs.wheel_variant(wheel) == variant
    assert cleanroom_inputs.wheel_identity(wheel) == ({} if ident is None else json.loads(ident))
    if variant == "source":  # --variant lite does not take a source build for a lite wheel
        with pytest.raises(cleanroom.ValidationError, match="none of the given wheels is a lite wheel"):
            cleanroom_inputs.select_wheels([wheel], tmp_path, "lite")


def test_a_wheel_whose_label_no_variant_uses_is_refused_by_name(tmp_path):
    wheel = _identity_only_wheel(tmp_path, "0.1.0+cu12", b"{}")
    with pytest.raises(cleanroom.ValidationError, match=r"\+cu12.*local label 'cu12'"):
        cleanroom_inputs.wheel_variant(wheel)


@pytest.mark.parametrize("identity", [b"not json", b"[1, 2]", b"\xff\xfe"])
def test_an_unreadable_identity_is_empty(tmp_path, identity):
    assert cleanroom_inputs.wheel_identity(_identity_only_wheel(tmp_path, "0.1.0", identity)) == {}


def test_invoke_task_passes_its_flags_through(tmp_path):
    from invoke import Exit, MockContext

    import tasks

    with pytest.raises(Exit) as e:
        tasks.validate(MockContext(), wheel=[str(tmp_path / "missing.whl")], engine="none")
    assert e.value.code == 2
