#!/usr/bin/env python3
r"""jax-aiter's CI driver: every CI build is data, and its commands are derived from that data.

Each build (a CI job) is a frozen dataclass in one registry (after XLA's build_tools/ci/build.py): where it
runs (runner label, container, GPU count), the environment it sets, and its steps, each a nox session or
invoke task of the command-line contract. The commands run through the one step runner (jatools/steps.py);
``${NAME}`` values (a release tag, a base revision) come from the CI environment when the build runs, and a
missing one stops the build before any command runs. The rules the commands follow (env-report first,
``--install-only`` then ``-R``, no retry of ours): docs/ci.md. Standard library and jatools only: this runs
before any virtual environment exists.

    python3 ci/build.py --list                 # builds, grouped, with runner and description
    python3 ci/build.py --build pr_cpu [--dry_run]
    python3 ci/build.py --matrix pr --event pull_request   # a workflow's matrix (JSON, also to $GITHUB_OUTPUT)
    PYTHONDONTWRITEBYTECODE=1 python3 ci/build.py --dump_commands > ci/golden_commands.txt  # after changing a build
    python3 ci/build.py --workflows            # write runners, timeouts and the Python version into the workflows
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shlex
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if __name__ == "__main__" and not __package__:
    # Run by its path (`python3 ci/build.py`, the contract's name): the same program as `python3 -m ci.build` from the
    # checkout root, where ci/ is a package of the checkout (jatools/stages.py) and the imports below resolve. Every
    # path this driver takes or writes is the checkout's, so running it from the root changes nothing else.
    os.chdir(ROOT)
    os.execv(sys.executable, [sys.executable, "-m", "ci.build", *sys.argv[1:]])

from ci.build_types import (  # what a build is made of (re-exported: the tests and workflows read them here)
    BUILD_ONLY_CUDA,
    BUILD_ONLY_ROCM,
    CPU_ENV,
    CUDA_ENV,
    GITHUB_HOSTED,
    H200_1,
    H200_2,
    MI355_1,
    MI355_1_MANYLINUX,
    MI355_4,
    PLACEHOLDER,
    PLAN_RUNNER,
    ROCM_ENV,
    UBUNTU,
    UBUNTU_CUDA,
    UBUNTU_THEROCK,
    Build,
    Invoke,
    Nox,
)
from jatools import atomic_write, config, steps  # after the re-run above
from jatools.ci import env_report, workflow_facts
from jatools.native import jit_build


def release_lane(backend: str) -> str:
    """The lane a backend's wheels are released in: jatools/wheel/wheel_layout.toml [lanes], read as data (the
    layout module needs `packaging`, which the plan jobs' bare Python lacks)."""
    layout = tomllib.loads((ROOT / "jatools" / "wheel" / "wheel_layout.toml").read_text())
    return layout["lanes"][backend]["name"]


def jit_modules() -> list[str]:
    """The JIT modules (the op table's, jit_build.libraries): the producer builds one shard per module."""
    return list(jit_build.libraries(config.load(env={})))


# The registry is this module's: each load of it (ci.build, or by its path as the tests load it) registers its own
# builds afresh; a name defined twice within one load still fails (Build.__post_init__).
Build._builds.clear()
PR_TIER = (("JA_TEST_TIER", "pr"),)
# The producer's merge job publishes the merged libraries to this folder (jit-libs-<cache id>/, content-addressed)
# and uploads it as the run's artifact jit-store-<backend>; a GPU job of the same run fetches from it
# (JA_FETCH_BASE_URL=build/jit-store) when the producer rebuilt, so a kernel PR's GPU jobs test its own kernels.
JIT_STORE = config.build_path("jit_store").as_posix()
RECORDS = config.build_path("ci_records")  # <build>.json per build, the environment report, the convergence gate's JSON
# The release base URL is JA_FETCH_BASE_URL (the workflows set it; fetch, decide and the lite wheel read it).
FETCH_JIT = Invoke("jit.fetch")
RELEASE_LANES = config.build_path("release").as_posix() + "-lanes"
# A store of releases (jatools/release_index.py: <store>/<tag or commit>/ and each lane's index <store>/<lane>/simple/):
# the release's upload job writes one, and so does every run of the CUDA lane's PR GPU job (INDEX_COMMIT).
RELEASE_STORE = config.build_path("release").as_posix() + "-store"
# After the tier passed against the lane's installed wheel: the files `nox -s release` validated, under the commit's
# name, with the artifact index (PEP 503 + 691, sha256), uploaded with the job's records (ci-<build>).
INDEX_COMMIT = Invoke("release.index", ("--to", RELEASE_STORE))
NATIVE = (Nox("umbrella", installs=False), Nox("ja_mods", installs=False))


def lane_tier(backend: str, tier: str) -> tuple[Nox, ...]:
    """A GPU tier against what users install (docs/ci.md): the lane's wheels built from the fetched JIT libraries,
    checked and clean-room validated (`nox -s release`, dist/ and its report), then the full wheel installed into a
    fresh venv and the tier run against it (`nox -s tests_lane`), never against the build tree."""
    return (Nox("release"), Nox("tests_lane", ("--lane", release_lane(backend)), env=(("JA_TEST_TIER", tier),),
                                installs=False))


Build(name="pr_cpu", group="pr", runner=UBUNTU, env=CPU_ENV, timeout_minutes=45,
      description="PR: lint, CPU-only tooling tests, the CPU JIT libraries (this job is their producer), "
                  "the pr test tier on the CPU, and the multigpu tier on 4 forced host devices",
      steps=(Nox("lint"), Nox("ci_tooling"), Nox("jit"), Nox("tests", env=PR_TIER),
             Nox("tests", env=(("JA_TEST_TIER", "multigpu"),
                               ("XLA_FLAGS", "--xla_force_host_platform_device_count=4")))))
Build(name="pr_convergence_gate", group="pr", runner=UBUNTU, timeout_minutes=10, events=("pull_request", "push"),
      description="PR: a numerics change needs a `Convergence:` decision trailer (ci/convergence_paths.toml)",
      steps=(Invoke("convergence-check",
                    ("--base", "${JA_BASE_REV}", "--json-out", (RECORDS / "convergence.json").as_posix())),))
Build(name="pr_compile_cuda", group="pr", runner=UBUNTU_CUDA, timeout_minutes=45,
      description=f"PR: compile every library for CUDA {dict(CUDA_ENV)['GPU_ARCHS']} with nvcc, no GPU",
      steps=(Nox("compile_only", ("--backend", "cuda")),))
Build(name="pr_compile_rocm", group="pr", runner=UBUNTU_THEROCK, timeout_minutes=45,
      description="PR: compile every library for ROCm with TheRock's hipcc, no GPU",
      steps=(Nox("compile_only", ("--backend", "rocm")),))
Build(name="pr_gpu_rocm_mi355", group="pr", runner=MI355_1, env=ROCM_ENV, timeout_minutes=60,
      description="PR: published JIT libraries fetched (never rebuilt), shims built, pr tier on 1x MI355",
      steps=(FETCH_JIT, Nox("tests", env=PR_TIER)))
Build(name="pr_gpu_cuda_h200", group="pr", runner=H200_1, env=CUDA_ENV, timeout_minutes=120,
      description="PR: published JIT libraries fetched (never rebuilt), the CUDA lane's wheels built and validated, "
                  "the full wheel installed into a fresh venv, pr tier against it on 1x H200; then the lane's files "
                  f"and the artifact index under the commit's name in {RELEASE_STORE}",
      steps=(FETCH_JIT, *lane_tier("cuda", "pr"), INDEX_COMMIT))

Build(name="nightly_rocm_4gpu", group="nightly", runner=MI355_4, env=ROCM_ENV, timeout_minutes=180,
      description="Nightly: the full test suite (nightly tier) on 4x MI355",
      steps=(FETCH_JIT, Nox("tests", env=(("JA_TEST_TIER", "nightly"),))))
Build(name="nightly_cuda_h200_bench", group="nightly", runner=H200_1, env=CUDA_ENV, timeout_minutes=45,
      description="Nightly: GPU kernel benchmark on 1x H200, gated against ci/perf/baselines/nvidia-h200.json "
                  "(a case slower than its noise band fails and is named)",
      steps=(FETCH_JIT, *NATIVE, Nox("bench", ("gpu", "--quick", "--gate"))))
Build(name="nightly_cpu_sanitize", group="nightly", runner=UBUNTU, timeout_minutes=60,
      description="Nightly: CPU libraries built with ASan+UBSan, CPU op tests against them",
      steps=(Nox("sanitize"),))
Build(name="nightly_cpu_tsan", group="nightly", runner=UBUNTU, timeout_minutes=60,
      description="Nightly: CPU libraries built with ThreadSanitizer, every threaded CPU kernel driven from "
                  "several threads at once (ci/sanitizers/tsan_driver.cpp)",
      steps=(Nox("tsan"),))
Build(name="nightly_cpu_bench_smoke", group="nightly", runner=UBUNTU, env=CPU_ENV, timeout_minutes=45,
      description="Nightly: tiny-scale smoke of the tooling benchmark harness (numbers go to the artifact), on the "
                  "native CPU build it measures (this job is its own JIT producer: no CPU libraries are published)",
      steps=(NATIVE[0], Nox("jit"), NATIVE[1], Nox("bench", ("--scale", "0.01"))))
Build(name="nightly_cpu_jax_range", group="nightly", runner=UBUNTU, env=CPU_ENV, timeout_minutes=60,
      description="Nightly: the export round trip (single and 4 CPU devices) on the oldest and on the newest JAX of "
                  "the range pyproject.toml declares, each in a fresh venv (docs/ci.md, JAX versions; its own JIT "
                  "producer: no CPU libraries are published)",
      steps=(NATIVE[0], Nox("jit"), NATIVE[1], Nox("jax_range")))

Build(name="multigpu_rocm_4gpu", group="multigpu", runner=MI355_4, env=ROCM_ENV, timeout_minutes=120,
      description="Multi-GPU: sharded cases (multigpu tier) across 4x MI355, unpinned",
      steps=(FETCH_JIT, Nox("tests", env=(("JA_TEST_TIER", "multigpu"),))))
Build(name="multigpu_cuda_h200_2gpu", group="multigpu", runner=H200_2, env=CUDA_ENV, timeout_minutes=180,
      description="Multi-GPU: the CUDA lane's validated full wheel in a fresh venv, sharded cases (multigpu tier) "
                  "against it across 2x H200, unpinned",
      steps=(FETCH_JIT, *lane_tier("cuda", "multigpu")))

# The JIT-library producer: the only builds that compile GPU JIT libraries. One shard per (backend, module)
# on build-only runners with no GPU; the merge step joins the shards into one manifest and stages it as this
# run's store; the publish step uploads it where consumers fetch from (JA_FETCH_BASE_URL: the repository's
# releases through gh, or an HTTP store that takes PUT), and the check step fetches it back from there, pinned to
# the bytes the merge staged. The CPU backend runs the same chain on a GitHub-hosted runner in minutes: jit-libs.yml
# runs it when asked (its `backends` input), and `nox -s ci_local` runs it against a store on 127.0.0.1 as the
# stand-in for the GPU backends' runners and containers; no CI job consumes CPU libraries.
PRODUCER_BACKENDS = (("rocm", BUILD_ONLY_ROCM, ROCM_ENV), ("cuda", BUILD_ONLY_CUDA, CUDA_ENV), ("cpu", UBUNTU, CPU_ENV))
for _backend, _runner, _env in PRODUCER_BACKENDS:
    Build(name=f"jit_libs_plan_{_backend}", group="jit_libs", runner=UBUNTU, env=_env, timeout_minutes=15,
          description=f"JIT producer ({_backend}): reuse or rebuild? (decision= and rebuild= to $GITHUB_OUTPUT)",
          steps=(Invoke("jit.decide"),))
    for _module in jit_modules():
        Build(name=f"jit_libs_{_backend}_{_module}", group=f"jit_libs_shard_{_backend}", runner=_runner,
              env=_env, timeout_minutes=240,
              description=f"JIT producer ({_backend}): build {_module} only (offline, no GPU)",
              steps=(Nox("jit", ("--module", _module)),))
    Build(name=f"jit_libs_merge_{_backend}", group="jit_libs", runner=UBUNTU, env=_env, timeout_minutes=30,
          description=f"JIT producer ({_backend}): merge the shards into build/aiter_build with one manifest, verify, "
                      f"and stage them as a store in {JIT_STORE} (this run's consumers fetch from it)",
          steps=(Invoke("jit.merge-manifests", ("--from", config.build_path("jit_shards").as_posix())),
                 Invoke("verify"), Invoke("jit.publish", ("--to", JIT_STORE))))
    Build(name=f"jit_libs_publish_{_backend}", group="jit_libs", runner=UBUNTU, env=_env, timeout_minutes=60,
          description=f"JIT producer ({_backend}): compress, verify and upload the merged libraries where consumers "
                      "fetch from (write access)",
          steps=(Invoke("verify"), Invoke("jit.publish", ("--to", "${JA_FETCH_BASE_URL}"))))
    Build(name=f"jit_libs_check_{_backend}", group="jit_libs", runner=UBUNTU, env=_env, timeout_minutes=30,
          description=f"JIT producer ({_backend}): a consumer fetches the published libraries back, pinned to the "
                      f"ones the merge staged ({JIT_STORE})",
          steps=(Invoke("jit.fetch", ("--pins-from", JIT_STORE)),))

Build(name="weekly_convergence", group="convergence", runner=MI355_1, env=ROCM_ENV, timeout_minutes=120,
      description="Weekly: a small LM trained with the kernels and with plain JAX must reach the same loss "
                  "(float32 and bfloat16, 1x MI355); logs summarised to the job summary",
      steps=(FETCH_JIT, *NATIVE,
             Nox("convergence", ("--steps", "300", "--repeats", "3", "--out", "build/convergence/float32")),
             Nox("convergence", ("--steps", "300", "--dtype", "bfloat16", "--repeats", "3",
                                 "--out", "build/convergence/bfloat16"))))

Build(name="validation_image", group="images", runner=UBUNTU, timeout_minutes=90,
      description="Publish the clean-room validation image tagged with its Dockerfile hash (skip if present)",
      steps=(Invoke("image.publish", ("--push",)),))

# The release: one build per lane (jatools/wheel/wheel_layout.toml [lanes], docs/wheels.md), each its backend's
# wheels built from published JIT libraries, checked and clean-room validated on its GPU; then one job writes the
# artifact index over every lane's files, attests them and uploads them. Each lane's dist/ arrives in the upload
# job as the artifact release-dist-<build>, downloaded to RELEASE_LANES/release-dist-<build>/.
_LANE_RUNNERS = {"rocm": (MI355_1_MANYLINUX, (*ROCM_ENV, ("JA_WHEEL_ARCH", "gfx950"),
                                              ("JA_WHEEL_PLAT_NAME", "manylinux_2_39_x86_64"))),
                 "cuda": (H200_1, CUDA_ENV)}
RELEASES = []
for _backend, (_runner, _env) in _LANE_RUNNERS.items():
    _lane = release_lane(_backend)
    RELEASES.append(Build(
        name=f"release_{_lane}", group="release", runner=_runner, env=_env, timeout_minutes=180,
        description=f"Release, lane {_lane}: fetch the {_backend} JIT libraries, both wheels, verify/floor/contents, "
                    f"clean-room validation of both on 1x {'MI355' if _backend == 'rocm' else 'H200'}, "
                    "dist/release-report.json",
        steps=(Nox("release", ("--fetch-jit", "${JA_FETCH_BASE_URL}")),)))
_LANE_ARGS = tuple(a for b in RELEASES for a in ("--lane", f"{RELEASE_LANES}/release-dist-{b.name}"))
Build(name="release_index", group="release_upload", runner=UBUNTU, timeout_minutes=30,
      description="Release: every lane's files and the artifact index (PEP 503 + PEP 691, sha256) written into a "
                  f"store folder ({RELEASE_STORE}), to be attested with the wheels",
      steps=(Invoke("release.upload", ("--tag", "${JA_RELEASE_TAG}", "--to", RELEASE_STORE, *_LANE_ARGS)),))
Build(name="release_upload", group="release_upload", runner=UBUNTU, timeout_minutes=30,
      description="Release: upload every lane's validated wheels and the sdist (refuses a stale or red report)",
      steps=(Invoke("release.upload", ("--tag", "${JA_RELEASE_TAG}", *_LANE_ARGS)),))


class BuildError(RuntimeError):
    """A build, group or CI value that does not exist: exit 2."""


def dump_commands() -> str:
    return "".join(f"# BEGIN {name}\n" + "".join(shlex.join(c) + "\n" for c in build.commands()) + f"# END {name}\n"
                   for name, build in Build.all_builds().items())


def get_build(name: str) -> Build:
    builds = Build.all_builds()
    if name not in builds:
        raise BuildError(f"unknown build {name!r}; valid builds: {', '.join(builds)} "
                         "(`python3 ci/build.py --list` describes them)")
    return builds[name]


def substitute(cmd: list[str], env: dict[str, str]) -> list[str]:
    return [PLACEHOLDER.sub(lambda m: env[m.group(1)], arg) for arg in cmd]


def run_build(build: Build, dry_run: bool = False, env: dict[str, str] | None = None) -> int:
    """Run the build's commands in order from the repository root; stop at the first failure.
    Every command is told where the environment report is (JA_ENV_REPORT); RECORDS/<build>.json records them."""
    env = dict(os.environ if env is None else env)
    missing = [p for p in build.placeholders() if not env.get(p)]
    if missing and not dry_run:
        raise BuildError(f"build {build.name} needs {', '.join(missing)} in the environment "
                         "(the workflow sets them; see docs/ci.md)")
    env[env_report.CI_REPORT_VAR] = str(ROOT / env_report.CI_REPORT)
    argvs = [cmd if dry_run else substitute(cmd, env) for cmd in build.commands()]
    todo = [steps.Step(str(i), argv, env, ROOT, rerun=f"(from the repository root) {shlex.join(argv)}")
            for i, argv in enumerate(argvs, 1)]
    code = 0
    try:
        records = steps.run(todo, f"ci/build.py {build.name}", groups=bool(env.get("GITHUB_ACTIONS")),
                            dry_run=dry_run)
    except steps.StepFailed as e:
        records, code = e.records, e.record.exit or 1
        print(e, file=sys.stderr)
    if dry_run:
        return code
    commands = [{"command": r.command, "exit": r.exit, "seconds": r.seconds} for r in records if r.result != "not run"]
    atomic_write.write_text(ROOT / RECORDS / f"{build.name}.json",
                            json.dumps({"build": build.name, "commands": commands}, indent=2) + "\n")
    if not code:
        print(f"ci/build.py: build {build.name} passed: {len(records)} commands, "
              f"{sum(r.seconds for r in records):.1f} s ({(RECORDS / build.name).as_posix()}.json)", flush=True)
    return code


def github_event(env: dict[str, str]) -> tuple[str | None, bool]:
    """(event name, from a fork) of the running GitHub workflow; (None, False) outside GitHub Actions."""
    event = env.get("GITHUB_EVENT_NAME") or None
    if event != "pull_request" or not env.get("GITHUB_EVENT_PATH"):
        return event, False
    with open(env["GITHUB_EVENT_PATH"], "rb") as f:
        head = json.loads(f.read(1 << 20)).get("pull_request", {}).get("head", {}).get("repo", {})
    return event, head.get("full_name") != env.get("GITHUB_REPOSITORY")


def matrix(group: str, event: str | None = None, fork: bool = False, runners: str | None = None) -> dict:
    """A GitHub matrix of the group's builds, each entry saying where and how it runs. With `event`, only the
    builds that event runs; for a fork's pull request, none on a self-hosted GPU runner (never a fork's code;
    the workflows' job-level `if:` is the guard, this a second one). `runners`: only the GPU or CPU builds."""
    builds = [b for b in Build.all_builds().values() if b.group == group]
    if not builds:
        groups = sorted({b.group for b in Build.all_builds().values()})
        raise BuildError(f"no builds in group {group!r}; groups: {', '.join(groups)}")
    return {"include": [{"build": b.name, "runner": b.runner.label, "container": b.runner.container or "",
                         "options": b.runner.options_text, "timeout_minutes": b.timeout_minutes,
                         "backend": dict(b.env).get("JA_BACKEND", "cpu")}
                        for b in builds if (event is None or not b.events or event in b.events)
                        and not (fork and b.runner.gpus) and runners in (None, "gpu" if b.runner.gpus else "cpu")]}


def check_release_tag(env: dict[str, str]) -> str:
    """The release's tag (a `v*` tag the workflow runs on); checked in the release workflow's first minute, so a
    dispatch from a branch fails at once, not after the release build at upload."""
    kind, name = env.get("GITHUB_REF_TYPE", ""), env.get("GITHUB_REF_NAME", "")
    if kind != "tag" or not re.fullmatch(r"v\d+(\.\d+)*([-.+\w]*)", name):
        raise BuildError(f"the release runs on a version tag (v1.2.3), not on {kind or 'ref'} {name!r}: push the "
                         "tag (git tag v1.2.3 && git push origin v1.2.3) or dispatch release.yml with "
                         "`Use workflow from` set to the tag")
    return name


def workflow_files() -> dict[Path, str]:
    """Each workflow, and actionlint's runner labels, with this file's facts written in (docs/ci.md)."""
    def facts(name: str) -> tuple[str, int]:
        return get_build(name).runner.label, get_build(name).timeout_minutes

    python = config.python_version(ROOT)
    files = {p: workflow_facts.workflow(p.read_text(), facts, PLAN_RUNNER.label, python)
             for p in sorted((ROOT / ".github" / "workflows").glob("*.yml"))}
    labels = sorted({b.runner.label for b in Build.all_builds().values()} - GITHUB_HOSTED)
    lint = ROOT / ".github" / "actionlint.yaml"
    return {**files, lint: workflow_facts.actionlint_config(lint.read_text(), labels)}


def write_workflows() -> list[Path]:
    """Write the files workflow_files() changes; returns them."""
    files = workflow_files()
    changed = [p for p, text in files.items() if p.read_text() != text]
    for p in changed:
        atomic_write.write_text(p, files[p])
    return changed


def list_builds() -> str:
    lines = []
    by_group = sorted(Build.all_builds().values(), key=lambda b: b.group)
    for group, builds in itertools.groupby(by_group, key=lambda b: b.group):
        lines.append(f"{group}:")
        for b in builds:
            where = b.runner.label + (f" [{b.runner.container}]" if b.runner.container else "")
            lines.append(f"  {b.name:<28} {where}\n  {'':<28} {b.description}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="ci/build.py", description=__doc__.splitlines()[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--build", metavar="NAME", help="run one build")
    mode.add_argument("--list", action="store_true", help="name and describe every build")
    mode.add_argument("--dump_commands", action="store_true", help="print every build's commands (the golden file)")
    mode.add_argument("--matrix", metavar="GROUP", help="print a GitHub matrix of the group's builds as JSON")
    mode.add_argument("--workflows", action="store_true",
                      help="write this file's facts (runners, timeouts, Python version) into .github/workflows")
    mode.add_argument("--check-release-tag", action="store_true",
                      help="fail unless the workflow runs on a version tag ($GITHUB_REF_TYPE, $GITHUB_REF_NAME)")
    p.add_argument("--dry_run", action="store_true", help="with --build: print the commands without running them")
    p.add_argument("--event", help="with --matrix: only the builds this GitHub event runs")
    p.add_argument("--runners", choices=("cpu", "gpu"),
                   help="with --matrix: only the builds on CPU or GPU runners (output `matrix_cpu`/`matrix_gpu`)")
    args = p.parse_args(argv)
    try:
        if args.list:
            print(list_builds())
        elif args.dump_commands:
            sys.stdout.write(dump_commands())
        elif args.matrix:
            event, fork = github_event(dict(os.environ))
            text = json.dumps(matrix(args.matrix, args.event or event, fork, args.runners))
            print(text)
            steps.github_output({"matrix" + (f"_{args.runners}" if args.runners else ""): text})
        elif args.workflows:
            changed = write_workflows()
            print("\n".join(f"wrote {p.relative_to(ROOT)}" for p in changed) or "the workflows are up to date")
        elif args.check_release_tag:
            print(f"release tag: {check_release_tag(dict(os.environ))}")
        else:
            return run_build(get_build(args.build), args.dry_run)
    except BuildError as e:
        print(f"ci/build.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
