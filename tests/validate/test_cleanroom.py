"""Clean-room validation end to end: real wheels, real venvs, a real offline install, real smoke runs.

A good wheel passes; each planted defect fails validation with a message that
names its cause.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from jatools import cleanroom
from tests.validate import plants, wheel_factory
from tests.validate.conftest import REPO, failures, lib_copy


def test_good_full_wheel_passes_every_check(good_wheels, validate_wheels, tmp_path):
    report = validate_wheels(good_wheels["full"], report=tmp_path / "r.json")
    res = report.results[0]
    assert res.ok, failures(res)
    names = {c.name for c in res.checks}
    for must in ("wheel-record", "venv", "install", "isolation", "installed-bytes", "identity", "load-alone",
                 "core-ops[cpu]", "attention[cpu]", "library-origin"):
        assert must in names, f"{must} did not run: {sorted(names)}"
    assert "fetch" not in names, "a full wheel must not need a fetch"


def test_missing_library_is_named(validate_wheels, tmp_path, built):
    libs = [p for p in wheel_factory.checkout_libs("full") if p.name != "librmsnorm_fwd.so"]
    wheel = wheel_factory.build(tmp_path, "full", libs)
    res = validate_wheels(wheel).results[0]
    assert not res.ok
    text = failures(res)
    assert "load-alone" in text and "librmsnorm_fwd.so" in text, text
    assert "core-ops[cpu]" in text and "librmsnorm_fwd.so not found" in text, text


@pytest.mark.parametrize("how", ["into-checkout", "nowhere"])
def test_broken_runpath_is_named(validate_wheels, tmp_path, built, how):
    libs = lib_copy(tmp_path / "libs")
    shim = next(p for p in libs if p.name == "rmsnorm_fwd_ja.so")
    if how == "into-checkout":  # works on the build machine only: the classic absolute build-tree RUNPATH
        links = plants.short_links([REPO / "build/jax_aiter_build", REPO / "build/aiter_build"], tmp_path.name[-5:])
        plants.set_runpath(shim, ":".join(map(str, links)))
    else:
        plants.set_runpath(shim, "$ORIGIN/../nolib")
    res = validate_wheels(wheel_factory.build(tmp_path / "dist", "full", libs)).results[0]
    text = failures(res)
    assert not res.ok
    assert "load-alone: rmsnorm_fwd_ja.so" in text or "when rmsnorm_fwd_ja.so was loaded on its own" in text, text
    if how == "into-checkout":
        assert f"(the checkout {REPO})" in text and "check its RUNPATH" in text, text
    else:
        assert "does not load on its own" in text and "RUNPATH" in text, text


def test_tampered_file_fails_the_record_check(good_wheels, validate_wheels, tmp_path):
    member = "jax_aiter/ops/rmsnorm.py"
    wheel = plants.replace_member(good_wheels["full"], member,
                                  (REPO / member).read_bytes() + b"\n# edited after the build\n", tmp_path)
    res = validate_wheels(wheel).results[0]
    assert [c.name for c in res.checks] == ["wheel-record"], "nothing may be installed from a tampered wheel"
    assert not res.ok
    assert member in res.checks[0].message and "RECORD" in res.checks[0].message, res.checks[0].message


def test_libraries_built_against_a_newer_ffi_api_are_named(validate_wheels, tmp_path, built):
    shim = plants.newer_ffi_shim(tmp_path / "scratch", REPO / "build/aiter_build/librmsnorm_fwd.so")
    libs = [shim] + [p for p in wheel_factory.checkout_libs("full") if p.name != shim.name]
    res = validate_wheels(wheel_factory.build(tmp_path / "dist", "full", libs)).results[0]
    text = failures(res)
    assert "core-ops[cpu]" in text and "FfiVersionError" in text and "built against XLA FFI API 0.4" in text, text
    assert "supports API 0.3" in text, text


def test_wheel_that_only_works_from_the_checkout_fails(validate_wheels, tmp_path, built):
    """An editable-style wheel: a .pth that puts the checkout on sys.path instead of the package."""
    wheel = wheel_factory.build(tmp_path, "full", wheel_factory.checkout_libs("full"), skip_py=("jax_aiter/",),
                                extra={"jax_aiter_dev.pth": f"{REPO}\n".encode()})
    res = validate_wheels(wheel, keep=True).results[0]
    try:
        text = failures(res)
        assert "isolation" in text, text
        assert "jax_aiter resolves to" in text and "inside the checkout" in text, text
        assert "added by jax_aiter_dev.pth" in text, text
        # Proof that the plant is the real thing: from the checkout the same install "works".
        venv = Path(res.kept) / "venv"
        dev = plants.run_from_checkout(venv, REPO, "import jax_aiter, sys; print(jax_aiter.__file__)")
        assert dev.returncode == 0 and str(REPO) in dev.stdout, dev.stderr
    finally:
        subprocess.run(["rm", "-rf", res.kept])


def test_wheel_missing_a_module_names_it(validate_wheels, tmp_path, built):
    wheel = wheel_factory.build(tmp_path, "full", wheel_factory.checkout_libs("full"),
                                skip_py=("jax_aiter/ops/activation.py",))
    text = failures(validate_wheels(wheel).results[0])
    assert "jax_aiter.ops.activation" in text and "the checkout has it" in text, text


def test_report_json_and_summary(good_wheels, tmp_path, warm_wheelhouse):
    """The CLI: one screen of summary, the same as JSON; the tampered wheel's exit status is 1."""
    member = "jax_aiter/_loader.py"
    bad = plants.replace_member(good_wheels["full"], member, b"# nothing\n", tmp_path / "bad")
    report = tmp_path / "report.json"
    out = subprocess.run(["bash", str(REPO / "scripts/validate_wheel.sh"), str(bad), "--engine", "none",
                          "--no-fill", "--wheelhouse", str(warm_wheelhouse), "--report", str(report)],
                         capture_output=True, text=True, env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"})
    assert out.returncode == 1, out.stderr
    assert "FAIL  wheel-record" in out.stdout and "FAIL: 0 of 1 wheel(s)" in out.stdout, out.stdout
    data = json.loads(report.read_text())
    assert data["ok"] is False and data["kind"] == "jax-aiter-validation"
    (w,) = data["wheels"]
    assert w["wheel"] == bad.name and len(w["sha256"]) == 64 and w["variant"] == "full"
    assert set(w["phases"]) >= {"wheel", "environment", "install", "smoke", "total"}
    assert w["checks"][0]["name"] == "wheel-record" and member in w["checks"][0]["message"]


def test_no_wheel_is_an_error_naming_the_build_command(tmp_path):
    with pytest.raises(cleanroom.ValidationError, match="scripts/build_wheel.sh --variant full"):
        cleanroom.find_wheels(tmp_path, "full")


def test_invoke_task_passes_its_flags_through(tmp_path):
    from invoke import Exit, MockContext

    import tasks

    with pytest.raises(Exit) as e:
        tasks.validate_run(MockContext(), wheel=[str(tmp_path / "missing.whl")], engine="none")
    assert e.value.code == 2
