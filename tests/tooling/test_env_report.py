"""Environment report with stand-in rocminfo / nvidia-smi / rocm-sdk / hipcc (hardware and toolchains we lack)."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from jatools.ci import env_report

ROOT = Path(__file__).resolve().parents[2]

ROCMINFO = """ROCk module is loaded
=====================
HSA Agents
==========
*******
Agent 1
*******
  Name:                    AMD EPYC 9575F 64-Core Processor
  Marketing Name:          AMD EPYC 9575F 64-Core Processor
  Device Type:             CPU
*******
Agent 2
*******
  Name:                    gfx950
  Uuid:                    GPU-1234
  Marketing Name:          AMD Instinct MI355X
  Device Type:             GPU
*******
Agent 3
*******
  Name:                    gfx950
  Marketing Name:          AMD Instinct MI355X
  Device Type:             GPU
"""


def fake_tool(folder: Path, name: str, stdout: str, code: int = 0) -> None:
    path = folder / name
    path.write_text(f"#!/bin/sh\ncat <<'JA_EOF'\n{stdout}\nJA_EOF\nexit {code}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def tools(tmp_path: Path) -> Path:
    """A PATH folder with stand-ins, plus the system's basics (sh, cat, g++, lscpu)."""
    b = tmp_path / "bin"
    b.mkdir()
    fake_tool(b, "rocminfo", ROCMINFO)
    fake_tool(b, "rocm-sdk", "7.14.0")  # `rocm-sdk path --root` prints the same; only the version is read here
    fake_tool(b, "hipcc", "HIP version: 7.14.25391-abc\nAMD clang version 20.0.0")
    fake_tool(b, "nvidia-smi", "0, NVIDIA H200, 580.65.06, 143771 MiB\n1, NVIDIA H200, 580.65.06, 143771 MiB")
    fake_tool(b, "nvcc", "Cuda compilation tools, release 13.0, V13.0.48")
    return b


def env_with(tools: Path) -> dict[str, str]:
    return {"PATH": f"{tools}:/usr/bin:/bin", "JA_BACKEND": "rocm", "GPU_ARCHS": "gfx950"}


def test_parse_rocminfo_keeps_gpu_agents_only() -> None:
    assert env_report.parse_rocminfo(ROCMINFO) == [{"arch": "gfx950", "name": "AMD Instinct MI355X"}] * 2


def test_parse_nvidia_smi() -> None:
    rows = env_report.parse_nvidia_smi("0, NVIDIA H200, 580.65.06, 143771 MiB\n")
    assert rows == [{"index": 0, "name": "NVIDIA H200", "driver": "580.65.06", "memory": "143771 MiB"}]


def test_collect_with_stand_in_tools(tools: Path) -> None:
    r = env_report.collect(env=env_with(tools))
    assert r["gpus"]["count"] == 4
    assert [g["arch"] for g in r["gpus"]["rocm"]] == ["gfx950", "gfx950"]
    assert r["gpus"]["cuda"][1]["name"] == "NVIDIA H200"
    t = r["toolchains"]
    assert t["rocm_sdk_version"] == "7.14.0"
    assert t["hipcc"] == {"path": str(tools / "hipcc"), "version": "7.14.25391-abc"}
    assert t["nvcc"]["version"] == "13.0"
    assert t["cxx"].startswith("g++ ")
    assert r["env"] == {"JA_BACKEND": "rocm", "GPU_ARCHS": "gfx950"}
    text = env_report.render(r)
    assert "gpus      4: gfx950 AMD Instinct MI355X; gfx950 AMD Instinct MI355X; [0] NVIDIA H200" in text
    assert "rocm-sdk version 7.14.0" in text


def test_no_gpu_and_failing_rocminfo_are_reported_not_raised(tmp_path: Path) -> None:
    b = tmp_path / "bin"
    b.mkdir()
    r = env_report.collect(env={"PATH": f"{b}:/usr/bin:/bin"}, which=lambda n, path=None: None)
    assert r["gpus"]["count"] == 0 and "no GPU" in r["gpus"]["notes"][0]
    assert r["cpu"]["lscpu"] is None
    fake_tool(b, "rocminfo", "Failed to get user name to check for video group membership", code=1)
    r = env_report.collect(env={"PATH": f"{b}:/usr/bin:/bin"})
    assert r["gpus"]["rocm"] is None and "/dev/kfd" in r["gpus"]["notes"][0]


def test_python_packages_of_another_interpreter() -> None:
    info = env_report.python_info(sys.executable)
    assert info["executable"] and info["python"].count(".") == 2
    assert all(name.startswith(env_report.PACKAGE_PREFIXES) for name in info["packages"])


def test_invoke_task_prints_text_and_writes_json(tools: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    env = {**os.environ, **env_with(tools)}
    r = subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(ROOT), "env-report", "--json-out",
                        str(out)], check=False, cwd=tmp_path, capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("== environment report ==")
    assert json.loads(out.read_text())["gpus"]["count"] == 4


def test_image_references_split_with_dockers_defaults() -> None:
    assert env_report.split_image("ghcr.io/rocm/jax-dev:7.14") == ("ghcr.io", "rocm/jax-dev", "7.14", None)
    assert env_report.split_image("nvidia/cuda:13.0.1-devel-ubuntu24.04") == (
        "registry-1.docker.io", "nvidia/cuda", "13.0.1-devel-ubuntu24.04", None)
    assert env_report.split_image("ubuntu") == ("registry-1.docker.io", "library/ubuntu", "latest", None)
    assert env_report.split_image("localhost:5000/a/b@sha256:ab") == ("localhost:5000", "a/b", "latest", "sha256:ab")


@pytest.fixture
def registry():
    """A stand-in OCI registry on localhost (no network here): the v2 manifest endpoint answers 401 with a
    Bearer challenge, the realm hands out a token, and the manifest request with it gets the digest."""
    import http.server
    import threading

    digest = "sha256:" + "ab" * 32
    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            seen.append(self.path)
            host = f"127.0.0.1:{self.server.server_port}"
            if self.path.startswith("/token?"):
                body = json.dumps({"token": "t0k"}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            elif self.path == "/v2/rocm/jax-dev/manifests/7.14":
                if self.headers.get("Authorization") != "Bearer t0k":
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", f'Bearer realm="http://{host}/token",service="{host}",'
                                                         f'scope="repository:rocm/jax-dev:pull"')
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Docker-Content-Digest", digest)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")
            else:
                self.send_response(404)
                self.end_headers()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_port}", digest, seen
    server.shutdown()


def test_the_container_digest_comes_from_the_registry_and_goes_to_json_and_job_summary(registry, tmp_path) -> None:
    host, digest, seen = registry
    ref = f"{host}/rocm/jax-dev:7.14"
    got = env_report.resolve_digest(ref)
    assert got["digest"] == digest and "registry, at report time" in got["source"]
    assert any(p.startswith("/token?") and "scope=repository%3Arocm%2Fjax-dev%3Apull" in p for p in seen)
    assert env_report.resolve_digest(f"{ref}@sha256:cd") == {"digest": "sha256:cd", "source": "pinned in the reference"}
    missing = env_report.resolve_digest(f"{host}/rocm/other:1")
    assert missing["digest"] is None and "HTTP 404" in missing["source"]
    env = {"JA_CONTAINER_IMAGE": ref, "RUNNER_NAME": "linux-h200-1gpu-7", "RUNNER_OS": "Linux",
           "ImageOS": "ubuntu24", "ImageVersion": "20261124.1", "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md")}
    report = {"job": env_report.job_info(env), "host": {"hostname": "h", "os": "Linux"}}
    assert report["job"]["container"]["digest"] == digest
    assert report["job"]["runner"] == {"RUNNER_NAME": "linux-h200-1gpu-7", "RUNNER_OS": "Linux", "ImageOS": "ubuntu24",
                                       "ImageVersion": "20261124.1"}
    summary = env_report.step_summary(report)
    assert f"`{digest}`" in summary and f"`{ref}`" in summary and "`20261124.1`" in summary
    assert env_report.job_info({})["container"] is None  # a job on the runner itself
