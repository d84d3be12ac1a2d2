"""Faults of the wheels: a library changed after the build with RECORD regenerated to match, a Python file
changed in the stage after staging, a wheel that fails --check. Real wheels built by the real wheel builder from
a private copy of the wheel tests' CPU build (tests/wheel/conftest.py: its fixtures, shared), checked by real
processes."""
from __future__ import annotations

import json
import posixpath
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from jatools import config
from jatools.wheel import wheel_build, wheel_contents, wheel_scan
from jatools.wheel.wheel_layout import Layout
from jax_aiter.integrity import IntegrityError
from tests.faults.mounts import fill, mounted
from tests.wheel.conftest import EPOCH, ROOT, cpu_env
from tests.wheel.wheel_plant import rewrite_wheel


def _env(settings: config.Settings) -> dict[str, str]:
    """The wheel tests' CPU environment for a private build tree, as a process sees it."""
    return {**cpu_env(settings.build_dir), "PYTHONPATH": str(ROOT), "SOURCE_DATE_EPOCH": str(EPOCH)}


def _build(settings: config.Settings, variant: str, dist: Path, log=lambda m: None) -> wheel_build.BuildResult:
    return wheel_build.build(settings, wheel_build.BuildOptions(variant=variant, dist_dir=dist,
                                                                 source_date_epoch=EPOCH), log=log)


def _checks(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "jatools.wheel.wheel_checks", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300, check=False)


def test_faults_library_changed_after_the_build_with_record_regenerated_fails_contents(build_copy, tmp_path):
    """libmha_fwd.so altered (same size) and RECORD rewritten to match: RECORD agrees, the pins do not.
    `invoke contents` (wheel_checks --contents) and the clean room's first check refuse it."""
    good = _build(build_copy, "full", tmp_path / "dist").wheel
    assert wheel_contents.check_contents(good).ok and wheel_scan.verify_pins(good) > 0
    member = "jax_aiter/_lib/libmha_fwd.so"
    with zipfile.ZipFile(good) as zf:
        data = bytearray(zf.read(member))
    data[len(data) // 2] ^= 0xFF
    (tmp_path / "bad").mkdir()
    bad = rewrite_wheel(good, tmp_path / "bad" / good.name, put={member: bytes(data)})
    assert wheel_scan.verify_record(bad) > 0  # self-consistent: RECORD alone cannot tell
    r = _checks("--contents", str(bad), env=_env(build_copy))
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"{member} is sha256" in r.stderr and "its pin in jax_aiter/_build_identity.json" in r.stderr, r.stderr
    with pytest.raises(wheel_scan.RecordError, match="the library was changed after the wheel was built"):
        wheel_scan.verify_pins(bad)


def test_faults_python_file_changed_in_the_stage_after_staging_does_not_ship(build_copy, tmp_path):
    """Another process edits build/wheel_stage/lite/jax_aiter/info.py between staging and packing: the read-back
    refuses the wheel (only the libraries were re-checked before) and nothing is left in dist/."""
    stage = build_copy.path("wheel_stage") / "lite" / "jax_aiter" / "info.py"

    def tamper(line: str) -> None:
        if line.startswith("wheel_build: staged "):
            with open(stage, "a") as f:
                f.write("\nprint('planted')\n")
    with pytest.raises(IntegrityError, match=r"jax_aiter/info.py: .* but staging wrote sha256 .* the stage was "
                                             r"changed after staging"):
        _build(build_copy, "lite", tmp_path / "dist", log=tamper)
    assert not list((tmp_path / "dist").glob("*.whl"))


@pytest.mark.parametrize("check", [["--check"], []], ids=["with-check", "without-check"])
def test_faults_an_unearned_tag_is_never_written(build_copy, tmp_path, check):
    """JA_WHEEL_PLAT_NAME=manylinux_2_5 on libraries whose symbols need 2_34 (issue 84: written with exit 0 without
    --check): the build refuses it, with --check or without, naming the symbols and the fix; a good wheel built
    before it stays in dist/, and nothing else is there."""
    dist = tmp_path / "dist"
    env = _env(build_copy)
    ok = subprocess.run([sys.executable, "-m", "jatools.wheel.wheel_build", "--variant", "full", "--dist", str(dist),
                         "--check"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert ok.returncode == 0, ok.stderr
    good = sorted(dist.glob("*.whl"))
    r = subprocess.run([sys.executable, "-m", "jatools.wheel.wheel_build", "--variant", "lite", "--dist", str(dist),
                        *check], env={**env, "JA_WHEEL_PLAT_NAME": "manylinux_2_5_x86_64"}, cwd=ROOT,
                       capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 2, r.stdout + r.stderr
    assert ("the tag comes from JA_WHEEL_PLAT_NAME and claims more than the libraries earn" in r.stderr
            and "but the versioned symbols need manylinux_2_34_x86_64" in r.stderr
            and "Fix: tag it" in r.stderr), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, "one line"
    assert sorted(dist.glob("*.whl")) == good and not list(dist.glob(".*.tmp*")), "only the good wheel stays"


def test_faults_wheel_build_on_a_full_disk_names_the_path(build_copy, tmp_path):
    """dist/ on a full disk (a real 64 KiB tmpfs): the wheel build said `[Errno 28] No space left on device` and no
    path. Now one line names the wheel it could not write and the fix, and no temporary file is left there."""
    with mounted(["-t", "tmpfs", "-o", "size=64k", "tmpfs"], tmp_path / "disk", "a small tmpfs") as disk:
        fill(disk / "filler")
        r = subprocess.run([sys.executable, "-m", "jatools.wheel.wheel_build", "--variant", "lite", "--dist",
                            str(disk)], env=_env(build_copy), cwd=ROOT, capture_output=True, text=True, timeout=600,
                           check=False)
        left = sorted(p.name for p in disk.iterdir())
    assert r.returncode == 2, r.stdout + r.stderr
    said = [line for line in r.stderr.splitlines() if "error" in line]
    assert len(said) == 1 and re.search(rf"wheel_build: error: cannot write {re.escape(str(disk))}/jax_aiter-\S+\.whl: "
                                        r"No space left on device; free some space on its disk, or build the wheel "
                                        r"into another folder \(--dist DIR\)", said[0]), r.stderr
    assert "Traceback" not in r.stderr and not [n for n in left if ".tmp" in n], left


def test_faults_check_refuses_jit_libraries_of_another_commit(build_copy, tmp_path):
    """build/aiter_build built at another commit (its record names other kernel sources) and the checkout here:
    `wheel_build --variant full --check` exited 0 and packed them. It now refuses the wheel, naming both cache ids
    and the field that differs, and removes it from dist/."""
    import json

    from jax_aiter.download import reuse_gate

    record_path = build_copy.jit_dir / "build_record.json"
    record = json.loads(record_path.read_text())
    ident_before = record["identity"]
    ident = dict(ident_before, kernel_source_revision="0" * 40)
    ident["cache_id"] = reuse_gate.cache_id(ident)
    record["identity"] = ident
    for m in record["modules"].values():
        m["identity"] = ident
    record_path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    dist = tmp_path / "dist"
    r = subprocess.run([sys.executable, "-m", "jatools.wheel.wheel_build", "--variant", "full", "--dist", str(dist),
                        "--check"], env=_env(build_copy), cwd=ROOT, capture_output=True, text=True, timeout=600,
                       check=False)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"the JIT libraries (cache id {ident['cache_id']}) are not this checkout's (cache id " in r.stderr, r.stderr
    assert f"kernel_source_revision: wanted {ident_before['kernel_source_revision']}, found {'0' * 40}" in r.stderr
    assert "it failed the checks above" in r.stderr and not list(dist.glob("*.whl"))


@pytest.mark.parametrize("slip", ["../../{target}/evil.py", "/{target}/evil.py", "jax_aiter/..\\\\..\\\\evil.py"])
def test_faults_validate_refuses_a_zip_slip_wheel_before_installing(build_copy, tmp_path, slip):
    """A wheel with a member whose name leads outside the install folder, RECORD rewritten to match: `invoke
    validate` installed it before the installer refused it. Its first check (wheel-record) now refuses it, naming
    the member, and nothing is installed or written."""
    from jatools.validate import cleanroom

    good = _build(build_copy, "full", tmp_path / "dist").wheel
    target = tmp_path / "outside"
    name = slip.format(target=str(target).lstrip("/"))
    (tmp_path / "bad").mkdir()
    bad = rewrite_wheel(good, tmp_path / "bad" / good.name, put={name: b"print('escaped')\n"})
    opts = cleanroom.Options(root=ROOT, wheels=[bad], engine="none", fill=False, log=lambda m: None)
    result = cleanroom.validate_wheel(bad, opts, None, tmp_path / "no-wheelhouse", Path(sys.executable), [])
    assert [(c.name, c.ok) for c in result.checks] == [("wheel-record", False)], result.checks
    assert f"has member(s) that would be written outside the install folder: {name!r}" in result.checks[0].message
    assert "a zip-slip wheel" in result.checks[0].message and not target.exists()


# --- tags, RUNPATHs and the Python package: earned at every front-end (issue 84, goal 2) ----------------------

FRONT_ENDS = {  # the project's own backend, as each front-end users type drives it (its isolation off: offline)
    "python -m jatools.wheel.wheel_build": lambda out: [sys.executable, "-m", "jatools.wheel.wheel_build", "--variant",
                                                        "lite", "--dist", str(out)],
    "pip wheel .": lambda out: [sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation",
                                "--disable-pip-version-check", "-w", str(out)],
    "python -m build": lambda out: [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out),
                                    "."],
}


@pytest.mark.parametrize("front", FRONT_ENDS)
def test_faults_no_front_end_writes_a_tag_the_symbols_do_not_earn(build_copy, tmp_path, front):
    """JA_WHEEL_PLAT_NAME=manylinux_2_5_x86_64 through every front-end (issue 84: `pip wheel .` wrote it with exit 0):
    each fails, saying the tag is not earned and what to do, and writes no wheel; a tag the symbols earn is taken."""
    out = tmp_path / "out"
    env = {**_env(build_copy), "JA_WHEEL_PLAT_NAME": "manylinux_2_5_x86_64"}
    r = subprocess.run(FRONT_ENDS[front](out), env=env, cwd=ROOT, capture_output=True, text=True, timeout=600,
                       check=False)
    assert r.returncode != 0, f"{front} wrote a wheel tagged manylinux_2_5: {r.stdout[-2000:]}"
    said = r.stdout + r.stderr
    assert "claims more than the libraries earn" in said and "Fix: tag it manylinux_2_34_x86_64" in said, said[-3000:]
    assert not list(out.glob("*.whl")) if out.is_dir() else True
    earned = subprocess.run(FRONT_ENDS[front](out), env={**env, "JA_WHEEL_PLAT_NAME": "manylinux_2_39_x86_64"},
                            cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert earned.returncode == 0, earned.stdout[-2000:] + earned.stderr[-2000:]
    assert [p.name.rsplit("-", 1)[1] for p in out.glob("*.whl")] == ["manylinux_2_39_x86_64.whl"]


@pytest.mark.parametrize("packages, why", [
    ("[]", "lists no package"),
    ('["jax_aiter.ops"]', "leaves out jax_aiter/__init__.py"),
    ('["jax_aiter", "jax_aitr"]', "names jax_aitr, which is no package"),
    ('["jax_aiter", "jax_aiter.mha", "jax_aiter.ops"]',
     "leaves out jax_aiter.download (a subpackage: it has an __init__.py)"),
])
def test_faults_a_wheel_without_its_python_package_is_refused(build_copy, tmp_path, packages, why):
    """pyproject's `packages = []` built a wheel with no Python package when --check was not given (issue 84); the
    build now refuses it, with or without --check, naming the setting. So does a list that leaves out a subpackage
    (jax_aiter.download once was: the wheel built, and its clean-room validation failed at the first import)."""
    root = tmp_path / "repo"
    shutil.copytree(ROOT, root, ignore=shutil.ignore_patterns(".git", ".nox", "build", "dist", ".venv*", "__pycache__",
                                                               "third_party"))
    (root / "third_party").symlink_to(ROOT / "third_party")
    text = (root / "pyproject.toml").read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith("packages = "))
    (root / "pyproject.toml").write_text(text.replace(line, f"packages = {packages}"))
    env = {**_env(build_copy), "JA_ROOT_DIR": str(root), "PYTHONPATH": str(root)}
    r = subprocess.run([sys.executable, "-m", "jatools.wheel.wheel_build", "--variant", "lite", "--dist",
                        str(tmp_path / "dist")], env=env, cwd=root, capture_output=True, text=True, timeout=600,
                       check=False)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert f"pyproject.toml [tool.jax-aiter] packages = {json.dumps(json.loads(packages))} {why}" in r.stderr, r.stderr
    assert "List jax_aiter and its subpackages there" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not list((tmp_path / "dist").glob("*.whl*")) if (tmp_path / "dist").is_dir() else True


def test_faults_no_runpath_in_an_installed_wheel_names_a_folder_it_lacks(build_copy, tmp_path):
    """Every shim carried RUNPATH $ORIGIN/../aiter_build (issue 84), a build-tree folder the installed wheel lacks:
    the wheel build makes build-tree entries $ORIGIN (the build tree keeps its own), and contents refuses a wheel
    with an entry naming a folder it does not have."""
    wheels = {v: _build(build_copy, v, tmp_path / "dist").wheel for v in ("lite", "full")}
    for variant, wheel in wheels.items():
        scanned = wheel_scan.scan(wheel)
        folders = {str(Path(n).parent) for n in scanned.members}
        for name, m in scanned.members.items():
            if m.elf is None:
                continue
            for entry in (*m.elf.runpath, *m.elf.rpath):
                assert entry.startswith("$ORIGIN"), f"{variant}: {name} RUNPATH {entry}"
                target = posixpath.normpath(posixpath.join(posixpath.dirname(name), entry[len("$ORIGIN"):].lstrip("/")))
                assert target in folders, f"{variant}: {name} RUNPATH {entry} names {target}, not in the wheel"
        assert wheel_contents.check_contents(wheel).ok, wheel_contents.check_contents(wheel).message
    shim = build_copy.umbrella_dir / "silu_and_mul_ja.so"
    assert wheel_scan.read_dynamic(shim).runpath == ("$ORIGIN", "$ORIGIN/../aiter_build"), "the build tree keeps it"
    # a wheel with the build-tree entry (as every wheel had before): refused, naming the entry and the folder
    member = "jax_aiter/_lib/silu_and_mul_ja.so"
    (tmp_path / "old").mkdir()
    old = rewrite_wheel(wheels["lite"], tmp_path / "old" / wheels["lite"].name, put={member: shim.read_bytes()},
                        repin=True)
    msg = wheel_contents.check_contents(old).message
    assert (f"{member}: RUNPATH entry '$ORIGIN/../aiter_build' names jax_aiter/aiter_build/, which the wheel does not "
            "have") in msg, msg


def test_the_lite_wheels_tag_is_the_documented_exception_to_auditwheel(build_copy, tmp_path):
    """docs/wheels.md ("The lite wheel's tag"): auditwheel grants the lite wheel only linux_x86_64, because its shims
    name the attention libraries it fetches later, and nothing else; its tag is the symbol floor (sym_tag), which
    auditwheel measures the same. The full wheel, which holds every library, gets from auditwheel the tag it carries."""
    wheels = {v: _build(build_copy, v, tmp_path / "dist").wheel for v in ("lite", "full")}
    for variant, wheel in wheels.items():
        r = subprocess.run([sys.executable, "-m", "auditwheel", "show", "--json", str(wheel)], capture_output=True,
                           text=True, timeout=300, check=False)
        assert r.returncode == 0 and "{" in r.stdout, r.stdout + r.stderr
        shown = json.loads(r.stdout[r.stdout.index("{"):])
        tag = wheel.name.rsplit("-", 1)[1].removesuffix(".whl")
        assert shown["sym_tag"] == tag, (variant, shown["sym_tag"], tag)
        outside = sorted(shown["external_libs"])  # what keeps auditwheel from granting a manylinux tag
        if variant == "lite":
            assert shown["overall_tag"] == "linux_x86_64", shown["overall_tag"]
            assert outside == sorted(Layout.load().variant("lite").fetched), outside
        else:
            assert shown["overall_tag"] == tag and outside == [], (shown["overall_tag"], outside)
