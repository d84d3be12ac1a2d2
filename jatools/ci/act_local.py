"""`nox -s ci_local -- [JOB ...]`: every job of every workflow, run on this machine the way GitHub composes it.

Each job (a matrix job: each of its builds) gets a verdict: run with nektos/act in host mode (`-P LABEL=-self-hosted`,
the actions replaced by the stand-ins in ci/act/ through --local-repository) and then succeeded, failed or skipped
(its `if:`), or "not runnable here" with the reason (a self-hosted GPU runner, a container with no host equivalent, a
Docker engine, a service on github.com, a job it needs that cannot run here). The release store is a folder served on
127.0.0.1 (jatools/ci/local_store.py), named to the workflows as the repository variable JA_FETCH_BASE_URL, so the
JIT producer's chain (jit-libs.yml on the CPU backend: plan, shards, merge, publish, and the consumer that fetches
the release back) runs for real. A job that other selected jobs need runs once, in their act run. JOB: a build name
(pr_cpu), a job (release.yml:plan) or a workflow (nightly.yml); none: every job. Exit 1 when any job that ran failed.
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

from jatools import config
from jatools.ci import workflow_facts
from jatools.ci.local_store import LocalStore

ROOT = Path(os.environ.get("JA_ROOT_DIR") or Path(__file__).resolve().parents[2])  # the checkout whose workflows run
# The stand-in (ci/act/<folder>) of each action the workflows use.
STANDINS = {"actions/checkout": "checkout", "actions/setup-python": "setup-python",
            "actions/upload-artifact": "upload-artifact", "actions/download-artifact": "download-artifact",
            "docker/login-action": "login", "actions/attest-build-provenance": "attest", "actions/cache": "cache"}
# What a container image has that the host may have too: (tool on PATH, what it stands for).
HOST_EQUIVALENT = {"nvidia/cuda:13.0.1-devel-ubuntu24.04": ("nvcc", "the CUDA 13 toolkit")}
# Builds that need a service this machine cannot reach, and which one (the JIT-library release store is served
# here: jit.decide, jit.fetch and jit.publish run against it).
NEEDS_SERVICE = {"release.upload": "a GitHub release to upload to (gh, a write token)",
                 "image.publish": "a Docker engine and a registry"}
EVENTS = ("pull_request", "push", "workflow_dispatch", "schedule", "workflow_call")


@dataclasses.dataclass
class Unit:
    """One job run (a matrix job: one build of it) and its verdict."""
    workflow: str
    job: str
    build: str | None
    event: str
    needs: tuple[str, ...] = ()
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
    group = next(g.group(1) for r in runs
                 if (g := re.match(r"python3 ci/build\.py --matrix (\w+)(?: --runners (\w+))?$", r))
                 and g.group(2) == m.group(2))
    return [e["build"] for e in cb.matrix(group, runners=m.group(2))["include"]]


def _why_not(build: str | None, runner: str, container: str, cb) -> str:
    if runner not in cb.GITHUB_HOSTED:
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
                out.append(Unit(path.name, job_id, None, event,
                                why_not=f"calls {job['uses']}, whose jobs are listed under it"))
                continue
            step_builds = [m.group(1) for s in job.get("steps", [])
                           if (m := workflow_facts.NAMED_BUILD.search(s.get("run", "")))]
            matrix = _matrix_builds(wf, job, cb)
            for build in matrix if matrix is not None else (step_builds or [None]):
                runner = cb.get_build(build).runner.label if matrix is not None else job["runs-on"]
                container = (cb.get_build(build).runner.container or "") if matrix is not None else \
                    (job.get("container") or {}).get("image", "")
                needs = job.get("needs", [])
                u = Unit(path.name, job_id, build if matrix is not None else None, event,
                         tuple([needs] if isinstance(needs, str) else needs))
                u.why_not = _why_not(build, runner, container, cb)
                blocked = [n for n in u.needs
                           if any(o.workflow == u.workflow and o.job == n and o.why_not for o in out)]
                if blocked and (not u.why_not or u.why_not.startswith("needs ")):  # hardware first, then the order
                    u.why_not = f"needs the job {', '.join(blocked)}, which cannot run here"
                out.append(u)
    return out


@dataclasses.dataclass
class ActRun:
    """One act invocation: a job with the jobs it needs (act runs those first, in the same run) and, for a matrix
    job, the builds picked; `units` are the selected units it covers."""
    workflow: str
    job: str
    builds: list[str]
    units: list[Unit]

    @property
    def name(self) -> str:
        return re.sub(r"[^\w.-]+", "_", f"{self.workflow}:{self.job}" + "".join(f"_{b}" for b in self.builds))


def _closure(needs: dict[str, tuple[str, ...]], job: str) -> set[str]:
    """The jobs `job` needs, directly or through others (`needs`: each job's own)."""
    seen, todo = set(), list(needs.get(job, ()))
    while todo:
        j = todo.pop()
        if j not in seen:
            seen.add(j)
            todo += needs.get(j, ())
    return seen


def plan_runs(todo: list[Unit], every: list[Unit]) -> list[ActRun]:
    """The fewest act runs that run every runnable unit of `todo`: one per job that no other selected job needs
    (`every`: all units, for the jobs' needs)."""
    runs = []
    for wf in dict.fromkeys(u.workflow for u in todo):
        needs = {u.job: u.needs for u in every if u.workflow == wf}
        mine = [u for u in todo if u.workflow == wf and not u.why_not]
        needed = set().union(*(_closure(needs, u.job) for u in mine))
        for job in dict.fromkeys(u.job for u in mine if u.job not in needed):
            legs = [u for u in mine if u.job == job]
            runs.append(ActRun(wf, job, [u.build for u in legs if u.build],
                               legs + [u for u in mine if u.job in _closure(needs, job)]))
    return runs


def host_workflow(workflow: str, log_dir: Path) -> Path:
    """A copy of the workflow with no job container: a job that runs here runs on the host, which has what its
    container has (HOST_EQUIVALENT) or needs no container at all (an empty matrix entry)."""
    wf = _load(ROOT / ".github" / "workflows" / workflow)
    for job in wf["jobs"].values():
        job.pop("container", None)
    out = log_dir / "workflows" / workflow
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(wf, sort_keys=False, width=1 << 16))
    return out


def act_command(r: ActRun, cb, ctx: dict[str, str]) -> list[str]:
    """ctx: artifacts (the artifact folder), event (the event file), store (the release store's URL), log_dir."""
    act = shutil.which("act") or shutil.which("act", path=str(Path(sys.executable).parent))
    cmd = [act, r.units[0].event, "-W", str(host_workflow(r.workflow, Path(ctx["log_dir"]))), "-j", r.job,
           "-e", ctx["event"], "--json", "--env", f"JA_ACT_ARTIFACTS={ctx['artifacts']}", "--env", "CI=true",
           "--var", f"JA_FETCH_BASE_URL={ctx['store']}"]
    cmd += [a for label in sorted(cb.GITHUB_HOSTED) for a in ("-P", f"{label}=-self-hosted")]
    cmd += [a for b in r.builds for a in ("--matrix", f"build:{b}")]
    text = (ROOT / ".github" / "workflows" / r.workflow).read_text()
    for action, sha in sorted(set(re.findall(r"uses: ([\w./-]+)@([0-9a-f]{40})", text))):
        cmd += ["--local-repository", f"{action}@{sha}={ROOT / 'ci' / 'act' / STANDINS[action]}"]
    return cmd


def event(workflow: str, cb) -> dict:
    """The event payload: a pull request from this repository into its base (the merge base with main, else the
    parent commit); a release run on a version tag. A dispatch's inputs ride in it (act reads them there): the JIT
    producer's `backends` are all of ci/build.py's (a backend whose shards cannot run here is left out by its jobs'
    verdicts, never run)."""
    if workflow == "release.yml":
        return {"ref": "refs/tags/v0.0.0-local", "ref_type": "tag", "ref_name": "v0.0.0-local"}
    inputs = (_load(ROOT / ".github" / "workflows" / workflow)["on"].get("workflow_dispatch") or {}).get("inputs") or {}
    given = {"backends": " ".join(b for b, _runner, _env in cb.PRODUCER_BACKENDS)} if "backends" in inputs else {}
    git = lambda *a: subprocess.run(["git", *a], check=False, cwd=ROOT, capture_output=True, text=True).stdout.strip()
    base = next(filter(None, (git("merge-base", "HEAD", ref) for ref in ("origin/main", "main"))), "") or \
        git("rev-parse", "HEAD~1")
    repo = {"full_name": "local/jax-aiter"}
    return {"pull_request": {"base": {"sha": base}, "head": {"repo": repo}}, "repository": repo, "before": base,
            "inputs": given}


def _verdict(u: Unit, results: list[tuple[str, str, str]], log: Path) -> str:
    mine = [res for job, build, res in results if job == u.job and (u.build is None or build == u.build)]
    if not mine:
        return "skipped (act did not run it: its `if:` is false here, or a job it needs did not succeed)"
    return "succeeded" if all(r == "success" for r in mine) else f"failed (log: {log})"


def run(r: ActRun, cb, ctx: dict[str, str]) -> None:
    """Run one act invocation; each unit it covers gets its verdict from act's per-job results (its JSON log,
    written as text to build/ci-local/<run>.log)."""
    event_file = Path(ctx["log_dir"]) / f"{r.name}.event.json"
    event_file.write_text(json.dumps(event(r.workflow, cb)))
    log = Path(ctx["log_dir"]) / f"{r.name}.log"
    # act's host mode hands this environment to the job, which runs in act's own copy of the checkout: the
    # JA_ROOT_DIR that scripts/run.sh exports names this checkout, not that copy, so it stays out (as on GitHub).
    env = {k: v for k, v in os.environ.items() if k != "JA_ROOT_DIR"}
    results = []
    with open(log, "w") as f, subprocess.Popen(
            act_command(r, cb, {**ctx, "event": str(event_file)}), cwd=ROOT, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
            env={**env, "GITHUB_REF_TYPE": "tag", "GITHUB_REF_NAME": "v0.0.0-local"}) as act:
        for line in act.stdout:
            try:
                rec = json.loads(line)
            except ValueError:
                f.write(line)
                continue
            where = rec.get("jobID", "act") + (f" {rec['matrix']['build']}"
                                               if "build" in (rec.get("matrix") or {}) else "")
            f.write(f"[{where}] {rec.get('msg', '').rstrip()}\n")
            if "jobResult" in rec:
                results.append((rec.get("jobID"), (rec.get("matrix") or {}).get("build"), rec["jobResult"]))
    for u in r.units:
        u.result = u.result or _verdict(u, results, log)
    if act.returncode and not any(u.result.startswith("failed") for u in r.units):  # a job it needs, or act itself
        for u in r.units:
            if u.job == r.job:
                u.result = f"failed (act exit {act.returncode}; log: {log})"


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
    cb = load_ci_build()
    every = units(cb)
    todo = selected(every, a.jobs)
    log_dir = ROOT / config.build_path("ci_local")
    log_dir.mkdir(parents=True, exist_ok=True)
    for u in todo:
        u.result = f"not runnable here ({u.why_not})" if u.why_not else ("would run" if a.list else "")
    with tempfile.TemporaryDirectory(prefix="ja-act-") as tmp, LocalStore(Path(tmp) / "store") as store:
        ctx = {"artifacts": str(Path(tmp) / "artifacts"), "store": store.url, "log_dir": str(log_dir)}
        for r in ([] if a.list else plan_runs(todo, every)):
            print(f"ci_local: act {r.workflow} -j {r.job}" + "".join(f" [{b}]" for b in r.builds)
                  + f" (log: {log_dir / r.name}.log)", flush=True)
            run(r, cb, ctx)
    for u in todo:
        print(f"{u.name:<58} {u.result}", flush=True)
    failed = [u for u in todo if u.result.startswith("failed")]
    print(f"ci_local: {len(todo)} job(s): {sum(u.result == 'succeeded' for u in todo)} succeeded, {len(failed)} "
          f"failed, {sum(u.result.startswith('skipped') for u in todo)} skipped, "
          f"{sum(u.result.startswith('not runnable') for u in todo)} not runnable here")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
