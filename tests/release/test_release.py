"""`nox -s release`'s pipeline (jatools.release) end to end in a scratch copy, on the build this suite built.

The copy starts from this checkout's build tree, so the native stages are up to
date and the run shows the skips; planted defects then stop the pipeline at
the right stage with the right re-run command; upload refuses a stale report
and a modified wheel.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jatools import config
from jatools import release as release_mod
from tests.release.standins import stand_in_wheel

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / os.environ.get("JA_BUILD_DIR", "build")


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), "-c", "user.email=t@t", "-c", "user.name=t", *args], check=True,
                   capture_output=True)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    if not (BUILD / "aiter_build/build_record.json").is_file() or not list((BUILD / "jax_aiter_build").glob("*_ja.so")):
        pytest.fail("the release test starts from this checkout's build; run `nox -s tests` (it builds first)")
    root = tmp_path_factory.mktemp("release") / "repo"
    files = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, check=True).stdout
    for rel in filter(None, files.decode().split("\0")):
        src = REPO / rel
        if src.is_file():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, root / rel)
    shutil.copytree(BUILD / "obj", root / "build/obj", symlinks=True)
    for sub in ("jax_aiter_build", "aiter_build"):
        shutil.copytree(BUILD / sub, root / "build" / sub, symlinks=True)
    shutil.copy2(BUILD / "config.mk", root / "build/config.mk")
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "release candidate")
    # Bring the copied umbrella and shims up to date in the copy (a no-op when this checkout's build is
    # current). The JIT libraries are taken, not rebuilt: their identity does not depend on the checkout's
    # path, while ninja's command lines do (-ffile-prefix-map), so a rebuild in the copy would recompile all.
    env = {**{k: v for k, v in os.environ.items() if k not in ("JA_BUILD_DIR", "GPU_ARCHS")},
           "JA_ROOT_DIR": str(root), **built_with()}
    for cmd in (["make", "umbrella"], ["make", "ja_mods"]):
        subprocess.run(cmd, cwd=root, env=env, check=True, capture_output=True)
    return root


def built_with() -> dict[str, str]:
    """The backend and archs this checkout's build used, so the copy's build stays up to date."""
    ident = json.loads((BUILD / "aiter_build/build_record.json").read_text())["modules"]["rmsnorm_fwd"]["identity"]
    return {"JA_BACKEND": ident["backend"],
            **({"GPU_ARCHS": ";".join(ident["gpu_archs"])} if ident["gpu_archs"] else {})}


def release(root: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("JA_BUILD_DIR", "JA_ROOT_DIR", "GPU_ARCHS")}
    full.update(JA_ROOT_DIR=str(root), JA_WHEELHOUSE=str(REPO / "build/wheelhouse"), JA_JIT_LIBS="take",
                **built_with(), **env)
    return subprocess.run([sys.executable, "-m", "jatools.release", *args], check=False, cwd=root, env=full,
                          capture_output=True, text=True, timeout=1800)


def report(root: Path) -> dict:
    return json.loads((root / "dist/release-report.json").read_text())


def test_dry_run_prints_the_plan_and_runs_nothing(scratch):
    out = release(scratch, "--dry-run")
    assert out.returncode == 0, out.stderr
    for stage in ("env-report", "umbrella", "jit", "ja_mods", "wheel_lite", "wheel_full", "verify",
                  "floor+contents", "sdist", "clients", "validate"):
        assert stage in out.stdout
    assert not (scratch / "dist/release-report.json").exists()


@pytest.mark.parametrize("jit, fetch", [("build", None), ("take", None), ("take", "file:///releases")])
def test_the_release_runs_the_native_sequence_of_native_build_and_never_invoke(monkeypatch, jit, fetch):
    """The native stages are jatools.native.build's sequence (a consumer's check before anything compiles),
    not a second copy. No stage runs nox (the release is itself `nox -s release`) or invoke: the JIT fetch and
    verify stages run the functions `invoke jit.fetch` and `invoke verify` call, through `python -m
    jatools.jitlibs`; every other stage a module or make."""
    from jatools.native import build as native_build
    monkeypatch.setenv("JA_JIT_LIBS", jit)
    plan = release_mod.stages(release_mod.Context(REPO, sys.executable, fetch, {}))
    native = [list(s.argv) for s in native_build.native_steps(jit=jit)]
    got = [list(s.argv() if callable(s.argv) else s.argv) for s in plan[1:4]]
    assert [s.name for s in plan[1:4]] == (["umbrella", "jit", "ja_mods"] if jit == "build" else
                                           ["jit", "umbrella", "ja_mods"])
    assert got[1:] == native[1:] and (got[0] == native[0]) == (fetch is None)
    pins = config.load(root=REPO).raw["jit_libs_base_url"]
    if fetch:
        assert got[0][1:] == ["-m", "jatools.jitlibs", "fetch", "--base-url", fetch, "--pins-from", pins]
    for step in plan:  # (the commands read when their stage starts name the wheels and run a module too)
        argv = None if callable(step.argv) else list(step.argv)
        assert argv is None or not {"nox", "invoke"} & set(argv), (step.name, argv)
    assert next(s for s in plan if s.name == "verify").argv == [sys.executable, "-m", "jatools.jitlibs", "verify"]


@pytest.mark.parametrize(("action", "flags"), [("verify", ["--dir", "--against"]),
                                               ("fetch", ["--base-url", "--pins-from"])])
def test_the_jit_steps_the_release_runs_take_the_flags_it_passes(action, flags):
    """`python -m jatools.jitlibs ACTION` takes the flags the release passes, as the invoke task does."""
    r = subprocess.run([sys.executable, "-m", "jatools.jitlibs", action, "--help"], cwd=REPO, capture_output=True,
                       text=True, timeout=120, check=False)
    assert r.returncode == 0 and all(f in r.stdout for f in flags), r.stdout + r.stderr


def test_verify_through_the_module_fails_on_a_changed_library(tmp_path):
    """The release's verify stage fails (exit 1, the file named) when a library differs from its record."""
    from tests.tooling.jit_libs_support import (
        checkout_identity,
        make_checkout,
        write_build,
    )

    root = make_checkout(tmp_path / "repo")
    ident = checkout_identity(root)
    jit_dir = root / "build" / "aiter_build"
    write_build(jit_dir, ident)
    env = {**os.environ, "JA_ROOT_DIR": str(root), "JA_BACKEND": "cpu", "PYTHONPATH": str(root)}
    ok = subprocess.run([sys.executable, "-m", "jatools.jitlibs", "verify"], cwd=root, env=env, capture_output=True,
                        text=True, timeout=120, check=False)
    assert ok.returncode == 0 and "match" in ok.stdout, ok.stderr
    lib = next(jit_dir.glob("lib*.so"))
    lib.write_bytes(lib.read_bytes()[:-1] + b"x")
    bad = subprocess.run([sys.executable, "-m", "jatools.jitlibs", "verify"], cwd=root, env=env, capture_output=True,
                         text=True, timeout=120, check=False)
    assert bad.returncode == 1 and lib.name in bad.stderr and "jit.verify: error" in bad.stderr, bad.stderr


def test_verify_fails_when_the_kernel_sources_changed_since_the_build(tmp_path):
    """`invoke verify` passed libraries whose kernel sources had changed since they were built (the wheel build and
    the loader caught it). Now it compares the record's identity with the checkout's, as the wheel build does: a
    kernel edit (committed or not) fails it, naming the cache ids and the fix."""
    from tests.tooling.jit_libs_support import (
        checkout_identity,
        git,
        make_checkout,
        write_build,
    )

    root = make_checkout(tmp_path / "repo")
    write_build(root / "build" / "aiter_build", checkout_identity(root))
    env = {**os.environ, "JA_ROOT_DIR": str(root), "JA_BACKEND": "cpu", "PYTHONPATH": str(root)}
    verify = [sys.executable, "-m", "jatools.jitlibs", "verify"]
    ok = subprocess.run(verify, cwd=root, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert ok.returncode == 0 and "is this checkout's" in ok.stdout, ok.stdout + ok.stderr
    kernel = next(p for p in sorted((root / "csrc" / "kernels").rglob("*")) if p.suffix in (".h", ".hpp", ".cpp"))
    kernel.write_text(kernel.read_text() + "\n// changed after the build\n")
    git(root, "commit", "-qam", "a kernel edit")
    bad = subprocess.run(verify, cwd=root, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "jit.verify: error: the JIT libraries (cache id " in bad.stderr and "are not this checkout's" in bad.stderr
    assert "kernel_source_revision" in bad.stderr and "nox -s jit" in bad.stderr, bad.stderr


def test_the_environment_report_the_ci_driver_wrote_is_taken_not_made_again(tmp_path, monkeypatch):
    ctx = release_mod.Context(REPO, sys.executable, None, {})
    step = next(s for s in release_mod.stages(ctx) if s.name == "env-report")
    monkeypatch.delenv("JA_ENV_REPORT", raising=False)
    assert step.up_to_date() is None and step.artifacts() == [REPO / "dist/env-report.json"]
    written = tmp_path / "env-report.json"
    monkeypatch.setenv("JA_ENV_REPORT", str(written))
    assert step.up_to_date() is None, "a report that is not there is not taken"
    written.write_text("{}")
    assert "the CI driver reported this job's environment" in step.up_to_date()
    assert step.artifacts() == [written]


def test_green_run_then_warm_run_skips_what_is_up_to_date(scratch):
    out = release(scratch)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr
    first = report(scratch)
    assert first["ok"] and not first["dirty"]
    stages = {s["name"]: s for s in first["stages"]}
    assert stages["umbrella"]["result"] == "up-to-date" and stages["ja_mods"]["result"] == "up-to-date"
    wheels = sorted(Path(w["path"]).name for w in first["wheels"])
    assert len(wheels) == 2 and wheels[0].startswith("jax_aiter-0.1.0+cpu-") and "GREEN" in out.stdout
    assert [a["path"] for a in stages["sdist"]["artifacts"]] == ["dist/jax_aiter-0.1.0.tar.gz"]
    assert stages["clients"]["result"] == "ok" and "--clients" in stages["clients"]["command"]
    assert "jax_aiter-0.1.0.tar.gz" in stages["clients"]["command"], "the clients check the sdist too"
    again = release(scratch)
    assert again.returncode == 0, again.stdout[-3000:]
    second = {s["name"]: s["result"] for s in report(scratch)["stages"]}
    assert second["wheel_lite"] == second["wheel_full"] == second["validate"] == "up-to-date", second


def test_upload_dry_run_accepts_green_and_refuses_modified_or_stale(scratch):
    env = {**os.environ, "JA_ROOT_DIR": str(scratch)}
    code = "from jatools import release; import sys; release.upload('v0.1.0', dry_run=True)"

    def upload():
        return subprocess.run([sys.executable, "-c", code], check=False, cwd=scratch, env=env, capture_output=True,
                              text=True)

    untagged = upload()
    assert untagged.returncode != 0 and "there is no tag 'v0.1.0'" in untagged.stderr
    _git(scratch, "tag", "v0.1.0")
    ok = upload()
    assert ok.returncode == 0 and "dry run: gh release upload v0.1.0" in ok.stdout, ok.stderr
    wheel = scratch / report(scratch)["wheels"][0]["path"]
    good = wheel.read_bytes()
    wheel.write_bytes(good + b"\0")
    bad = upload()
    assert bad.returncode != 0 and "changed since the release run" in bad.stderr
    wheel.write_bytes(good)
    (scratch / "NOTES.txt").write_text("later work\n")
    _git(scratch, "add", "NOTES.txt")
    _git(scratch, "commit", "-qm", "later")
    stale = upload()
    assert stale.returncode != 0 and "run `nox -s release` for this commit" in stale.stderr


@pytest.mark.parametrize("stage, plant, rerun", [
    ("umbrella", lambda r: _append(r / "csrc/common/errors.cpp", "this does not compile;\n"), "make"),
    ("jit", lambda r: _append(r / "csrc/kernels/rmsnorm/rmsnorm_fwd_cpu.inst.in", "nor does this;\n"),
     "invoke jit.fetch  (or nox -s jit)"),
    # an unearned platform tag: the wheel build refuses it itself (it never reaches floor+contents)
    ("wheel_lite", None, "nox -s wheel_lite"),
])
def test_planted_failure_stops_at_its_stage(scratch, stage, plant, rerun):
    saved = {p: p.read_bytes() for p in (scratch / "csrc/common/errors.cpp",
                                         scratch / "csrc/kernels/rmsnorm/rmsnorm_fwd_cpu.inst.in")}
    try:
        if plant:
            plant(scratch)
        env = {"JA_WHEEL_PLAT_NAME": "manylinux_2_17_x86_64"} if stage == "wheel_lite" else {}
        out = release(scratch, **env)
        assert out.returncode == 1, out.stdout[-3000:]
        assert f"step {stage} failed" in out.stdout and f"re-run just this step: {rerun}" in out.stdout
        results = {s["name"]: s["result"] for s in report(scratch)["stages"]}
        assert results[stage] == "failed" and results["validate"] == "not run"
        assert not report(scratch)["ok"]
    finally:
        for p, data in saved.items():
            p.write_bytes(data)


def _append(path: Path, text: str) -> None:
    path.write_text(path.read_text() + text)


def test_the_wheel_fingerprint_covers_what_the_wheel_builder_imports():
    """The modules that decide a wheel's bytes and tag are found by importing the builder, not listed by hand:
    a change to the floor check, the ELF reader, the JIT expectations or the settings makes the wheel stale."""
    files = {p.relative_to(REPO.resolve()).as_posix()
             for p in release_mod.code_inputs(REPO.resolve(), release_mod.WHEEL_BUILDER)}
    for rel in ("jatools/wheel/wheel_build.py", "jatools/wheel/wheel_checks.py", "jatools/wheel/zip_writer.py",
                "jatools/jitlibs/expect.py", "jatools/config.py", "jatools/wheel/wheel_layout.toml",
                "jax_aiter/_loader.py", "pyproject.toml"):
        assert rel in files, rel
    # not imported by the builder: no false staleness (the clean room; the JIT fetch, decision and compiler driver)
    for rel in ("jatools/validate/cleanroom.py", "jatools/jitlibs/download.py", "jatools/jitlibs/decide.py",
                "jatools/native/jit_build.py", "jatools/native/toolchain.py"):
        assert rel not in files, rel


GH_STANDIN = """#!/bin/sh
# Stand-in for the GitHub CLI (no network here): keeps its releases as files, logs every call.
echo "$*" >> "$GH_LOG"
case "$1 $2" in
  "release view") [ -f "$GH_STATE/$3" ] ;;
  "release create") [ ! -f "$GH_STATE/$3" ] && touch "$GH_STATE/$3" ;;
  "release upload") [ -f "$GH_STATE/$3" ] ;;
  *) exit 2 ;;
esac
"""


def test_upload_creates_the_release_once_and_only_for_the_tag_of_the_validated_commit(tmp_path):
    """The upload job: a green report for HEAD; the tag must name that commit; the GitHub release is created
    when missing, then the wheels uploaded; a re-run creates nothing and replaces the assets."""
    from jatools import release
    from jax_aiter.integrity import sha256_file

    root = tmp_path / "repo"
    (root / "dist").mkdir(parents=True)
    wheel = root / "dist" / "jax_aiter-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"a wheel's bytes")
    _git(tmp_path, "init", "-q", str(root))
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "release")
    commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    (root / release.REPORT).write_text(json.dumps({
        "schema": release.SCHEMA, "kind": "jax-aiter-release", "ok": True, "commit": commit, "dirty": False,
        "stages": [{"name": "validate", "result": "ok"}],
        "wheels": [{"path": "dist/" + wheel.name, "sha256": sha256_file(wheel)}]}))
    bin_dir, state, log = tmp_path / "bin", tmp_path / "gh-state", tmp_path / "gh.log"
    bin_dir.mkdir()
    state.mkdir()
    (bin_dir / "gh").write_text(GH_STANDIN)
    (bin_dir / "gh").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "GH_STATE": str(state), "GH_LOG": str(log),
           "PYTHONPATH": str(REPO)}
    code = f"from jatools import release; from pathlib import Path; release.upload('v0.1.0', root=Path({str(root)!r}))"

    def upload():
        return subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True,
                              check=False)

    no_tag = upload()
    assert no_tag.returncode != 0 and "there is no tag 'v0.1.0'" in no_tag.stderr
    _git(root, "tag", "v0.1.0", commit)
    first = upload()
    assert first.returncode == 0, first.stderr
    again = upload()
    assert again.returncode == 0, again.stderr
    calls = [ln.split()[:3] for ln in log.read_text().splitlines()]
    assert calls == [["release", "view", "v0.1.0"], ["release", "create", "v0.1.0"], ["release", "upload", "v0.1.0"],
                     ["release", "view", "v0.1.0"], ["release", "upload", "v0.1.0"]]
    assert "--verify-tag" in log.read_text() and "--clobber" in log.read_text()
    # A tag on another commit than the validated one is refused before anything is uploaded.
    (root / "later.txt").write_text("x")
    _git(root, "add", "later.txt")
    _git(root, "commit", "-qm", "later")
    _git(root, "tag", "v0.2.0")
    _git(root, "checkout", "-q", commit)
    moved = subprocess.run([sys.executable, "-c", code.replace("v0.1.0", "v0.2.0")], cwd=root, env=env,
                           capture_output=True, text=True, check=False)
    assert moved.returncode != 0 and "but the wheels were built and validated from" in moved.stderr


def test_summary_columns_stay_apart_for_the_longest_stage_name() -> None:
    stages = [{"name": n, "result": "ok", "seconds": 1.0, "artifacts": []} for n in ("jit", "floor+contents")]
    text = release_mod.summary({"commit": "0" * 40, "dirty": False, "stages": stages, "ok": True, "seconds": 2.0})
    rows = [line for line in text.splitlines() if line.strip().startswith(("stage", "jit", "floor+contents"))]
    assert len(rows) == 3
    assert "floor+contents  ok" in text
    assert len({row.index("ok") if "ok" in row else row.index("result") for row in rows}) == 1  # one result column


def test_the_validated_wheel_is_the_one_a_green_report_of_its_lane_names(tmp_path):
    """What a GPU job installs to test (jatools/lane_tier.py): the variant's wheel of a green report of its lane,
    beside the report with the recorded bytes; a red report, another lane or changed bytes are refused."""
    from jax_aiter.integrity import sha256_file

    dist = tmp_path / "dist"
    dist.mkdir()
    stages = []
    for variant, name in (("lite", "jax_aiter-0.1.0+cuda13-py3-none-any.whl"),
                          ("full", "jax_aiter-0.1.0+cuda13.full-py3-none-any.whl")):
        (dist / name).write_bytes(f"the {variant} wheel's bytes".encode())
        stages.append({"name": f"wheel_{variant}", "result": "ok",
                       "artifacts": [{"path": f"dist/{name}", "sha256": sha256_file(dist / name)}]})
    report = {"schema": release_mod.SCHEMA, "kind": "jax-aiter-release", "ok": True, "commit": "c" * 40,
              "dirty": False, "lane": "cuda13", "stages": [*stages, {"name": "validate", "result": "ok"}]}
    path = dist / Path(release_mod.REPORT).name
    path.write_text(json.dumps(report))
    wheel, got = release_mod.validated_wheel(path, "cuda13")
    assert wheel == dist / "jax_aiter-0.1.0+cuda13.full-py3-none-any.whl" and got["commit"] == "c" * 40
    assert release_mod.validated_wheel(path, "cuda13", "lite")[0].name == "jax_aiter-0.1.0+cuda13-py3-none-any.whl"
    with pytest.raises(release_mod.ReleaseError, match="is of lane cuda13, not rocm7"):
        release_mod.validated_wheel(path, "rocm7")
    wheel.write_bytes(b"other bytes")
    with pytest.raises(release_mod.ReleaseError, match="changed since the release run"):
        release_mod.validated_wheel(path, "cuda13")
    path.write_text(json.dumps({**report, "ok": False,
                                "stages": [*stages, {"name": "validate", "result": "failed"}]}))
    with pytest.raises(release_mod.ReleaseError, match=r"is not green \(stages validate\)"):
        release_mod.validated_wheel(path, "cuda13", "lite")
    with pytest.raises(release_mod.ReleaseError, match="no .*release-report.json; run `nox -s release` first"):
        release_mod.validated_wheel(tmp_path / "release-report.json", "cuda13")


def test_a_ci_run_indexes_the_validated_files_under_its_commit(tmp_path):
    """invoke release.index (pr_gpu_cuda_h200's last step): the files a green report for HEAD vouches for go to
    <store>/<commit>/ and the index links them with their sha256; a changed file, a red report or a later commit
    is refused, and the store is left as it was."""
    from jatools import release
    from jax_aiter.integrity import sha256_file

    root = tmp_path / "repo"
    wheel = stand_in_wheel(root / "dist", "0.1.0+cuda13.full")
    good = wheel.read_bytes()
    (root / ".gitignore").write_text("dist/\n")  # as the checkout's: the release's outputs are not tracked
    _git(tmp_path, "init", "-q", str(root))
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "main")
    commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    report = {"schema": release.SCHEMA, "kind": "jax-aiter-release", "ok": True, "commit": commit, "dirty": False,
              "lane": "cuda13", "stages": [{"name": "validate", "result": "ok"}],
              "wheels": [{"path": "dist/" + wheel.name, "sha256": sha256_file(wheel)}]}
    (root / release.REPORT).write_text(json.dumps(report))
    store = tmp_path / "store"
    assert release.index_commit(store, root=root) == store / commit
    assert (store / commit / wheel.name).read_bytes() == wheel.read_bytes()
    page = (store / "cuda13" / "simple" / "jax-aiter" / "index.html").read_text()
    assert f"../../../{commit}/{wheel.name}#sha256={sha256_file(wheel)}" in page
    pages = {p: p.read_bytes() for p in store.rglob("*") if p.is_file()}

    wheel.write_bytes(b"other bytes")
    with pytest.raises(release.ReleaseError, match="changed since the release run"):
        release.index_commit(store, root=root)
    wheel.write_bytes(good)
    (root / release.REPORT).write_text(json.dumps({**report, "ok": False}))
    with pytest.raises(release.ReleaseError, match="is not green"):
        release.index_commit(store, root=root)
    (root / release.REPORT).write_text(json.dumps(report))
    (root / "later.txt").write_text("x")
    _git(root, "add", "later.txt")
    _git(root, "commit", "-qm", "later")
    with pytest.raises(release.ReleaseError, match="run `nox -s release` for this commit"):
        release.index_commit(store, root=root)
    assert {p: p.read_bytes() for p in store.rglob("*") if p.is_file()} == pages


def test_two_lanes_files_never_share_a_name_and_the_common_sdist_is_taken_once(tmp_path):
    """release_files over every lane's report: the sdist both lanes made from one source (same bytes) once, each
    lane's wheels beside it; the same file name with other bytes in two lanes is refused, naming the file."""
    def lane(name: str, files: dict[str, bytes]) -> dict:
        folder = tmp_path / name
        folder.mkdir()
        for f, data in files.items():
            (folder / f).write_bytes(data)
        return {"files": {f: folder / f for f in files}}

    sdist = "jax_aiter-0.1.0.tar.gz"
    rocm = lane("rocm7", {"jax_aiter-0.1.0+rocm7-py3-none-any.whl": b"r", sdist: b"the source"})
    cuda = lane("cuda13", {"jax_aiter-0.1.0+cuda13-py3-none-any.whl": b"c", sdist: b"the source"})
    got = release_mod.release_files([rocm, cuda])
    assert sorted(p.name for p in got) == sorted({*rocm["files"], *cuda["files"]}) and len(got) == 3
    clash = lane("clash", {sdist: b"another source"})
    with pytest.raises(release_mod.ReleaseError, match=f"two lanes made {sdist} with different bytes"):
        release_mod.release_files([rocm, clash])
