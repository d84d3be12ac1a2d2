"""What a CI build of ci/build.py is made of: the runner pools and container images, the steps (nox sessions,
invoke tasks) and the build dataclass whose construction registers it (after XLA's build_tools/ci/build.py).
Standard library and jatools only, as ci/build.py."""
from __future__ import annotations

import dataclasses
import re
from typing import ClassVar

from jatools import config
from jatools.ci import env_report

ENV_REPORT = ("invoke", "env-report", "--json-out", env_report.CI_REPORT)
PLACEHOLDER = re.compile(r"\$\{([A-Z_][A-Z0-9_]*)\}")


@dataclasses.dataclass(frozen=True)
class Runner:
    """A runner pool (GitHub `runs-on` label) and the container a job runs in (None: on the host)."""

    label: str
    gpus: int = 0
    container: str | None = None
    options: tuple[str, ...] = ()

    @property
    def options_text(self) -> str:
        return " ".join(self.options)


# Container images, the one home of each reference: the workflows take them from the matrices this file prints.
# Pinned by digest where the digest is known; TheRock's images are published by ROCm under a moving tag whose
# digest could not be looked up from here: the environment report (the first command of every build) records
# the digest each job actually ran, and a test names every image still without one (docs/ci.md).
THEROCK_DEV = "ghcr.io/rocm/jax-dev-ubu24.therock-7.14:7.14"
THEROCK_MANYLINUX = "ghcr.io/rocm/jax-manylinux_2_28-therock-7.14:7.14"
CUDA_DEVEL = ("nvidia/cuda:13.0.1-devel-ubuntu24.04"
              "@sha256:7d2f6a8c2071d911524f95061a0db363e24d27aa51ec831fcccf9e76eb72bc92")
UNPINNED_IMAGES = {THEROCK_DEV, THEROCK_MANYLINUX}
# The AMD GPU must be passed into the container (kfd + render nodes, video group); RCCL and the
# stream executor use host shared memory; sanitizer-instrumented binaries need ptrace.
ROCM_GPU_OPTIONS = ("--device=/dev/kfd", "--device=/dev/dri", "--group-add", "video", "--ipc=host",
                    "--shm-size=64G", "--cap-add=SYS_PTRACE", "--security-opt", "seccomp=unconfined")
CUDA_GPU_OPTIONS = ("--gpus", "all", "--ipc=host", "--shm-size=64G")

UBUNTU = Runner("ubuntu-24.04")
# The runner labels GitHub hosts (every other label is a self-hosted pool, declared for actionlint in
# .github/actionlint.yaml), and the runner of the jobs that run no build of their own: the plan jobs, which print
# the matrices. `python3 ci/build.py --workflows` writes these, the builds' runners and timeouts and the Python
# version into the workflows (docs/ci.md).
GITHUB_HOSTED = frozenset({UBUNTU.label})
PLAN_RUNNER = UBUNTU
UBUNTU_THEROCK = Runner("ubuntu-24.04", container=THEROCK_DEV)
UBUNTU_CUDA = Runner("ubuntu-24.04", container=CUDA_DEVEL)
BUILD_ONLY_ROCM = Runner("build-only-jax-aiter", container=THEROCK_DEV)
BUILD_ONLY_CUDA = Runner("build-only-jax-aiter", container=CUDA_DEVEL)
MI355_1 = Runner("linux-mi355-1gpu", 1, THEROCK_DEV, ROCM_GPU_OPTIONS)
MI355_4 = Runner("linux-mi355-4gpu", 4, THEROCK_DEV, ROCM_GPU_OPTIONS)
MI355_1_MANYLINUX = Runner("linux-mi355-1gpu", 1, THEROCK_MANYLINUX, ROCM_GPU_OPTIONS)
H200_1 = Runner("linux-h200-1gpu", 1, CUDA_DEVEL, CUDA_GPU_OPTIONS)
H200_2 = Runner("linux-h200-2gpu", 2, CUDA_DEVEL, CUDA_GPU_OPTIONS)

# Each GPU backend's archs from their one home, pyproject's gpu_archs_<backend> (the lanes' archs).
_ARCHS = {b: ";".join(config.load(env={}).default_archs(b)) for b in ("rocm", "cuda")}
ROCM_ENV = (("JA_BACKEND", "rocm"), ("GPU_ARCHS", _ARCHS["rocm"]))
CUDA_ENV = (("JA_BACKEND", "cuda"), ("GPU_ARCHS", _ARCHS["cuda"]))
CPU_ENV = (("JA_BACKEND", "cpu"),)


def _env_prefix(env: tuple[tuple[str, str], ...]) -> list[str]:
    return ["env", *(f"{k}={v}" for k, v in env)] if env else []


@dataclasses.dataclass(frozen=True)
class Nox:
    """A nox session from noxfile.py. `installs`: the session has a virtualenv whose deps are fetched."""

    session: str
    posargs: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    installs: bool = True

    def commands(self, build_env: tuple[tuple[str, str], ...], installed: set[str]) -> list[list[str]]:
        cmds = []
        posargs = ["--", *self.posargs] if self.posargs else []
        if self.installs and self.session not in installed:
            installed.add(self.session)
            # the posargs too: what a session installs may depend on them (`bench -- gpu`: JAX and its GPU plugin)
            cmds.append([*_env_prefix(build_env), "nox", "-s", self.session, "--install-only", *posargs])
        run = ["nox", *(["-R"] if self.installs else []), "-s", self.session]
        cmds.append([*_env_prefix((*build_env, *self.env)), *run, *posargs])
        return cmds


@dataclasses.dataclass(frozen=True)
class Invoke:
    """An invoke task from tasks.py."""

    task: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()

    def commands(self, build_env: tuple[tuple[str, str], ...], installed: set[str]) -> list[list[str]]:
        return [[*_env_prefix((*build_env, *self.env)), "invoke", self.task, *self.args]]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Build:
    """One CI build. Registering is a side effect of construction, as in XLA's build.py."""

    _builds: ClassVar[dict[str, Build]] = {}

    name: str
    group: str
    description: str
    runner: Runner
    steps: tuple[Nox | Invoke, ...]
    env: tuple[tuple[str, str], ...] = ()
    timeout_minutes: int = 60
    events: tuple[str, ...] = ()  # the GitHub events that run it (empty: every event of its workflow)

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z][a-z0-9_]*", self.name):
            raise ValueError(f"build name {self.name!r}: use lower_snake_case")
        if self.name in Build._builds:
            raise ValueError(f"build {self.name!r} is defined twice")
        Build._builds[self.name] = self

    @classmethod
    def all_builds(cls) -> dict[str, Build]:
        return dict(sorted(cls._builds.items()))

    def commands(self) -> list[list[str]]:
        installed: set[str] = set()
        cmds = [[*_env_prefix(self.env), *ENV_REPORT]]
        for step in self.steps:
            cmds += step.commands(self.env, installed)
        return cmds

    def placeholders(self) -> list[str]:
        """The ${NAME} values this build takes from the CI environment."""
        return sorted({m for cmd in self.commands() for arg in cmd for m in PLACEHOLDER.findall(arg)})

    def sessions(self) -> set[str]:
        return {s.session for s in self.steps if isinstance(s, Nox)}

    def tasks(self) -> set[str]:
        return {"env-report"} | {s.task for s in self.steps if isinstance(s, Invoke)}
