"""Environment report: what machine a job ran on, printed first in every CI job.

CPU, GPUs, toolchains (found the way the build finds them, through jatools.native.toolchain), Python
and the jax family's versions, the environment variables that steer the build, and where the job ran:
the container image (JA_CONTAINER_IMAGE) with its digest (pinned in the reference, else the registry's
answer at report time) and the runner; under GitHub Actions these last go to the job summary too.
Nothing here fails the job: a tool or registry that is absent or errors is reported as such (docs/ci.md).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from email.message import Message
from pathlib import Path

from jatools import atomic_write, config
from jatools.native import toolchain

LSCPU_KEYS = ("Architecture", "Model name", "CPU(s)", "Thread(s) per core", "Core(s) per socket", "Socket(s)",
              "NUMA node(s)", "L3 cache", "Hypervisor vendor")
ENV_KEYS = ("JA_BACKEND", "GPU_ARCHS", "JA_BUILD_DIR", "JA_TEST_TIER", "JA_SANITIZE", "JA_WHEEL_ARCH",
            "JA_WHEEL_PLAT_NAME", "AITER_SYMBOL_VISIBLE", "ROCM_PATH", "CUDA_HOME", "HIP_VISIBLE_DEVICES",
            "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "XLA_FLAGS", "CI", "GITHUB_RUN_ID", "RUNNER_NAME")
PACKAGE_PREFIXES = ("jax", "numpy", "ml-dtypes", "ml_dtypes")
TIMEOUT_S = 30
# ci/build.py writes it first in every build
CI_REPORT = (config.build_path("ci_records") / "env-report.json").as_posix()
CI_REPORT_VAR = "JA_ENV_REPORT"  # ... and names it here for every later command of the build

Which = Callable[..., str | None]


def _run(argv: list[str]) -> tuple[int, str]:
    """(exit code, stdout+stderr); a missing or hanging tool becomes a code and a note, not an exception."""
    try:
        out = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=TIMEOUT_S)
        return out.returncode, out.stdout + out.stderr
    except FileNotFoundError:
        return 127, f"{argv[0]}: not found"
    except subprocess.TimeoutExpired:
        return 124, f"{argv[0]}: no answer within {TIMEOUT_S} s"


def cpu_info(which: Which = shutil.which, env: dict[str, str] | None = None) -> dict:
    lscpu = which("lscpu", path=(env or os.environ).get("PATH"))
    rc, text = _run([lscpu]) if lscpu else (1, "")
    fields = dict(re.findall(r"^([^:\n]+):\s*(.*?)\s*$", text, re.MULTILINE)) if rc == 0 else {}
    return {"logical_cpus": os.cpu_count(), "machine": platform.machine(),
            "lscpu": {k: fields[k] for k in LSCPU_KEYS if k in fields} if lscpu else None}


def parse_rocminfo(text: str) -> list[dict]:
    """GPU agents in rocminfo output: one per agent whose Name is gfx*, with its marketing name."""
    gpus = []
    for block in re.split(r"\n\*+\s*\n\s*Agent \d+\s*\n\*+", text):
        name = re.search(r"^\s*Name:\s*(gfx[0-9a-z]+)\s*$", block, re.MULTILINE)
        if name:
            market = re.search(r"^\s*Marketing Name:\s*(.*?)\s*$", block, re.MULTILINE)
            gpus.append({"arch": name.group(1), "name": market.group(1) if market else None})
    return gpus


def parse_nvidia_smi(text: str) -> list[dict]:
    """`nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader` rows."""
    rows = ([p.strip() for p in line.split(",")] for line in text.strip().splitlines())
    return [{"index": int(r[0]), "name": r[1], "driver": r[2], "memory": r[3]} for r in rows
            if len(r) >= 4 and r[0].isdigit()]


def gpu_info(which: Which = shutil.which, env: dict[str, str] | None = None) -> dict:
    path = (env or os.environ).get("PATH")
    out: dict = {"rocm": None, "cuda": None, "count": 0, "notes": []}
    rocminfo = which("rocminfo", path=path)
    if rocminfo:
        rc, text = _run([rocminfo])
        if rc == 0:
            out["rocm"] = parse_rocminfo(text)
        else:
            out["notes"].append(f"rocminfo exited {rc}: {text.strip().splitlines()[-1] if text.strip() else ''}"
                                " (is /dev/kfd passed to the container?)")
    smi = which("nvidia-smi", path=path)
    if smi:
        rc, text = _run([smi, "--query-gpu=index,name,driver_version,memory.total", "--format=csv,noheader"])
        if rc == 0:
            out["cuda"] = parse_nvidia_smi(text)
        else:
            out["notes"].append(f"nvidia-smi exited {rc}: {text.strip()[:200]} (is --gpus passed to the container?)")
    out["count"] = len(out["rocm"] or []) + len(out["cuda"] or [])
    if not rocminfo and not smi:
        out["notes"].append("no rocminfo and no nvidia-smi on PATH: no GPU")
    return out


def toolchain_info(env: dict[str, str] | None = None, which: Which = shutil.which) -> dict:
    """Compilers found exactly as the build finds them (jatools.native.toolchain), with their versions."""
    env = dict(os.environ if env is None else env)
    notes: list[str] = []
    try:
        cxx = toolchain.cxx_version(env.get("CXX", "g++"))
    except toolchain.ToolchainError as e:
        cxx = None
        notes.append(str(e))
    try:
        rocm_root, hipcc, found = toolchain.find_rocm(env, config.defaults().get("rocm_legacy_root", "/opt/rocm"),
                                                      which)
        notes += found
    except toolchain.ToolchainError as e:
        rocm_root, hipcc = None, which("hipcc", path=env.get("PATH"))
        notes.append(str(e))
    nvcc, found = toolchain.find_nvcc(env, which)
    version = lambda tool, of: {"path": tool, "version": of(tool)} if tool else None
    return {"notes": notes + found, "cxx": cxx, "rocm_root": rocm_root,
            "hipcc": version(hipcc, toolchain.hipcc_version),
            "rocm_sdk_version": toolchain.rocm_sdk_version(env, which), "nvcc": version(nvcc, toolchain.nvcc_version)}


_PACKAGES_SNIPPET = (
    "import importlib.metadata as m, json, sys\n"
    "found = {(d.metadata['Name'] or '').lower(): d.version for d in m.distributions()}\n"
    "print(json.dumps({'python': sys.version.split()[0], 'executable': sys.executable, 'packages': "
    "dict(sorted((k, v) for k, v in found.items() if k.startswith(tuple(sys.argv[1:]))))}))\n"
)


def python_info(python: str | None = None) -> dict:
    """Python and the jax family's versions (jax, jaxlib, jax-rocm*/jax-cuda* plugins) of that interpreter."""
    rc, text = _run([python or sys.executable, "-c", _PACKAGES_SNIPPET, *PACKAGE_PREFIXES])
    if rc != 0:
        return {"executable": python, "error": text.strip()[-300:]}
    return json.loads(text.strip().splitlines()[-1])


CONTAINER_ENV = "JA_CONTAINER_IMAGE"
RUNNER_KEYS = ("RUNNER_NAME", "RUNNER_OS", "RUNNER_ARCH", "RUNNER_ENVIRONMENT", "ImageOS", "ImageVersion")
MANIFEST_TYPES = ("application/vnd.oci.image.index.v1+json",
                  "application/vnd.docker.distribution.manifest.list.v2+json",
                  "application/vnd.oci.image.manifest.v1+json", "application/vnd.docker.distribution.manifest.v2+json")


def split_image(ref: str) -> tuple[str, str, str, str | None]:
    """(registry, repository, tag, digest) of an image reference, Docker's defaults filled in."""
    name, _, digest = ref.partition("@")
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        registry, path = first, rest
    else:
        registry, path = "registry-1.docker.io", name
        if "/" not in path:
            path = f"library/{path}"
    repo, _, tag = path.rpartition(":") if ":" in path.rsplit("/", 1)[-1] else (path, "", "latest")
    return registry, repo, tag or "latest", digest or None


def _registry_get(url: str, headers: dict[str, str]) -> tuple[int, Message, bytes]:
    """(status, headers, body) of a GET; the headers are looked up case-insensitively."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=TIMEOUT_S) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, b""


def resolve_digest(ref: str) -> dict:
    """The digest an image reference names: pinned in it, else asked of its registry now (v2 API)."""
    registry, repo, tag, digest = split_image(ref)
    if digest:
        return {"digest": digest, "source": "pinned in the reference"}
    scheme = "http" if registry.split(":")[0] in ("localhost", "127.0.0.1") else "https"
    url = f"{scheme}://{registry}/v2/{repo}/manifests/{tag}"
    headers = {"Accept": ", ".join(MANIFEST_TYPES)}
    try:
        status, got, _ = _registry_get(url, headers)
        if status == 401:  # anonymous pull token from the realm the registry names
            params = dict(re.findall(r'(\w+)="([^"]*)"', got.get("WWW-Authenticate", "")))
            realm = params.pop("realm", "")
            if not realm:
                return {"digest": None, "source": f"{registry} asked for credentials it did not describe"}
            status, _, body = _registry_get(f"{realm}?{urllib.parse.urlencode(params)}", {})
            answer = json.loads(body or b"{}")
            token = answer.get("token") or answer.get("access_token")
            if status != 200 or not token:
                return {"digest": None, "source": f"no pull token from {realm} (HTTP {status})"}
            status, got, _ = _registry_get(url, {**headers, "Authorization": f"Bearer {token}"})
        found = got.get("Docker-Content-Digest")
        if status != 200 or not found:
            return {"digest": None, "source": f"{url}: HTTP {status}, no Docker-Content-Digest"}
        return {"digest": found, "source": "registry, at report time (the tag's digest then)"}
    except (OSError, ValueError) as e:
        return {"digest": None, "source": f"registry not reachable: {e}"}


def job_info(env: dict[str, str], resolve: Callable[[str], dict] = resolve_digest) -> dict:
    """Where the job ran: its container image with the digest, and the runner."""
    ref = env.get(CONTAINER_ENV)
    container = {"image": ref, **resolve(ref)} if ref else None
    return {"container": container, "runner": {k: env[k] for k in RUNNER_KEYS if k in env}}


def collect(env: dict[str, str] | None = None, which: Which = shutil.which, python: str | None = None) -> dict:
    env = dict(os.environ if env is None else env)
    return {
        "schema": 2,
        "job": job_info(env),
        "host": {"hostname": platform.node(), "os": platform.platform(), "kernel": platform.release()},
        "cpu": cpu_info(which, env),
        "gpus": gpu_info(which, env),
        "toolchains": toolchain_info(env, which),
        "python": python_info(python),
        "env": {k: env[k] for k in ENV_KEYS if k in env},
    }


def render(report: dict) -> str:
    """Human-readable form, one screen."""
    h, cpu, g, t, p = (report[k] for k in ("host", "cpu", "gpus", "toolchains", "python"))
    ls = cpu.get("lscpu") or {}
    gpus = [f"{x['arch']} {x['name'] or ''}".strip() for x in g["rocm"] or []]
    gpus += [f"[{x['index']}] {x['name']} (driver {x['driver']}, {x['memory']})" for x in g["cuda"] or []]
    tool = lambda found: f"{found['version']}  {found['path']}" if found else "not found"
    lines = ["== environment report ==", f"host      {h['hostname']}  {h['os']}",
             f"cpu       {ls.get('Model name', '?')}  {cpu['logical_cpus']} logical CPUs"
             + (f", {ls['Socket(s)']} socket(s)" if "Socket(s)" in ls else "")
             + ("" if cpu.get("lscpu") is not None else "  (lscpu not found)"),
             f"gpus      {g['count']}: " + ("; ".join(gpus) if gpus else "none"),
             *(f"          note: {n}" for n in g["notes"]),
             f"c++       {t['cxx'] or 'not found'}", f"hipcc     {tool(t['hipcc'])}",
             f"rocm      root {t['rocm_root'] or '-'}; rocm-sdk version {t['rocm_sdk_version'] or '-'}",
             f"nvcc      {tool(t['nvcc'])}", *(f"          note: {n}" for n in t["notes"])]
    if "error" in p:
        lines.append(f"python    {p['executable']}: {p['error']}")
    else:
        lines += [f"python    {p['python']}  {p['executable']}",
                  "packages  " + (", ".join(f"{k} {v}" for k, v in p["packages"].items()) or "no jax installed")]
    if report["env"]:
        lines.append("env       " + " ".join(f"{k}={v}" for k, v in report["env"].items()))
    job = report.get("job") or {}
    if job.get("container"):
        c = job["container"]
        lines.append(f"container {c['image']}  {c['digest'] or 'digest unknown'} ({c['source']})")
    if job.get("runner"):
        lines.append("runner    " + " ".join(f"{k}={v}" for k, v in job["runner"].items()))
    return "\n".join(lines)


def step_summary(report: dict) -> str:
    """Markdown for the job summary: where the job ran, exactly."""
    job = report.get("job") or {}
    c = job.get("container")
    rows = [("container image", f"`{c['image']}`" if c else "none (on the runner)"),
            ("image digest", f"`{c['digest']}` ({c['source']})" if c and c["digest"] else
             (f"unknown ({c['source']})" if c else "-")),
            *((k, f"`{v}`") for k, v in job.get("runner", {}).items())]
    return "### Environment\n\n| | |\n|---|---|\n" + "".join(f"| {k} | {v} |\n" for k, v in rows) + "\n"


def emit(report: dict, json_out: Path | None = None, as_json: bool = False) -> None:
    """Print the report (text or JSON), write its JSON, and add it to $GITHUB_STEP_SUMMARY when set."""
    print(json.dumps(report, indent=2) if as_json else render(report), flush=True)
    if json_out:
        atomic_write.write_text(json_out, json.dumps(report, indent=2) + "\n")
    if os.environ.get("GITHUB_STEP_SUMMARY"):
        with open(os.environ["GITHUB_STEP_SUMMARY"], "a", encoding="utf-8") as f:
            f.write(step_summary(report))


def written_by_ci() -> Path | None:
    """The report ci/build.py wrote first in this job, if there is one: a later step (the release) takes it
    instead of reporting the same machine twice."""
    given = os.environ.get(CI_REPORT_VAR)
    return Path(given) if given and Path(given).is_file() else None


def main(argv: list[str] | None = None) -> int:
    """`python -m jatools.ci.env_report [--json-out F]`: the report as text, optionally also as JSON."""
    p = argparse.ArgumentParser(prog="python -m jatools.ci.env_report", description=__doc__.splitlines()[0])
    p.add_argument("--json-out", type=Path, help="also write the report as JSON here")
    emit(collect(), p.parse_args(argv).json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
