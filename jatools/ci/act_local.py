"""`nox -s ci_local -- [JOB ...]`: every job of every workflow, run on this machine the way GitHub composes it.

Each job (a matrix job: each of its builds) gets a verdict: run with nektos/act in host mode (`-P LABEL=-self-hosted`,
the actions replaced by the stand-ins in ci/act/ through --local-repository) and then succeeded or failed, or
"not runnable here" with the reason (a self-hosted GPU runner, a container with no host equivalent, a Docker
engine, a store on github.com, a job it needs that cannot run here). JOB: a build name (pr_cpu), a job
(release.yml:plan) or a workflow (nightly.yml); none: every job. Exit 1 when any job that ran failed.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(os.environ.get("JA_ROOT_DIR") or Path(__file__).resolve().parents[2])  # the checkout whose workflows run
GITHUB_HOSTED = {"ubuntu-24.04"}
# The stand-in (ci/act/<folder>) of each action the workflows use.
STANDINS = {"actions/checkout": "checkout", "actions/setup-python": "setup-python",
            "actions/upload-artifact": "upload-artifact", "actions/download-artifact": "download-artifact",
            "docker/login-action": "login", "actions/attest-build-provenance": "attest"}
# What a container image has that the host may have too: (tool on PATH, what it stands for).
HOST_EQUIVALENT = {"nvidia/cuda:13.0.1-devel-ubuntu24.04": ("nvcc", "the CUDA 13 toolkit")}
# Builds that need a service this machine cannot reach, and which one.
NEEDS_SERVICE = {"jit.fetch": "the GitHub release store (JA_FETCH_BASE_URL on github.com)",
                 "jit.decide": "the GitHub release store (JA_FETCH_BASE_URL on github.com)",
                 "jit.publish": "a GitHub release to publish to (gh, a write token)",
                 "release.upload": "a GitHub release to upload to (gh, a write token)",
                 "image.publish": "a Docker engine and a registry"}
EVENTS = ("pull_request", "push", "workflow_dispatch", "schedule", "workflow_call")


@dataclasses.dataclass
class Unit:
    """One job run (a matrix job: one build of it) and its verdict."""
    workflow: str
    job: str
    build: str | None
    event: str
    why_not: str = ""
    result: str = ""

    @property
    def name(self) -> str:
        return f"{self.workflow}:{self.job}" + (f" [{self.build}]" if self.build else "")


def load_ci_build(root: Path | None = None):
    """ci/build.py of the checkout (the registry the matrices come from), imported by path."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("ja_ci_build_local", (root or ROOT) / "ci" / "build.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _load(path: Path) -> dict:
    data = yaml.safe_load(path.read_text())
    data["on"] = data.pop(True, data.get("on")) or {}
    return data


def _matrix_builds(wf: dict, job: dict, cb) -> list[str] | None:
    m = re.fullmatch(r"\$\{\{ fromJSON\(needs\.(\w+)\.outputs\.matrix(?:_(cpu|gpu))?\) \}\}",
                     str((job.get("strategy") or {}).get("matrix", "")))
    if not m:
        return None
    runs = [s.get("run", "") for s in wf["jobs"][m.group(1)]["steps"]]
    group = next(g.group(1) for r in runs if (g := re.match(r"python3 ci/build\.py --matrix (\w+)(?: --runners (\w+))?$", r))
                 and g.group(2) == m.group(2))
    return [e["build"] for e in cb.matrix(group, runners=m.group(2))["include"]]


def _why_not(build: str | None, runner: str, container: str, cb) -> str:
    if runner not in GITHUB_HOSTED:
        gpus = cb.get_build(build).runner.gpus if build else 0
        return f"runs on the self-hosted runner {runner}" + (f" ({gpus} GPU)" if gpus else "")
    if container:
        image = container.split("@")[0]
        tool, what = HOST_EQUIVALENT.get(image, (None, "its toolchain"))
        if not (tool and shutil.which(tool)):
            return f"runs in the container {image}: no Docker engine here and the host lacks {what}"
    tasks = cb.get_build(build).tasks() if build else set()
    service = next((NEEDS_SERVICE[t] for t in sorted(tasks) if t in NEEDS_SERVICE), "")
    return f"needs {service}" if service else ""


def units(cb) -> list[Unit]:
    out = []
    for path in sorted((ROOT / ".github" / "workflows").glob("*.yml")):
        wf = _load(path)
        event = next(e for e in EVENTS if e in wf["on"])
        for job_id, job in wf["jobs"].items():
            if "uses" in job:  # a call of a reusable workflow: its jobs are listed (and run) under that file
                out.append(Unit(path.name, job_id, None, event, f"calls {job['uses']}, whose jobs are listed under it"))
                continue
            step_builds = [m.group(1) for s in job.get("steps", [])
                           if (m := re.search(r'ci/build\.py --build "?(\w+)"?$', s.get("run", "")))]
            matrix = _matrix_builds(wf, job, cb)
            for build in matrix if matrix is not None else (step_builds or [None]):
                runner = cb.get_build(build).runner.label if matrix is not None else job["runs-on"]
                container = (cb.get_build(build).runner.container or "") if matrix is not None else \
                    (job.get("container") or {}).get("image", "")
                u = Unit(path.name, job_id, build if matrix is not None else None, event)
                u.why_not = _why_not(build, runner, container, cb)
                needs = job.get("needs", [])
                blocked = [n for n in ([needs] if isinstance(needs, str) else needs)
                           if any(o.workflow == u.workflow and o.job == n and o.why_not for o in out)]
                if not u.why_not and blocked:
                    u.why_not = f"needs the job {', '.join(blocked)}, which cannot run here"
                out.append(u)
    return out


def act_command(u: Unit, artifacts: Path, event_file: Path) -> list[str]:
    act = shutil.which("act") or shutil.which("act", path=str(Path(sys.executable).parent))
    cmd = [act, u.event, "-W", f".github/workflows/{u.workflow}", "-j", u.job, "-e", str(event_file),
           "-P", "ubuntu-24.04=-self-hosted", "--env", f"JA_ACT_ARTIFACTS={artifacts}", "--env", "CI=true"]
    if u.build:
        cmd += ["--matrix", f"build:{u.build}"]
    text = (ROOT / ".github" / "workflows" / u.workflow).read_text()
    for action, sha in sorted(set(re.findall(r"uses: ([\w./-]+)@([0-9a-f]{40})", text))):
        cmd += ["--local-repository", f"{action}@{sha}={ROOT / 'ci' / 'act' / STANDINS[action]}"]
    return cmd


def event(u: Unit) -> dict:
    """The event payload: a pull request from this repository into its base (the merge base with main, else the
    parent commit); a release run on a version tag."""
    if u.workflow == "release.yml":
        return {"ref": "refs/tags/v0.0.0-local", "ref_type": "tag", "ref_name": "v0.0.0-local"}
    git = lambda *a: subprocess.run(["git", *a], check=False, cwd=ROOT, capture_output=True, text=True).stdout.strip()
    base = next(filter(None, (git("merge-base", "HEAD", ref) for ref in ("origin/main", "main"))), "") or \
        git("rev-parse", "HEAD~1")
    repo = {"full_name": "local/jax-aiter"}
    return {"pull_request": {"base": {"sha": base}, "head": {"repo": repo}}, "repository": repo, "before": base}


def run(u: Unit, artifacts: Path, log_dir: Path) -> str:
    event_file = log_dir / "event.json"
    event_file.write_text(json.dumps(event(u)))
    log = log_dir / re.sub(r"[^\w.-]+", "_", u.name)
    # act's host mode hands this environment to the job, which runs in act's own copy of the checkout: the
    # JA_ROOT_DIR that scripts/run.sh exports names this checkout, not that copy, so it stays out (as on GitHub).
    env = {k: v for k, v in os.environ.items() if k != "JA_ROOT_DIR"}
    with open(f"{log}.log", "w") as f:
        rc = subprocess.run(act_command(u, artifacts, event_file), check=False, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                            env={**env, "GITHUB_REF_TYPE": "tag", "GITHUB_REF_NAME": "v0.0.0-local"}).returncode
    return "succeeded" if rc == 0 else f"failed (act exit {rc}; {log}.log)"


def selected(all_units: list[Unit], names: list[str]) -> list[Unit]:
    if not names:
        return all_units
    pick = [u for u in all_units if any(n in (u.build, u.workflow, f"{u.workflow}:{u.job}") for n in names)]
    unknown = [n for n in names if not any(n in (u.build, u.workflow, f"{u.workflow}:{u.job}") for u in all_units)]
    if unknown:
        raise SystemExit(f"ci_local: unknown job(s) {', '.join(unknown)}; a build name, WORKFLOW.yml:JOB or "
                         "WORKFLOW.yml (`nox -s ci_local -- --list` names them)")
    return pick


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="nox -s ci_local --", description=__doc__.splitlines()[0])
    p.add_argument("jobs", nargs="*", help="build names, WORKFLOW.yml:JOB or WORKFLOW.yml (default: every job)")
    p.add_argument("--list", action="store_true", help="print every job with its verdict, run nothing")
    a = p.parse_args(argv)
    todo = selected(units(load_ci_build()), a.jobs)
    log_dir = ROOT / "build" / "ci-local"
    log_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ja-act-artifacts-") as artifacts:
        for u in todo:
            u.result = (f"not runnable here ({u.why_not})" if u.why_not else "would run" if a.list
                        else run(u, Path(artifacts), log_dir))
            print(f"{u.name:<58} {u.result}", flush=True)
    failed = [u for u in todo if u.result.startswith("failed")]
    print(f"ci_local: {len(todo)} job(s): {sum(u.result == 'succeeded' for u in todo)} succeeded, {len(failed)} "
          f"failed, {sum(u.result.startswith('not runnable') for u in todo)} not runnable here")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
