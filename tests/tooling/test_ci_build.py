"""ci/build.py: the registry, the golden file, the command line, and a real build run end to end."""
from __future__ import annotations

import difflib
import functools
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "ci" / "golden_commands.txt"
REGENERATE = "PYTHONDONTWRITEBYTECODE=1 python3 ci/build.py --dump_commands > ci/golden_commands.txt"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


ci_build = _load("ja_ci_build", ROOT / "ci" / "build.py")


@functools.cache
def nox_sessions() -> dict[str, object]:
    """Sessions defined in noxfile.py, from nox's own registry (imported once: nox registers globally)."""
    import nox.registry

    _load("ja_noxfile", ROOT / "noxfile.py")
    return dict(nox.registry.get())


def invoke_tasks() -> set[str]:
    """Task names (with namespaces, e.g. image.publish) and aliases from tasks.py."""
    tasks = _load("ja_tasks", ROOT / "tasks.py")
    names = set()
    for name, aliases in tasks.ns.task_names.items():
        names.add(name)
        names.update(aliases)
    return names


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("GITHUB_OUTPUT", "GITHUB_ACTIONS")}
    full.update(PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}", **(env or {}))
    return subprocess.run([sys.executable, str(ROOT / "ci" / "build.py"), *args], check=False, capture_output=True,
                          text=True, env=full, cwd=ROOT)


def test_golden_file_is_current() -> None:
    want = ci_build.dump_commands()
    have = GOLDEN.read_text() if GOLDEN.exists() else ""
    if have != want:
        diff = "".join(difflib.unified_diff(have.splitlines(True), want.splitlines(True), "golden", "build.py", n=1))
        pytest.fail(f"ci/golden_commands.txt is stale; regenerate it with:\n  {REGENERATE}\n{diff[:4000]}")


def test_required_builds_exist() -> None:
    builds = ci_build.Build.all_builds()
    for name in ("pr_cpu", "pr_compile_cuda", "pr_compile_rocm", "pr_gpu_rocm_mi355", "pr_gpu_cuda_h200",
                 "nightly_rocm_4gpu", "multigpu_rocm_4gpu", "validation_image", "release_rocm7", "release_cuda13",
                 "release_index", "release_upload", "pr_convergence_gate", "nightly_cpu_sanitize"):
        assert name in builds
    shards = {n for n, b in builds.items() if b.group == "jit_libs_shard_rocm"}
    assert shards == {f"jit_libs_rocm_{m}" for m in ci_build.jit_modules()}
    assert builds["pr_gpu_rocm_mi355"].runner.gpus == 1 and builds["nightly_rocm_4gpu"].runner.gpus == 4


def test_the_cuda_lanes_gpu_tiers_test_its_validated_wheel_installed_never_the_build_tree() -> None:
    """Every GPU-tier build of the CUDA lane (issue 57): the JIT libraries fetched, the lane's wheels built and
    validated by `nox -s release`, then `nox -s tests_lane` (jatools/lane_tier.py: the full wheel the report
    vouches for, in a fresh venv) runs its tier; no `nox -s tests` (the build tree's tier) is left in them."""
    lane = ci_build.release_lane("cuda")
    tiers = {}
    for name, build in ci_build.Build.all_builds().items():
        if build.runner.gpus and ("JA_BACKEND", "cuda") in build.env and build.sessions() & {"tests", "tests_lane"}:
            runs = [c[c.index("nox"):] for c in build.commands() if "nox" in c and "--install-only" not in c]
            assert runs[0] == ["nox", "-R", "-s", "release"], (name, runs)
            assert runs[1] == ["nox", "-s", "tests_lane", "--", "--lane", lane], (name, runs)
            assert "tests" not in build.sessions(), name
            assert build.commands()[1][-2:] == ["invoke", "jit.fetch"], name  # before the release takes them
            tiers[name] = dict(next(s for s in build.steps
                                    if getattr(s, "session", "") == "tests_lane").env)["JA_TEST_TIER"]
    assert tiers == {"pr_gpu_cuda_h200": "pr", "multigpu_cuda_h200_2gpu": "multigpu"}


def test_every_pr_run_of_the_cuda_lane_ends_with_its_index() -> None:
    """pr_gpu_cuda_h200 (every push to main, every PR) ends, after the tier against the installed lane wheel, with
    the validated files and the artifact index under the commit's name in the store folder its artifact holds."""
    cmds = ci_build.Build.all_builds()["pr_gpu_cuda_h200"].commands()
    tier = next(i for i, c in enumerate(cmds) if "tests_lane" in c)
    assert cmds[-1][-4:] == ["invoke", "release.index", "--to", ci_build.RELEASE_STORE] and len(cmds) == tier + 2


def test_every_build_starts_with_the_environment_report() -> None:
    for build in ci_build.Build.all_builds().values():
        first = build.commands()[0]
        assert first[first.index("invoke"):][:2] == ["invoke", "env-report"], build.name


def test_no_build_wraps_a_command_in_a_retry_of_its_own() -> None:
    """One retry layer: the installers and the JIT fetch retry transient errors; a cache miss fails at once."""
    for build in ci_build.Build.all_builds().values():
        for cmd in build.commands():
            assert not any("retry" in tok for tok in cmd), (build.name, cmd)


def test_only_the_jit_producer_builds_jit_libraries() -> None:
    """GPU JIT libraries come from the producer's shards only; a CPU job is its own producer (none are
    published for the CPU). Every GPU test job fetches them first: its test session is a consumer (CI=true)."""
    for build in ci_build.Build.all_builds().values():
        builds_jit = "jit" in build.sessions()
        cpu = ("JA_BACKEND", "cpu") in build.env
        tests_cpu = cpu and bool({"tests", "bench", "jax_range"} & build.sessions())
        assert builds_jit == (build.group.startswith("jit_libs_shard") or tests_cpu), build.name
        if builds_jit and not cpu:
            assert build.runner.gpus == 0 and build.runner.label == "build-only-jax-aiter"
        if build.runner.gpus and {"tests", "convergence"} & build.sessions():
            cmds = [" ".join(c) for c in build.commands()]
            fetch = next(i for i, c in enumerate(cmds) if "invoke jit.fetch" in c)
            assert all(fetch < i for i, c in enumerate(cmds) if "nox -R -s tests" in c), build.name


def test_install_only_once_per_session_and_only_for_sessions_with_a_venv() -> None:
    sessions = nox_sessions()
    for build in ci_build.Build.all_builds().values():
        installs = [c for c in build.commands() if "--install-only" in c]
        names = [c[c.index("-s") + 1] for c in installs]
        assert len(names) == len(set(names)), build.name
        for step in build.steps:
            if isinstance(step, ci_build.Nox) and step.session in sessions:
                no_venv = getattr(sessions[step.session], "venv_backend", None) == "none"
                assert step.installs != no_venv, f"{build.name}: Nox({step.session!r}).installs must be {not no_venv}"


def test_named_sessions_and_tasks_exist() -> None:
    sessions, tasks = set(nox_sessions()), invoke_tasks()
    named_sessions = set().union(*(b.sessions() for b in ci_build.Build.all_builds().values()))
    named_tasks = set().union(*(b.tasks() for b in ci_build.Build.all_builds().values()))
    unknown = sorted((named_sessions - sessions) | (named_tasks - tasks))
    assert not unknown, f"builds name entry points that exist nowhere: {unknown}"


def test_unknown_build_lists_the_valid_ones() -> None:
    r = cli("--build", "pr_cpuu")
    assert r.returncode == 2
    assert "unknown build 'pr_cpuu'; valid builds: " in r.stderr and "pr_cpu," in r.stderr


def test_list_names_every_build() -> None:
    r = cli("--list")
    assert r.returncode == 0
    for name in ci_build.Build.all_builds():
        assert f"  {name} " in r.stdout


def test_matrix_and_github_output(tmp_path: Path) -> None:
    out = tmp_path / "github_output"
    r = cli("--matrix", "jit_libs_shard_rocm", env={"GITHUB_OUTPUT": str(out)})
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert sorted(e["build"] for e in data["include"]) == sorted(f"jit_libs_rocm_{m}" for m in ci_build.jit_modules())
    assert out.read_text() == f"matrix={json.dumps(data)}\n"
    entry = data["include"][0]
    build = ci_build.get_build(entry["build"])
    assert entry == {"build": build.name, "runner": build.runner.label, "container": build.runner.container or "",
                     "options": build.runner.options_text, "timeout_minutes": build.timeout_minutes,
                     "backend": dict(build.env).get("JA_BACKEND", "cpu")}
    bad = cli("--matrix", "nope")
    assert bad.returncode == 2 and "groups: " in bad.stderr


def test_matrix_for_an_event_leaves_out_the_builds_it_does_not_run() -> None:
    every = {e["build"] for e in ci_build.matrix("pr")["include"]}
    dispatched = {e["build"] for e in ci_build.matrix("pr", "workflow_dispatch")["include"]}
    assert every - dispatched == {"pr_convergence_gate"}  # it needs a base revision, which a dispatch has not


def test_placeholders_come_from_the_environment() -> None:
    build = ci_build.get_build("release_upload")
    assert build.placeholders() == ["JA_RELEASE_TAG"]
    with pytest.raises(ci_build.BuildError, match="needs JA_RELEASE_TAG"):
        ci_build.run_build(build, env={})
    cmd = next(c for c in build.commands() if "release.upload" in c)
    got = ci_build.substitute(cmd, {"JA_RELEASE_TAG": "v0.1.0"})
    assert got[got.index("--tag") + 1] == "v0.1.0"
    lanes = [got[i + 1] for i, a in enumerate(got) if a == "--lane"]  # every lane's dist, as the workflow lays it
    assert lanes == [f"{ci_build.RELEASE_LANES}/release-dist-{b.name}" for b in ci_build.RELEASES]


def test_dry_run_prints_without_running() -> None:
    r = cli("--build", "release_cuda13", "--dry_run")
    assert r.returncode == 0
    assert "nox -R -s release -- --fetch-jit '${JA_FETCH_BASE_URL}'" in r.stdout


def test_a_real_build_runs_end_to_end_and_stops_at_the_first_failure(tmp_path: Path) -> None:
    """pr_convergence_gate runs real invoke processes: the environment report, then the gate."""
    ok = cli("--build", "pr_convergence_gate", env={"JA_BASE_REV": "HEAD", "GITHUB_ACTIONS": "true"})
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "::group::[1] invoke env-report" in ok.stdout and "== environment report ==" in ok.stdout
    assert "convergence-check: passed" in ok.stdout
    summary = json.loads((ROOT / ci_build.RECORDS / "pr_convergence_gate.json").read_text())
    assert [c["exit"] for c in summary["commands"]] == [0, 0]
    bad = cli("--build", "pr_convergence_gate", env={"JA_BASE_REV": "no-such-revision"})
    assert bad.returncode == 2
    assert "step 2 failed (exit 2)" in bad.stderr and "re-run just this step" in bad.stderr


def test_every_command_is_told_where_the_environment_report_is(monkeypatch) -> None:
    """JA_ENV_REPORT: the release takes the report the build wrote first instead of reporting again."""
    seen = []
    monkeypatch.setattr(ci_build.steps, "run", lambda todo, label, **kw: seen.extend(todo) or [])
    assert ci_build.run_build(ci_build.get_build("release_rocm7"), dry_run=True, env={}) == 0
    assert seen[0].argv[-3:] == ["env-report", "--json-out", "build/ci-records/env-report.json"]
    assert all(s.env["JA_ENV_REPORT"] == str(ROOT / "build/ci-records/env-report.json") for s in seen)


def test_registry_rejects_bad_builds() -> None:
    with pytest.raises(ValueError, match="defined twice"):
        ci_build.Build(name="pr_cpu", group="pr", description="", runner=ci_build.UBUNTU, steps=())
    with pytest.raises(ValueError, match="lower_snake_case"):
        ci_build.Build(name="Bad-Name", group="pr", description="", runner=ci_build.UBUNTU, steps=())
