"""A test tier against a lane's validated wheel, installed into a fresh environment, never against the build tree.

    python -m jatools.lane_tier --lane cuda13 [--dist dist] [--tier pr] [--platform cuda] [--results-dir D] \\
        [pytest args]
    (nox -s tests_lane -- ...; CI's pr_gpu_cuda_h200 and multigpu_cuda_h200_2gpu, ci/gpu/h200_ci_jobs.sh)

The wheel is the one a green release report vouches for (`nox -s release` built, checked and clean-room validated
it; jatools.release.validated_wheel finds it beside the report, with the bytes the report recorded). A fresh venv
outside the checkout gets that wheel, JAX and its GPU plugin of the platform at the test pins and pyproject's `tier`
dependency group (pytest and its plugins); `python -m jax_aiter info` from it names the lane; then the tier runs
with that interpreter (jatools.testing.tiers --installed --deps-from: pytest imports the installed jax_aiter, and
the tier refuses the checkout's). pip is the installer (as a user's would be); on an offline host the caller points
it at a local index (PIP_NO_INDEX, PIP_FIND_LINKS: ci/gpu/h200_ci_jobs.sh).
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from jatools import config
from jatools.release import REPORT, ReleaseError, validated_wheel
from jatools.testing import gpu_slots, tiers


class LaneTierError(RuntimeError):
    """The lane's environment could not be made (the message names the step and what to do)."""


def requirements(wheel: Path, platform: str, root: Path) -> list[str]:
    """What the lane's venv gets: the wheel, JAX at the `test` group's pins (jax==, jaxlib==: the version the GPU
    plugin is pinned to and the tiers are run with; left to the wheel's own `jax` requirement, pip takes the newest
    JAX, which the plugin does not match), the platform's JAX plugin and the `tier` group (pytest and its plugins, and
    what the tests' modules import when pytest collects them)."""
    groups = config.read_pyproject(root)["dependency-groups"]
    jax = [r for r in groups["test"] if isinstance(r, str) and re.match(r"(jax|jaxlib)\s*==", r)]
    if len(jax) != 2:
        raise LaneTierError(f"pyproject.toml's `test` dependency group pins {jax or 'no'} jax and jaxlib; pin both "
                            "(jax==X, jaxlib==X): the lane's venv takes JAX at that version")
    return [str(wheel), *jax, *tiers.plugin_requirements(platform), *config.dependency_group("tier", root)]


def make_env(wheel: Path, platform: str, folder: Path, root: Path) -> Path:
    """A fresh venv in `folder` with `requirements`; its interpreter, after `python -m jax_aiter info` from it."""
    venv = folder / "lane-venv"
    python = venv / "bin" / "python"
    for what, argv in (("make the venv", [sys.executable, "-m", "venv", str(venv)]),
                       ("install the lane's wheel", [str(python), "-m", "pip", "install", "--disable-pip-version-check",
                                                    *requirements(wheel, platform, root)]),
                       ("describe the installed package", [str(python), "-P", "-m", "jax_aiter", "info"])):
        print(f"lane_tier: {what}: {' '.join(argv)}", flush=True)
        if subprocess.run(argv, cwd=folder, check=False).returncode != 0:
            raise LaneTierError(f"cannot {what} (the command above failed); its output says why")
    return python


def run(lane: str, dist: Path, tier_argv: list[str], platform: str | None = None, variant: str = "full",
        root: Path | None = None) -> int:
    """Make the lane's environment and run the tier against it; the tier's exit code (2: no environment)."""
    root = root or config.repo_root()
    try:  # absolute: the installer runs in the venv's folder, not here
        wheel, report = validated_wheel(dist.resolve() / Path(REPORT).name, lane, variant)
    except ReleaseError as e:
        print(f"lane_tier: {e}", file=sys.stderr)
        return 2
    print(f"lane_tier: {wheel.name} (validated by `nox -s release` at {report['commit'][:12]})", flush=True)
    env = dict(os.environ)
    platform = platform or tiers.choose_platform(None, env, gpu_slots.detect(env))[0]
    with tempfile.TemporaryDirectory(prefix="ja-lane-") as tmp:  # outside the checkout: only the results stay
        try:
            python = make_env(wheel, platform, Path(tmp), root)
        except LaneTierError as e:
            print(f"lane_tier: {e}", file=sys.stderr)
            return 2
        return tiers.main([*tier_argv, "--platform", platform, "--installed", "--deps-from", str(python)])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m jatools.lane_tier", description=__doc__.splitlines()[0],
                                allow_abbrev=False)
    p.add_argument("--lane", required=True, help="the lane whose wheel is tested (cuda13, rocm7, cpu)")
    p.add_argument("--dist", type=Path, default=Path("dist"),
                   help="the folder holding the release report and its wheels (default dist/)")
    p.add_argument("--variant", default="full", choices=("full", "lite"), help="the wheel installed (full)")
    p.add_argument("--platform", default=None, help="cpu | cuda | rocm (default: JA_BACKEND, else detected)")
    a, rest = p.parse_known_args(argv)
    return run(a.lane, a.dist, rest, a.platform, a.variant)


if __name__ == "__main__":
    sys.exit(main())
