"""The container path: engine detection (this machine has a docker client and no engine), the image, and the
exact command lines it would run. A recording runner stands in for the engine, which cannot run here."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from jatools import config
from jatools.validate import cleanroom, cleanroom_steps
from jatools.validate import cleanroom_env as cenv
from tests.validate.conftest import REPO


class Recorder:
    """Stands in for a container engine: records each command and answers from a table of exit codes."""

    def __init__(self, codes: dict[str, int] | None = None):
        self.codes = codes or {}
        self.calls: list[list[str]] = []

    def __call__(self, cmd) -> subprocess.CompletedProcess:
        cmd = list(cmd)
        self.calls.append(cmd)
        rc = self.codes.get(cmd[1] if cmd[1] != "image" else "image inspect", 0)
        return subprocess.CompletedProcess(cmd, rc, stdout="", stderr="" if rc == 0 else "denied: not authorized")


@pytest.mark.skipif(shutil.which("docker") is None, reason="no docker client on PATH to probe")
def test_a_client_without_an_engine_is_detected_cleanly():
    """The real docker client, no daemon: no exception, a sentence that says so, the engine-free path."""
    p = cenv.probe("docker")
    assert p.path and not p.answers
    assert "no engine answers" in p.detail and p.path in p.detail
    engine, why = cenv.choose("auto")
    if engine is None:  # where a daemon does run, auto picks it; here none does
        assert why.startswith("engine-free path:") and "docker client at" in why


def test_missing_client_and_forced_engine():
    p = cenv.probe("podman", which=lambda name: None)
    assert p == cenv.Probe("podman", None, False, "podman is not installed")
    silent = lambda e: cenv.Probe(e, f"/usr/bin/{e}", False, f"{e} client at /usr/bin/{e}, but no engine answers (x)")
    with pytest.raises(cenv.CleanRoomError, match="--engine docker was asked for, but docker client"):
        cenv.choose("docker", probes=silent)
    assert cenv.choose("none") == (None, "engine-free (asked for with --engine none)")
    answering = lambda e: cenv.Probe(e, f"/usr/bin/{e}", e == "podman", "5.0.1")
    engine, why = cenv.choose("auto", probes=answering)
    assert engine.engine == "podman" and why == "container path: podman 5.0.1 answers"


def test_probe_reads_the_daemon_version():
    rec = lambda cmd: subprocess.CompletedProcess(cmd, 0, stdout="27.3.1\n", stderr="")
    p = cenv.probe("docker", run=rec, which=lambda n: "/usr/bin/docker")
    assert p.answers and p.detail == "27.3.1"


def test_image_is_named_by_the_recipe_hash():
    ref, build = cenv.image_ref("rocm", REPO), cenv.build_command("rocm", REPO)
    tag = cenv.image_tag("rocm", REPO)
    assert ref == f"{cenv.repository(REPO)}:{tag}"
    assert tag.startswith("v") and len(tag.split("-")[0]) == 13
    assert build[1:4] == ["build", "--build-arg", "VARIANT=rocm"] and build[-2].endswith("Dockerfile.lite")
    out = subprocess.run(["bash", str(REPO / "ci/validation_image_id.sh"), "--variant", "rocm"],
                         check=False, capture_output=True, text=True, env={**os.environ, "PYTHON": "python3"})
    assert out.stdout.strip() == tag, out.stderr


@pytest.mark.parametrize("codes, how, built", [({}, "present", False), ({"image inspect": 1}, "pulled", False),
                                              ({"image inspect": 1, "pull": 1}, "built", True)])
def test_present_else_pull_else_build(codes, how, built):
    rec, said = Recorder(codes), []
    got = cenv.acquire_image("docker", "reg/img:v1-cpu", ["build", "--tag", "reg/img:v1-cpu", "ctx"], rec,
                                  said.append)
    assert got == how
    assert (["docker", "build", "--tag", "reg/img:v1-cpu", "ctx"] in rec.calls) == built
    if built:
        assert "pull of reg/img:v1-cpu failed (denied: not authorized); building it locally" in said[-1]


def test_a_failed_local_build_is_an_error():
    rec = Recorder({"image inspect": 1, "pull": 1, "build": 1})
    with pytest.raises(cenv.CleanRoomError, match=r"`docker build --tag x ctx` failed \(exit 1\)"):
        cenv.acquire_image("docker", "x", ["build", "--tag", "x", "ctx"], rec, lambda m: None)


def _fake_dev(tmp: Path, nodes: dict[str, int]) -> Path:
    for rel, gid in nodes.items():
        p = tmp / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.touch()
        os.chown(p, -1, gid)
    return tmp


@pytest.mark.skipif(os.geteuid() != 0, reason="setting a file's group to another gid needs root")
def test_rocm_flags_carry_the_device_groups(tmp_path):
    dev = _fake_dev(tmp_path, {"kfd": 992, "dri/card0": 44, "dri/renderD128": 993})
    flags, note = cenv.gpu_flags("rocm", dev)
    assert flags == ["--device", "/dev/kfd", "--device", "/dev/dri", "--group-add", "44", "--group-add", "992",
                     "--group-add", "993", "--ipc=host", "--shm-size=16g", "--security-opt", "seccomp=unconfined"]
    assert "groups 44, 992, 993" in note


def test_cuda_and_cpu_flags(tmp_path):
    assert cenv.gpu_flags("cuda", _fake_dev(tmp_path, {"nvidiactl": 0}))[0] == [
        "--gpus", "all", "--ipc=host", "--shm-size=16g"]
    flags, note = cenv.gpu_flags("rocm", tmp_path / "empty")
    assert flags == [] and "validated on the CPU only" in note
    assert cenv.gpu_flags("cpu")[0] == []


def test_exact_container_command_lines(tmp_path):
    """What a lite validation runs through docker: start, every plan step through exec, stop."""
    wheel, smoke, out, release = (tmp_path / "jax_aiter-0.1.0-py3-none-linux_x86_64.whl", tmp_path / "smoke",
                                  tmp_path / "out", tmp_path / "rel")
    mounts = cenv.Mounts(wheel, smoke, out, release)
    start = cenv.start_command("docker", "reg/img:vabc-cpu", "ja-validate-1", mounts, [])
    assert start == [
        "docker", "run", "--detach", "--rm", "--name", "ja-validate-1", "--network", "none", "--user", "1500:1500",
        "--env", "HOME=/tmp/validator", "--env", "XDG_CACHE_HOME=/tmp/validator/.cache", "--workdir", "/tmp/validator",
        "--volume", f"{wheel}:/validate/wheel/{wheel.name}:ro", "--volume", f"{smoke}:/validate/smoke:ro",
        "--volume", f"{out}:/validate/out:rw", "--volume", f"{release}:/validate/release:ro",
        "reg/img:vabc-cpu", "sleep", "infinity"]
    layout = cleanroom_steps.Layout(python="python3.12", venv="/tmp/validator/venv", work="/tmp/validator",
                              smoke="/validate/smoke", out="/validate/out", wheel=f"/validate/wheel/{wheel.name}",
                              wheelhouse="/opt/wheelhouse", release="/validate/release", checkout="/src")
    plan = cleanroom_steps.plan(layout, cenv.Installer("pip"), "lite", ["jax==0.11.0", "jaxlib==0.11.0"])
    lines = [" ".join(cenv.exec_command("docker", "ja-validate-1", s.argv, layout.work)) for s in plan]
    ex = "docker exec --workdir /tmp/validator ja-validate-1 "
    py = "/tmp/validator/venv/bin/python"
    smoke_args = "--checkout /src --record /validate/smoke/wheel-RECORD"
    assert lines == [
        ex + "python3.12 -m venv /tmp/validator/venv",
        ex + f"{py} -m pip install --quiet --no-index --no-cache-dir --disable-pip-version-check --find-links "
             f"/opt/wheelhouse /validate/wheel/{wheel.name}[fetch] jax==0.11.0 jaxlib==0.11.0",
        ex + f"{py} -I /validate/smoke/cleanroom_smoke.py --variant lite {smoke_args} "
             "--release /validate/release --out /validate/out/smoke.json",
    ]
    assert cenv.stop_command("docker", "ja-validate-1") == ["docker", "rm", "--force", "ja-validate-1"]


def test_container_route_runs_the_plan_through_the_engine(good_wheels, monkeypatch):
    """The whole container route for a full wheel, the engine replaced by the recorder: the exact sequence."""
    rec = Recorder()

    class Popen:  # the plan's steps (jatools.steps runs them, their output to a log): recorded, never run
        def __init__(self, cmd, **kw):
            self.returncode, self.stdout = rec(cmd).returncode, iter(())

        def wait(self) -> int:
            return self.returncode

    monkeypatch.setattr(cenv, "choose",
                        lambda mode: (cenv.Probe("docker", "/usr/bin/docker", True, "27.3.1"), "container path"))
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: rec(cmd))
    monkeypatch.setattr(subprocess, "Popen", Popen)
    wheel = good_wheels["full"]
    report = cleanroom.validate(cleanroom.Options(root=REPO, wheels=[wheel], engine="docker", log=lambda m: None))
    (res,) = report.results
    ref = cenv.image_ref("cpu", REPO)
    assert res.route == f"container, docker {ref}"
    verbs = [c[1] if c[1] != "exec" else "exec " + " ".join(c[c.index("/tmp/validator") + 2:][:3]) for c in rec.calls]
    assert verbs == ["image", "run",
                     "exec python3.12 -m venv",
                     "exec /tmp/validator/venv/bin/python -m pip",
                     "exec /tmp/validator/venv/bin/python -I /validate/smoke/cleanroom_smoke.py",
                     "rm"], verbs
    run = rec.calls[1]
    assert run[run.index("--network") + 1] == "none" and run[run.index("--user") + 1] == "1500:1500"
    assert f"{wheel}:/validate/wheel/{wheel.name}:ro" in run and run[-3:] == [ref, "sleep", "infinity"]
    name = run[run.index("--name") + 1]
    assert rec.calls[-1] == ["docker", "rm", "--force", name]
    # The recorder ran nothing, so the smoke step has no results: that is a failure, not a pass.
    assert not res.ok and "the smoke script wrote no results" in res.checks[-1].message


def test_a_gpu_host_makes_the_smoke_step_require_the_gpu():
    layout = cleanroom_steps.Layout(python="p", venv="/v", work="/w", smoke="/s", out="/o", wheel="/x.whl",
                              wheelhouse="/wh", release=None, checkout="/src", gpu="rocm")
    smoke = cleanroom_steps.plan(layout, cenv.Installer("pip"), "full", [])[-1]
    assert smoke.argv[smoke.argv.index("--expect-gpu") + 1] == "rocm" and "--release" not in smoke.argv


def test_the_image_installs_the_projects_python():
    """The container route runs the image's interpreter (cleanroom_env.image_python: the project's Python); the
    Dockerfile, whose hash is the image's tag, installs that one and fills the wheelhouse with it."""
    text = cenv.dockerfile(REPO).read_text()
    py = cenv.image_python(REPO)
    assert py == f"python{config.python_version(REPO)}"
    assert f" {py} {py}-venv " in text and f"RUN {py} -m pip download" in text
    assert set(re.findall(r"\bpython3\.\d+\b", text)) == {py}, "the Dockerfile names another Python"
