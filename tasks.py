"""invoke tasks: hash verification, wheel checks, clean-room validation, JIT-library transport, release.

Tasks are thin: each parses its arguments, calls one jatools module, and turns
its errors into `Exit` with a message and a code. `invoke --list` shows them.
"""
from __future__ import annotations

from invoke import Collection

ns = Collection()

# --- CI: environment report, convergence gate, validation image -------------------------------
# Logic: jatools/env_report.py, jatools/convergence.py, jatools/validation_image.py (see docs/ci.md).
from pathlib import Path  # noqa: E402

from invoke import Exit, task  # noqa: E402


@task(help={"json": "print JSON instead of text", "json_out": "also write the JSON report to this file",
            "python": "report the jax packages of this interpreter (default: the one running invoke)"})
def env_report(c, json=False, json_out="", python=""):
    """Print the machine's CPU, GPUs, toolchains, Python and jax/jaxlib/plugin versions (first step of every CI job)."""
    import json as _json

    from jatools import env_report as report_mod

    report = report_mod.collect(python=python or None)
    print(_json.dumps(report, indent=2) if json else report_mod.render(report), flush=True)
    if json_out:
        report_mod.write_json(report, Path(json_out))


@task(help={"base": "revision to compare with (the PR's base commit, e.g. origin/main)",
            "head": "revision under test (default HEAD)", "json_out": "also write the verdict as JSON here"})
def convergence_check(c, base, head="HEAD", json_out=""):
    """Fail when a numerics change (ci/convergence_paths.toml) has no `Convergence:` decision trailer."""
    from jatools import config, convergence

    try:
        verdict = convergence.check(config.repo_root(), base, head)
    except convergence.ConvergenceError as e:
        raise Exit(f"convergence-check: error: {e}", code=2)
    if json_out:
        convergence.write_json(verdict, Path(json_out))
    text = convergence.report(verdict)
    if not verdict.ok:
        raise Exit(text, code=1)
    print(text)


@task(help={"variant": "one variant (default: every variant the Dockerfile defines)",
            "push": "push to the registry (skipped when the tag is already there)",
            "dry_run": "print the docker commands only"})
def image_publish(c, variant="", push=False, dry_run=False):
    """Build (and push) the clean-room validation image tagged with its recipe hash."""
    from jatools import validation_image

    try:
        for v in [variant] if variant else validation_image.variants():
            validation_image.publish(v, push=push, dry_run=dry_run)
    except validation_image.ImageError as e:
        raise Exit(f"image.publish: error: {e}", code=2)


ns.add_task(env_report, name="env-report")
ns.add_task(convergence_check, name="convergence-check")
ns.add_collection(Collection("image", publish=image_publish))


# --- clean-room validation -----------------------------------------------------------------
# Logic: jatools/cleanroom.py (and cleanroom_*.py, container.py, wheelhouse.py); see docs/validation.md.
@task(help={"variant": "lite or full (default: every wheel in dist/)", "wheel": "a wheel to validate (repeatable)",
            "engine": "auto (a container when an engine answers), none, docker or podman",
            "installer": "auto (uv when installed), uv, or pip (plain venv + pip)",
            "wheelhouse": "offline wheelhouse (default: JA_WHEELHOUSE or build/wheelhouse)",
            "no_fill": "fail instead of filling a cold wheelhouse from the package index",
            "release": "folder holding jit-libs-<cache-id>/ for the lite wheel's fetch (default: this checkout's)",
            "report": "JSON report (default: build/validate/report.json)", "keep": "keep each clean room"},
      iterable=["wheel"])
def validate_run(c, variant="", wheel=None, engine="auto", installer="auto", wheelhouse="", no_fill=False,
                 release="", report="", keep=False):
    """Install each wheel in a clean room (no index, no checkout) and run the smoke tests; summary + JSON report."""
    from jatools import cleanroom

    argv = ["--engine", engine, "--installer", installer]
    for w in wheel or []:
        argv += ["--wheel", w]
    for flag, value in (("--variant", variant), ("--wheelhouse", wheelhouse), ("--release", release),
                        ("--report", report)):
        if value:
            argv += [flag, value]
    argv += ["--no-fill"] * no_fill + ["--keep"] * keep
    code = cleanroom.main(argv)
    if code:
        raise Exit(code=code)


@task(help={"gpu": "also the JAX plugin of this backend: cuda or rocm (repeatable)",
            "path": "wheelhouse folder (default: JA_WHEELHOUSE or build/wheelhouse)"}, iterable=["gpu"])
def validate_wheelhouse(c, gpu=None, path=""):
    """Fill the offline wheelhouse once from the package index (jax/jaxlib at the floor, deps, fetch extra)."""
    from jatools import cleanroom_env, config, wheelhouse

    root = config.repo_root()
    try:
        python = cleanroom_env.find_python(str(config.defaults(root)["validation_python"]))
        wanted = wheelhouse.requirements(root, tuple(gpu or ()))
        wheelhouse.fill(wheelhouse.location(root, path or None), wanted, python)
    except (wheelhouse.WheelhouseError, cleanroom_env.CleanRoomError) as e:
        raise Exit(f"validate.wheelhouse: error: {e}", code=2)


_validate = Collection("validate")
_validate.add_task(validate_run, name="run", default=True)
_validate.add_task(validate_wheelhouse, name="wheelhouse")
ns.add_collection(_validate)
