"""Both variants built from a real CPU build: names, versions, tags, contents, identity, reproducibility, install."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import EPOCH, ROOT, cpu_env
from packaging.utils import parse_wheel_filename

from jatools import config
from jatools.wheel import (
    wheel_build,
    wheel_checks,
    wheel_contents,
    wheel_floor,
    wheel_scan,
)
from jatools.wheel.wheel_build import BuildOptions, WheelBuildError, build
from jax_aiter import op_table

PROJECT_VERSION = config.project_version(ROOT)


def pip_install() -> list[str]:
    """pip of this interpreter, else uv's pip (nox's uv-made venvs have no pip)."""
    if importlib.util.find_spec("pip"):
        return [sys.executable, "-m", "pip", "install", "-q"]
    if shutil.which("uv"):
        return ["uv", "pip", "install", "-q", "--python", sys.executable]
    pytest.skip("neither pip nor uv is available to install the wheel (pip install pip, or install uv)")


def names(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        return zf.namelist()


def auditwheel_show(wheel: Path) -> dict:
    """The real `auditwheel show --json WHEEL`, parsed."""
    out = subprocess.run([sys.executable, "-m", "auditwheel", "show", "--json", str(wheel)], capture_output=True,
                         text=True, check=False)
    assert out.returncode == 0 and "{" in out.stdout, out.stdout + out.stderr
    return json.loads(out.stdout[out.stdout.index("{"):])


def test_floor_is_what_auditwheel_show_measures(wheels):
    """The floor check computes `auditwheel show`'s sym_tag in process (auditwheel's policy table on the symbol
    versions its elfutils finds, from the one scan): the same tag and the same versioned symbols, so the two
    cannot drift apart when auditwheel changes."""
    for result in wheels.values():
        shown = auditwheel_show(result.wheel)
        scanned = wheel_scan.scan(result.wheel)
        ours: dict[str, set[str]] = {}
        for member in scanned.members.values():
            for lib, versions in (member.elf.version_needs if member.elf else {}).items():
                ours.setdefault(lib, set()).update(versions)
        assert {lib: sorted(v) for lib, v in ours.items()} == shown["versioned_symbols"]
        assert wheel_floor.check_floor(scanned).sym_tag == shown["sym_tag"]


def test_names_versions_and_tags(wheels):
    floor = auditwheel_show(wheels["lite"].wheel)["sym_tag"]
    # the lane's label (the CPU build's: cpu), then the variant's: distinct names per backend (docs/wheels.md)
    for variant, version in (("lite", f"{PROJECT_VERSION}+cpu"), ("full", f"{PROJECT_VERSION}+cpu.full")):
        w = wheels[variant].wheel
        assert w.name == f"jax_aiter-{version}-py3-none-{floor}.whl"
        name, ver, build_tag, _ = parse_wheel_filename(w.name)
        assert (str(name), str(ver), build_tag) == ("jax-aiter", version, ())
        with zipfile.ZipFile(w) as zf:
            wheel_file = zf.read(f"jax_aiter-{version}.dist-info/WHEEL").decode()
            metadata = zf.read(f"jax_aiter-{version}.dist-info/METADATA").decode()
        assert f"Tag: py3-none-{floor}\n" in wheel_file
        assert "Root-Is-Purelib: false" in wheel_file
        assert f"version: {version}\n" in metadata.lower()
        assert wheels[variant].tag_source.startswith("measured")


def test_variant_contents(wheels, layout):
    lite, full = names(wheels["lite"].wheel), names(wheels["full"].wheel)
    for variant, members in (("lite", lite), ("full", full)):
        libs = sorted(n.rsplit("/", 1)[1] for n in members if n.startswith("jax_aiter/_lib/"))
        assert libs == sorted(layout.variant(variant).libraries)
        for required in ("jax_aiter/__init__.py", "jax_aiter/__main__.py", "jax_aiter/info.py",
                         "jax_aiter/_loader.py", "jax_aiter/_build_identity.json"):
            assert required in members
        assert members[-1].endswith(".dist-info/RECORD"), "RECORD is written last"
        package = [n for n in members if not n.startswith("jax_aiter-")]
        assert package == sorted(package), "members in a fixed (sorted) order"
    fetched = set(op_table.fetched_libraries(op_table.load()).values())  # the attention JIT libraries
    assert not any(n.rsplit("/", 1)[-1] in fetched for n in lite), "lite never holds the fetched JIT libraries"
    assert set(layout.variant("full").libraries) - set(layout.variant("lite").libraries) <= fetched


def test_record_is_valid_for_an_independent_reader(wheels):
    # the clients group's: imported here, so that a lane tier (the tier group) collects this module
    from wheel.wheelfile import WheelFile

    for result in wheels.values():
        with WheelFile(result.wheel) as wf:  # the `wheel` library checks each member against RECORD as it reads
            for info in wf.infolist():
                wf.read(info.filename)
            assert wf.testzip() is None
        with zipfile.ZipFile(result.wheel) as zf:
            for info in zf.infolist():
                mode = info.external_attr >> 16
                assert mode == (0o100755 if info.filename.endswith(".so") else 0o100644), info.filename
                assert info.date_time[:3] == (2023, 11, 14), "SOURCE_DATE_EPOCH sets every timestamp"


def test_identity_is_baked_in(wheels, native_build):
    record = json.loads((native_build.jit_dir / "build_record.json").read_text())
    for variant, result in wheels.items():
        with zipfile.ZipFile(result.wheel) as zf:
            ident = json.loads(zf.read("jax_aiter/_build_identity.json"))
        for key in ("kernel_source_revision", "recipe_hash", "cache_id", "gpu_archs", "backend", "toolchain",
                    "ffi_api_version"):
            assert ident[key] == record["identity"][key], key
        assert ident["version"] == result.version and ident["variant"] == variant
        assert ident["backend"] == "cpu"


def test_checks_pass_on_good_wheels(wheels, layout):
    for result in wheels.values():
        report = wheel_floor.check_floor(result.wheel)
        assert report.ok, report.message
        contents = wheel_contents.check_contents(result.wheel, layout)
        assert contents.ok, contents.message


def test_check_runs_floor_and_contents_on_the_read_back(build_copy, tmp_path, monkeypatch, capsys):
    """`wheel_build --check` (the nox sessions): the wheel is read once, by the build's read-back, and that
    scan feeds the floor and contents checks."""
    for key, value in {**cpu_env(build_copy.build_dir), "SOURCE_DATE_EPOCH": str(EPOCH)}.items():
        monkeypatch.setenv(key, value)
    scanned, real_scan = [], wheel_scan.scan

    def counted(wheel, *a, **k):
        scanned.append(wheel)
        return real_scan(wheel, *a, **k)
    # every way in: the build's read-back (wheel_scan.scan) and the checks' own (each imports scan)
    for module in (wheel_scan, wheel_checks, wheel_contents, wheel_floor):
        monkeypatch.setattr(module, "scan", counted)
    assert wheel_build.main(["--variant", "lite", "--dist", str(tmp_path), "--check"]) == 0
    out = capsys.readouterr().out
    wheel = next(tmp_path.glob("*.whl"))
    assert f"floor: ok {wheel.name}" in out and f"contents: ok {wheel.name}" in out, out
    assert [w.name for w in scanned] == [f".{wheel.name}.tmp-{os.getpid()}"], "one scan: the read-back's"


def test_rebuild_is_byte_identical(wheels, native_build, layout, tmp_path):
    for variant, first in wheels.items():
        again = build(native_build, BuildOptions(variant=variant, dist_dir=tmp_path / "again", jobs=1,
                                                 source_date_epoch=EPOCH), layout=layout)
        assert again.wheel.name == first.wheel.name
        assert again.wheel.read_bytes() == first.wheel.read_bytes(), f"{variant} differs on rebuild"


def test_default_timestamp_is_the_commit_time_not_the_clock(native_build, layout, tmp_path, monkeypatch):
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    a = build(native_build, BuildOptions(variant="lite", dist_dir=tmp_path / "a"), layout=layout).wheel
    b = build(native_build, BuildOptions(variant="lite", dist_dir=tmp_path / "b"), layout=layout).wheel
    assert a.read_bytes() == b.read_bytes()
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1800000000")
    c = build(native_build, BuildOptions.from_env("lite", tmp_path / "c"), layout=layout).wheel
    with zipfile.ZipFile(c) as zf:
        assert zf.infolist()[0].date_time[:3] == (2027, 1, 15)


def test_plat_name_is_honoured_and_validated(native_build, layout, tmp_path):
    r = build(native_build, BuildOptions(variant="lite", dist_dir=tmp_path, plat_name="manylinux-2.39-x86_64",
                                         source_date_epoch=EPOCH), layout=layout)
    assert r.wheel.name.endswith("-py3-none-manylinux_2_39_x86_64.whl") and r.tag_source == "JA_WHEEL_PLAT_NAME"
    report = wheel_floor.check_floor(r.wheel)
    assert report.ok and "stricter than needed" in report.message
    with pytest.raises(wheel_floor.FloorError, match="not a Linux platform tag"):
        build(native_build, BuildOptions(variant="lite", dist_dir=tmp_path, plat_name="macosx_14_0_arm64"),
              layout=layout)
    with pytest.raises(WheelBuildError, match="for aarch64, but the libraries are x86_64"):
        build(native_build, BuildOptions(variant="lite", dist_dir=tmp_path, plat_name="manylinux_2_34_aarch64"),
              layout=layout)


def test_wheel_arch_must_match_the_jit_archs(native_build, layout, tmp_path):
    with pytest.raises(WheelBuildError, match=r"JA_WHEEL_ARCH=gfx950 but the JIT libraries were built for no GPU "
                                              r"arch \(backend cpu"):
        build(native_build, BuildOptions(variant="lite", dist_dir=tmp_path, wheel_arch="gfx950"), layout=layout)
    assert not list(tmp_path.glob("*.whl"))


def test_installed_wheel_runs_info_and_an_op(wheels, tmp_path):
    """pip installs it; `python -m jax_aiter info` prints the identity and the packaged libraries, without JAX."""
    site = tmp_path / "site"
    subprocess.run(pip_install() + ["--no-deps", "--no-index", "--target", str(site), str(wheels["lite"].wheel)],
                   check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("JA_") and k != "JAX_AITER_LIB_DIR"}
    env.update(PYTHONPATH=str(site), XDG_CACHE_HOME=str(tmp_path / "cache"))
    out = subprocess.run([sys.executable, "-m", "jax_aiter", "info", "--json"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, check=True)
    info = json.loads(out.stdout)
    assert info["variant"] == "lite" and info["version"] == f"{PROJECT_VERSION}+cpu"
    assert info["identity"]["lane"] == "cpu" and info["identity"]["lanes"]["cuda"] == "cuda13"
    assert info["identity"]["cache_id"] == wheels["lite"].identity["cache_id"]
    where = {lib["library"]: lib["path"] for lib in info["libraries"]}
    assert where["libjax_aiter.so"] == str(site / "jax_aiter/_lib/libjax_aiter.so")
    assert where["rmsnorm_fwd_ja.so"] == str(site / "jax_aiter/_lib/rmsnorm_fwd_ja.so")
    no_jax = ("import sys; from jax_aiter import __main__ as m; m.main(['info']); "
              "assert 'jax' not in sys.modules, 'info imported jax'")
    text = subprocess.run([sys.executable, "-c", no_jax],
                          cwd=tmp_path, env=env, capture_output=True, text=True, check=False)
    assert text.returncode == 0, text.stderr
    assert f"jax-aiter {PROJECT_VERSION}+cpu (lite, lane cpu)" in text.stdout  # info names the lane
    assert "NOT FOUND" in text.stdout  # MHA: fetched later
    run_op = ("import jax.numpy as jnp, jax_aiter; "
              "y = jax_aiter.silu_and_mul(jnp.ones((2, 8), jnp.float32)); print(float(y.sum()))")
    op = subprocess.run([sys.executable, "-c", run_op],
                        cwd=tmp_path, env=env, capture_output=True, text=True, check=False)
    assert op.returncode == 0, op.stderr[-2000:]


def test_anchor_route_builds_the_same_files(wheels, native_build, tmp_path):
    """The staged tree is a setuptools project: the reference's route (`pip wheel <stage> --no-deps
    --no-build-isolation`, or the same PEP 517 hook called directly where the venv has no pip) packs the same files."""
    pytest.importorskip("setuptools", reason="setuptools is needed for the pip-wheel comparison route "
                                             "(pip install setuptools; it is in the test extra)")
    stage = native_build.build_dir / "wheel_stage" / "full"
    if importlib.util.find_spec("pip"):
        cmd = [sys.executable, "-m", "pip", "wheel", str(stage), "--no-deps", "--no-build-isolation", "-q",
               "-w", str(tmp_path)]
    else:
        hook = (f"import os; os.chdir({str(stage)!r}); from setuptools import build_meta; "
                f"build_meta.build_wheel({str(tmp_path)!r})")
        cmd = [sys.executable, "-c", hook]
    out = subprocess.run(cmd, capture_output=True, text=True, env=cpu_env(), check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    anchor = next(tmp_path.glob("*.whl"))
    assert anchor.name == wheels["full"].wheel.name
    ours = {n for n in names(wheels["full"].wheel) if ".dist-info/" not in n}
    theirs = {n for n in names(anchor) if ".dist-info/" not in n}
    assert ours == theirs
