"""Planted defects: each is caught by the check that owns it, with a message naming the cause and the fix."""
from __future__ import annotations

import contextlib
import hashlib
import json
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from conftest import EPOCH
from invoke import Context, Exit
from wheel_plant import patch_dynamic_string, rewrite_wheel

import tasks
from jatools.jitlibs import expect
from jatools.wheel import (
    runpath,
    wheel_build,
    wheel_checks,
    wheel_contents,
    wheel_floor,
    wheel_stage,
    zip_writer,
)
from jatools.wheel.wheel_build import BuildOptions, WheelBuildError, build
from jax_aiter.integrity import IntegrityError

SHIM_RUNPATH = "$ORIGIN:$ORIGIN/../aiter_build"
ROOT = Path(__file__).resolve().parents[2]


def _opts(tmp_path, variant="lite", **kw):
    return BuildOptions(variant=variant, dist_dir=tmp_path / "dist", source_date_epoch=EPOCH, **kw)


def _no_wheels(tmp_path):
    return not list((tmp_path / "dist").glob("*.whl*")) and not list((tmp_path / "dist").glob(".*.whl*"))


# --- a library changed after its record was written -----------------------------------------------------

@pytest.mark.parametrize("folder, name, says", [
    ("jit_dir", "librmsnorm_fwd.so", ("does not match", "`nox -s jit`", "invoke jit.fetch")),
    ("umbrella_dir", "libjax_aiter.so", ("size", "changed after make linked it", "make -B")),  # issue 27
])
def test_faults_library_modified_after_its_record_fails_before_staging(build_copy, layout, tmp_path, folder, name,
                                                                       says):
    lib = getattr(build_copy, folder) / name
    lib.write_bytes(lib.read_bytes() + b"\0")
    with pytest.raises(IntegrityError) as e:
        build(build_copy, _opts(tmp_path), layout=layout)
    msg = str(e.value)
    assert str(lib) in msg and "build_record.json" in msg and all(s in msg for s in says), msg
    assert not (build_copy.build_dir / "wheel_stage").exists(), "nothing is staged from unverified bytes"
    assert _no_wheels(tmp_path)


def test_jit_library_changed_after_staging_is_caught_by_the_read_back(build_copy, layout, tmp_path, monkeypatch):
    real_stage = wheel_stage.stage

    def stage_then_tamper(*args, **kwargs):
        stage_dir, how, digests = real_stage(*args, **kwargs)
        staged = stage_dir / layout.lib_dir / "librmsnorm_fwd.so"
        staged.write_bytes(staged.read_bytes()[:-1] + b"\x01")
        return stage_dir, how, digests

    monkeypatch.setattr(wheel_stage, "stage", stage_then_tamper)
    # the wheel's copy is the recorded library with its RUNPATH made the wheel's (runpath.py), held to that digest
    with pytest.raises(IntegrityError, match=r"whl.tmp-\d+:jax_aiter/_lib/librmsnorm_fwd.so: \w+, but staging wrote "
                                             r"sha256 \w+: the stage was changed after staging"):
        build(build_copy, _opts(tmp_path), layout=layout)
    assert _no_wheels(tmp_path), "the temporary wheel is removed, no wheel appears"


def test_bytes_that_differ_in_the_written_wheel_are_caught_by_the_read_back(build_copy, layout, tmp_path,
                                                                            monkeypatch):
    """The zip on disk differs from what was compressed (one flipped byte) -> reading it back fails the build."""
    member = "jax_aiter/_lib/librmsnorm_fwd.so"
    real_write = zip_writer.DeterministicZipWriter._write

    def flip_a_byte(self, arcname, *args):
        written = real_write(self, arcname, *args)
        if arcname == member:
            end, at = self._fp.tell(), written.offset + 30 + len(arcname) + written.compressed_size // 2
            self._fp.flush()
            with open(self._fp.name, "rb") as f:
                f.seek(at)
                byte = f.read(1)[0]
            self._fp.seek(at)
            self._fp.write(bytes([byte ^ 0xFF]))
            self._fp.seek(end)
        return written

    monkeypatch.setattr(zip_writer.DeterministicZipWriter, "_write", flip_a_byte)
    with pytest.raises(IntegrityError, match=r"reading the new wheel back failed: .*librmsnorm_fwd.so"):
        build(build_copy, _opts(tmp_path), layout=layout)
    assert _no_wheels(tmp_path)


def test_read_back_compares_jit_members_with_the_record(wheels, native_build, tmp_path):
    """A wheel whose JIT member is self-consistent (RECORD fixed) but not the recorded build fails read-back."""
    src = wheels["lite"].wheel
    member = "jax_aiter/_lib/librmsnorm_fwd.so"
    with zipfile.ZipFile(src) as zf:
        data = zf.read(member)
    bad = rewrite_wheel(src, tmp_path / src.name, put={member: data + b"\0"})
    expectations = expect.expectations(native_build)
    with pytest.raises(IntegrityError, match=r"librmsnorm_fwd.so: sha256 \w+ does not match \w+ recorded in"):
        wheel_build.read_back(bad, [], {member: "librmsnorm_fwd.so"}, expectations, None)


def test_missing_build_record_names_the_producing_command(build_copy, layout, tmp_path):
    (build_copy.jit_dir / "build_record.json").unlink()
    with pytest.raises(WheelBuildError, match=r"build_record.json is missing.*nox -s jit.*invoke jit.fetch"):
        build(build_copy, _opts(tmp_path), layout=layout)


# --- a file missing from a variant ------------------------------------------------------------------------

def test_missing_jit_library_fails_at_once_without_running_build_jit(build_copy, layout, tmp_path):
    (build_copy.jit_dir / "librmsnorm_fwd.so").unlink()
    with pytest.raises(WheelBuildError) as e:
        build(build_copy, _opts(tmp_path, "full"), layout=layout)
    msg = str(e.value)
    assert "librmsnorm_fwd.so" in msg
    assert "nox -s jit -- --module rmsnorm_fwd" in msg and "invoke jit.fetch" in msg
    assert "never runs build_jit.py" in msg


def test_real_layout_needs_the_mha_libraries_for_full(build_copy, tmp_path):
    """With the production layout, a tree without libmha_*.so cannot make a full wheel (says which command)."""
    for name in ("libmha_fwd.so", "libmha_bwd.so"):
        (build_copy.jit_dir / name).unlink(missing_ok=True)
    with pytest.raises(WheelBuildError, match=r"libmha_fwd.so \(produce it with: build the JIT libraries "
                                              r"with `nox -s jit -- --module mha_fwd`"):
        build(build_copy, _opts(tmp_path, "full"))


def test_missing_shim_names_make_ja_mods(build_copy, layout, tmp_path):
    (build_copy.umbrella_dir / "silu_and_mul_ja.so").unlink()
    with pytest.raises(WheelBuildError, match=r"silu_and_mul_ja.so \(produce it with: make ja_mods"):
        build(build_copy, _opts(tmp_path), layout=layout)


@pytest.mark.parametrize("member", ["jax_aiter/_lib/silu_and_mul_ja.so", "jax_aiter/op_table.toml"])
def test_contents_catches_a_file_missing_from_the_variant(wheels, layout, tmp_path, member):
    src = wheels["lite"].wheel
    with zipfile.ZipFile(src) as zf:
        assert member in zf.namelist()
    bad = rewrite_wheel(src, tmp_path / src.name, drop=(member,))
    report = wheel_contents.check_contents(bad, layout)
    assert not report.ok
    assert f"{member} is missing from the lite wheel" in report.message


def test_contents_catches_mha_libraries_in_lite(wheels, layout, tmp_path):
    src = wheels["lite"].wheel
    with zipfile.ZipFile(src) as zf:
        elf_bytes = zf.read("jax_aiter/_lib/librmsnorm_fwd.so")
    bad = rewrite_wheel(src, tmp_path / src.name, put={"jax_aiter/_lib/libmha_fwd.so": elf_bytes})
    report = wheel_contents.check_contents(bad, layout)
    assert "jax_aiter/_lib/libmha_fwd.so must not be in the lite wheel (users fetch it with jax-aiter-fetch-mha)" \
        in report.message


def test_contents_catches_stray_files_and_tampering(wheels, layout, tmp_path):
    src = wheels["full"].wheel
    (tmp_path / "a").mkdir()
    stray = rewrite_wheel(src, tmp_path / "a" / src.name,
                          put={"jax_aiter/_lib/build_record.json": b"{}", "notes.txt": b"x"})
    msg = wheel_contents.check_contents(stray, layout).message
    assert "jax_aiter/_lib/build_record.json is not expected in a wheel" in msg
    assert "notes.txt is not expected in a wheel" in msg
    (tmp_path / "b").mkdir()
    tampered = rewrite_wheel(src, tmp_path / "b" / src.name, put={"jax_aiter/info.py": b"print('hi')\n"},
                             fix_record=False)
    msg = wheel_contents.check_contents(tampered, layout).message
    assert "jax_aiter/info.py: RECORD says sha256=" in msg and "altered after it was built" in msg


# --- RUNPATH and external libraries ------------------------------------------------------------------------

@pytest.mark.parametrize("entry, expected", [
    ("/work/build/aiter_build", "is not relative to $ORIGIN (a build-machine path)"),
    ("$ORIGIN/../_rocm_sdk_devel/lib", "names _rocm_sdk_devel"),
    ("$ORIGIN/../../../../lib", "points outside the wheel"),
])
def test_contents_catches_bad_runpath(build_copy, layout, tmp_path, entry, expected):
    patch_dynamic_string(build_copy.umbrella_dir / "silu_and_mul_ja.so", "DT_RUNPATH", SHIM_RUNPATH, entry,
                         as_linked=True)
    wheel = build(build_copy, _opts(tmp_path), layout=layout).wheel
    report = wheel_contents.check_contents(wheel, layout)
    assert not report.ok
    assert f"jax_aiter/_lib/silu_and_mul_ja.so: RUNPATH entry {entry!r} {expected}" in report.message


def test_faults_contents_rejects_an_empty_runpath_entry(build_copy, layout, tmp_path):
    """`:$ORIGIN` has an empty entry, which glibc reads as the current directory."""
    patch_dynamic_string(build_copy.umbrella_dir / "silu_and_mul_ja.so", "DT_RUNPATH", SHIM_RUNPATH, ":$ORIGIN",
                         as_linked=True)
    wheel = build(build_copy, _opts(tmp_path), layout=layout).wheel
    report = wheel_contents.check_contents(wheel, layout)
    assert not report.ok
    assert ("jax_aiter/_lib/silu_and_mul_ja.so: RUNPATH has an empty entry (':$ORIGIN'), which glibc reads as the "
            "current directory") in report.message
    assert wheel_checks.main(["--contents", str(wheel)]) != 0


def test_faults_shim_without_a_link_record_is_refused(build_copy, layout, tmp_path):
    record = build_copy.umbrella_dir / "build_record.json"
    data = json.loads(record.read_text())
    data["files"] = [f for f in data["files"] if f["name"] != "silu_and_mul_ja.so"]
    record.write_text(json.dumps(data))
    with pytest.raises(WheelBuildError, match=r"silu_and_mul_ja.so has no record of what was linked; run `make && "
                                              r"make ja_mods`"):
        build(build_copy, _opts(tmp_path), layout=layout)


def test_faults_lite_wheel_pins_every_library_and_bakes_the_base_url(build_copy, layout, tmp_path):
    """The identity inside the wheel pins each library it ships (as linked / built, with the RUNPATH the wheel
    needs: runpath.py) and each JIT library of its cache id (the attention ones it fetches, as published), and
    names pyproject's jit_libs_base_url."""
    wheel = build(build_copy, _opts(tmp_path), layout=layout).wheel
    with zipfile.ZipFile(wheel) as z:
        ident = json.loads(z.read(layout.identity_file))
        shipped = {n.rsplit("/", 1)[-1] for n in z.namelist() if n.startswith(layout.lib_dir + "/")}
    assert ident["fetch_base_url"] == build_copy.raw["jit_libs_base_url"]
    pins = {p["name"]: p for p in ident["pins"]}
    recorded = {**json.loads((build_copy.umbrella_dir / "build_record.json").read_text()),
                "jit": json.loads((build_copy.jit_dir / "build_record.json").read_text())}
    want = {f["name"]: f for f in recorded["files"] + recorded["jit"]["files"]}
    assert shipped <= set(pins)
    assert {n for n in want if n.startswith("lib") and n not in shipped} <= set(pins)  # the fetched ones too
    for name, pin in pins.items():
        if name not in shipped:  # fetched: the published bytes, as recorded
            assert pin == {"name": name, "size": want[name]["size"], "sha256": want[name]["sha256"]}
            continue
        folder = build_copy.jit_dir if name.startswith("lib") and name != "libjax_aiter.so" else build_copy.umbrella_dir
        data = bytearray((folder / name).read_bytes())
        assert hashlib.sha256(data).hexdigest() == want[name]["sha256"]
        runpath.for_wheel(data, name)
        assert pin == {"name": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_faults_wheel_build_removes_what_a_killed_build_left(build_copy, layout, tmp_path):
    dist, stage = tmp_path / "dist", build_copy.build_dir / "wheel_stage"
    dist.mkdir()
    (stage / f".lite.tmp-{_dead_pid()}" / "jax_aiter").mkdir(parents=True)
    dead_wheel = dist / f".jax_aiter-0.1.0-py3-none-any.whl.tmp-{_dead_pid()}"
    dead_wheel.write_bytes(b"half a wheel")
    live = subprocess.Popen(["sleep", "60"])
    try:
        live_tmp = dist / f".jax_aiter-0.1.0-py3-none-any.whl.tmp-{live.pid}"
        live_tmp.write_bytes(b"a build still running")
        lines = []
        build(build_copy, _opts(tmp_path), layout=layout, log=lines.append)
        assert not dead_wheel.exists() and not list(stage.glob(".lite.tmp-*"))
        assert live_tmp.exists(), "a running build's files are left alone"
        assert any("no longer running" in m and str(dead_wheel) in m for m in lines)
    finally:
        live.kill()
        live.wait()


def test_faults_two_wheel_builds_at_once_take_turns(build_copy, layout, tmp_path):
    """Two real build processes on one build tree and one dist folder, started while the stage is locked:
    both wait, then take turns, and both succeed."""
    from conftest import cpu_env
    from filelock import FileLock

    env = {**cpu_env(build_copy.build_dir), "SOURCE_DATE_EPOCH": str(EPOCH), "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "jatools.wheel.wheel_build", "--variant", "lite", "--dist", str(tmp_path / "dist")]
    logs = [tmp_path / f"build{i}.log" for i in range(2)]
    with FileLock(str(build_copy.build_dir / ".wheel_stage.lock")), contextlib.ExitStack() as files:
        procs = [subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=files.enter_context(open(log, "w")),
                                  stderr=subprocess.STDOUT) for log in logs]
        deadline = time.monotonic() + 120
        while not all("another wheel build holds" in log.read_text() for log in logs):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), [x.read_text() for x in logs]
            time.sleep(0.1)
    assert [p.wait(timeout=600) for p in procs] == [0, 0], [x.read_text() for x in logs]
    wheels = list((tmp_path / "dist").glob("*.whl"))
    assert len(wheels) == 1 and wheel_contents.check_contents(wheels[0], layout).ok
    assert not list((tmp_path / "dist").glob(".*.tmp-*"))


def test_contents_catches_an_external_library_outside_the_allowlist(build_copy, layout, tmp_path):
    patch_dynamic_string(build_copy.umbrella_dir / "silu_and_mul_ja.so", "DT_NEEDED", "libm.so.6", "libz.so.1",
                         as_linked=True)
    wheel = build(build_copy, _opts(tmp_path), layout=layout).wheel
    msg = wheel_contents.check_contents(wheel, layout).message
    assert "jax_aiter/_lib/silu_and_mul_ja.so needs libz.so.1, which is neither in the wheel nor allowed from " \
           "outside for the cpu backend" in msg


# --- platform tag older than the symbols allow ----------------------------------------------------------------

def test_floor_catches_manylinux_2_28_with_glibcxx_3_4_29(native_build, layout, tmp_path):
    """A wheel retagged after its build (the build itself never writes an unearned tag) fails the floor check."""
    built = build(native_build, _opts(tmp_path), layout=layout).wheel
    wheel = tmp_path / built.name.replace(built.name.rsplit("-", 1)[1], "manylinux_2_28_x86_64.whl")
    wheel_text = next(n for n in zipfile.ZipFile(built).namelist() if n.endswith(".dist-info/WHEEL"))
    rewrite_wheel(built, wheel, put={wheel_text: zipfile.ZipFile(built).read(wheel_text).replace(
        b"manylinux_2_34_x86_64", b"manylinux_2_28_x86_64")})
    report = wheel_floor.check_floor(wheel)
    assert not report.ok
    msg = report.message
    assert "tagged manylinux_2_28_x86_64, but the versioned symbols need manylinux_2_34_x86_64" in msg
    symbols = msg[msg.index("GLIBCXX_3.4.29 (needs manylinux_2_34_x86_64) from "):].split(";")[0]
    assert "rmsnorm_fwd_ja.so" in symbols and "silu_and_mul_ja.so" in symbols, msg
    assert "JA_WHEEL_PLAT_NAME" in msg
    with pytest.raises(Exit) as e:
        tasks.floor(Context(), wheel=str(wheel))
    assert e.value.code == 1 and "GLIBCXX_3.4.29" in str(e.value.message)


def test_command_line_reports_errors_with_exit_code_2(tmp_path):
    """`python -m jatools.wheel.wheel_build` on an empty build tree: one line naming what is missing, exit 2."""
    import subprocess
    import sys

    from conftest import ROOT, cpu_env

    out = subprocess.run([sys.executable, "-m", "jatools.wheel.wheel_build", "--variant", "lite", "--dist",
                          str(tmp_path / "dist")], cwd=ROOT, env=cpu_env(tmp_path / "empty-build"),
                         capture_output=True, text=True, check=False)
    assert out.returncode == 2
    assert out.stderr.startswith("wheel_build: error: the lite wheel needs libraries that are not built")
    assert "libjax_aiter.so (produce it with: make" in out.stderr and "Traceback" not in out.stderr


def test_floor_and_contents_refuse_what_is_not_a_wheel(tmp_path, capsys):
    """An sdist given to the floor or contents check fails, naming the check that reads it, never passes unread."""
    sdist = tmp_path / "jax_aiter-0.1.0.tar.gz"
    sdist.write_bytes(b"not read")
    assert wheel_checks.main(["--floor", "--contents", str(sdist)]) == 1
    err = capsys.readouterr().err
    for check in ("floor", "contents"):
        assert f"{check}: FAIL jax_aiter-0.1.0.tar.gz is not a wheel; only the clients check an sdist" in err, err
