"""invoke tasks: hash verification, wheel checks, clean-room validation, JIT-library transport, release.

Tasks are thin: each parses its arguments, calls one jatools module, and turns
its errors into `Exit` with a message and a code. `invoke --list` shows them.
"""
from __future__ import annotations

import functools
from pathlib import Path

from invoke import Collection, Exit, task

from jatools import config
from jatools.jitlibs import decide, download, merge, publish, record
from jatools.jitlibs.errors import CLI_ERRORS
from jatools.native import jit_build


# --- CI: jatools/ci/env_report.py, jatools/ci/convergence.py, jatools/validate/cleanroom_env.py (docs/ci.md)
@task(help={"json": "print JSON instead of text", "json_out": "also write the JSON report to this file",
            "python": "report the jax packages of this interpreter (default: the one running invoke)"})
def env_report(c, json=False, json_out="", python=""):
    """Print the machine's CPU, GPUs, toolchains, Python and jax/jaxlib/plugin versions (first step of every CI job)."""
    from jatools.ci import env_report as report_mod
    report_mod.emit(report_mod.collect(python=python or None), Path(json_out) if json_out else None, as_json=json)


@task(help={"base": "revision to compare with (the PR's base commit, e.g. origin/main)",
            "head": "revision under test (default HEAD)", "json_out": "also write the verdict as JSON here"})
def convergence_check(c, base, head="HEAD", json_out=""):
    """Fail when a numerics change (ci/convergence_paths.toml) has no `Convergence:` decision trailer."""
    from jatools.ci import convergence
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
    from jatools.validate import cleanroom_env
    try:
        for v in [variant] if variant else cleanroom_env.variants():
            cleanroom_env.publish(v, push=push, dry_run=dry_run)
    except cleanroom_env.CleanRoomError as e:
        raise Exit(f"image.publish: error: {e}", code=2)


# --- clean-room validation: jatools/validate/ (cleanroom*.py, wheelhouse.py; docs/validation.md)
@task(iterable=["wheel"],
      help={"variant": "lite or full (default: every wheel in dist/)", "wheel": "a wheel to validate (repeatable)",
            "engine": "auto (a container when an engine answers), none, docker or podman",
            "installer": "auto (uv when installed), uv, or pip (plain venv + pip)",
            "wheelhouse": "offline wheelhouse (default: JA_WHEELHOUSE or build/wheelhouse)",
            "no_fill": "fail instead of filling a cold wheelhouse from the package index",
            "release": "folder holding jit-libs-<cache-id>/ for the lite wheel's fetch (default: this checkout's)",
            "report": "JSON report (default: build/validate/report.json)", "keep": "keep each clean room",
            "deps_from": "use the packages installed for this Python (an offline GPU host's JAX) as the dependencies"})
def validate(c, variant="", wheel=None, engine="auto", installer="auto", wheelhouse="", no_fill=False,
             release="", report="", keep=False, deps_from=""):
    """Install each wheel in a clean room (no index, no checkout) and run the smoke tests; summary + JSON report."""
    from jatools.validate import cleanroom
    path = lambda value: Path(value) if value else None  # invoke passes "" for an unset flag
    code = cleanroom.run([Path(w) for w in wheel or []] or None, variant=variant or None, engine=engine,
                         installer=installer, wheelhouse_dir=path(wheelhouse), fill=not no_fill,
                         release=path(release), report=path(report), keep=keep, deps_from=path(deps_from))
    if code:
        raise Exit(code=code)


@task(name="wheelhouse", iterable=["gpu"],
      help={"gpu": "also the JAX plugin of this backend: cuda or rocm (repeatable)",
            "path": "wheelhouse folder (default: JA_WHEELHOUSE or build/wheelhouse)"})
def fill_wheelhouse(c, gpu=None, path=""):
    """Fill the offline wheelhouse once from the package index
    (jax/jaxlib at the floor, deps, fetch extra, build backend)."""
    from jatools.validate import cleanroom_env, wheelhouse
    root = config.repo_root()
    try:
        python = cleanroom_env.find_python(config.python_version(root))
        wanted = wheelhouse.requirements(root, tuple(gpu or ()), build=True)  # also offline `pip install .`
        wheelhouse.fill(wheelhouse.location(root, path or None), wanted, python)
    except (wheelhouse.WheelhouseError, cleanroom_env.CleanRoomError) as e:
        raise Exit(f"wheelhouse: error: {e}", code=2)


# --- JIT-library transport and the producer's shard merge: jatools/jitlibs/ (docs/architecture.md) (docs/jit-libs.md)
def _jit_run(name: str, fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except CLI_ERRORS as e:
        raise Exit(f"jit.{name}: error: {e}", code=1) from None


@task(help={"base-url": "where releases live (default JA_FETCH_BASE_URL, else pyproject jit_libs_base_url)",
            "strict": "refuse a toolchain difference too", "force": "download even if a verified copy is present",
            "pins-from": "accept only the libraries the producer published at this base URL (the release passes "
                         "pyproject jit_libs_base_url)"})
def jit_fetch(c, base_url=None, strict=False, force=False, pins_from=None):
    """Fetch this checkout's JIT libraries (release jit-libs-<cache-id>) into build/aiter_build; a miss fails."""
    _jit_run("fetch", download.run_fetch, config.load(), base_url=base_url, strict=strict or None, force=force,
             pins_from=pins_from)


@task(help={"to": "gh[:OWNER/REPO], http(s)://URL, file://URL or a folder (default pyproject jit_libs_publish_to)",
            "level": "zstd level", "window-log": "zstd window log", "asset-limit": "max bytes per asset",
            "stage-only": "compress, verify and write the manifest without uploading"})
def jit_publish(c, to=None, level=None, window_log=None, asset_limit=None, stage_only=False):
    """Publish build/aiter_build as jit-libs-<cache-id>: zstd, verify, split, upload, manifest last."""
    settings = config.load()
    ints = {k: int(v) for k, v in {"level": level, "window_log": window_log, "asset_limit": asset_limit}.items()
            if v is not None}
    _jit_run("publish", publish.publish, settings, to or settings.raw["jit_libs_publish_to"], stage_only=stage_only,
             runner=publish.invoke_runner(c), **ints)


@task(help={"dir": "folder to check (default build/aiter_build)", "against": "manifest or record (path or URL)"})
def jit_verify(c, dir=None, against=None):
    """Check build/aiter_build against its build record (or a given manifest); names every differing file."""
    print(_jit_run("verify", record.verify_build, config.load(), Path(dir) if dir else None, against))


@task(help={"base-url": "where releases live", "against": "compare with this manifest or build record instead",
            "strict": "a toolchain difference means rebuild", "json-out": "decision JSON path"})
def jit_decide(c, base_url=None, against=None, strict=False, json_out=None):
    """Reuse or rebuild the JIT libraries? Prints every reason; JSON file; decision=/rebuild= in $GITHUB_OUTPUT."""
    _jit_run("decide", decide.run_decide, config.load(), base_url=base_url,
             against=Path(against) if against else None, strict=strict or None,
             json_path=Path(json_out) if json_out else None)


@task
def jit_identity(c):
    """Print this checkout's JIT build identity (cache id and the gated fields) as JSON."""
    import json

    ident, notes = _jit_run("identity", jit_build.checkout_identity, config.load())
    for n in notes:
        print(f"note: {n}")
    print(json.dumps(ident, indent=2, sort_keys=True))


@task(help={"manifest": "manifest path or URL"})
def jit_show(c, manifest):
    """Validate and summarise a JIT-library manifest (path or URL)."""
    print("\n".join(_jit_run("show", decide.show, manifest)))


@task(name="merge-manifests", help={"from": "folder holding the downloaded shard artifacts (each: lib*.so + "
                                    "build_record.json; default build/jit-shards)",
                                    "strict": "a toolchain difference between shards fails too"})
def jit_merge_manifests(c, from_="", strict=False):
    """Join per-module JIT shards into build/aiter_build: re-hash, one identity, every module once, record last."""
    settings = config.load()
    folder = Path(from_) if from_ else settings.path("jit_shards")
    _jit_run("merge-manifests", merge.merge, folder if folder.is_absolute() else Path.cwd() / folder,
             settings.jit_dir, jit_build.libraries(settings), decide.strict_toolchain(settings, strict or None))



# --- wheels: symbol floor, content policy: jatools/wheel/wheel_checks.py
_WHEEL_ARG = {"wheel": "a wheel path, glob or comma-separated list (repeatable); also any number of wheels after "
                      "`--` (invoke floor -- dist/*.whl); none: every wheel in dist/"}


def _wheel_checks(c, wheel: list[str] | str | None, checks: list[str]) -> None:
    """Run `checks` on the -w wheels and the words after `--` (invoke has no variable positional arguments,
    pyinvoke/invoke#132)."""
    import shlex

    from jatools.wheel import wheel_checks, wheel_scan
    specs = ([wheel] if isinstance(wheel, str) else list(wheel or [])) + shlex.split(getattr(c, "remainder", "") or "")
    try:
        paths = [p for spec in specs or [""] for p in wheel_scan.find_wheels(spec, config.repo_root() / "dist")]
    except wheel_scan.WheelReadError as e:
        raise Exit(f"error: {e}", code=2) from None
    ok, failed = wheel_checks.run(checks, paths)
    for line in ok:
        print(line)
    if failed:
        raise Exit("\n".join(failed), code=1)


@task(help=_WHEEL_ARG, iterable=["wheel"])
def floor(c, wheel=None):
    """auditwheel symbol floor: fail when a wheel's platform tag claims an older glibc than its symbols allow."""
    _wheel_checks(c, wheel, ["floor"])


@task(help={**_WHEEL_ARG, "clients": "also run the clients users run (twine check --strict, check-wheel-contents, "
                                     "wheel unpack + pack)"}, iterable=["wheel"])
def contents(c, wheel=None, clients=False):
    """Wheel content policy: variant files, allowed external libraries, RUNPATHs, RECORD and metadata."""
    _wheel_checks(c, wheel, ["contents", "clients"] if clients else ["contents"])


# --- release upload (jatools/release.py): only a green report for this commit, wheels unchanged
@task(iterable=["lane"],
      help={"tag": "release tag to upload to", "dry_run": "check the reports and print the upload commands only",
            "to": "gh (the GitHub release: every lane's wheels and the sdist), pypi (the sdist, twine) or a store "
                  "folder (the files and the artifact index, jatools/release_index.py)",
            "lane": "a folder holding one lane's release report and files (repeatable; default dist/)"})
def release_upload(c, tag, to="gh", dry_run=False, lane=None):
    """Upload the distributions of green `nox -s release` runs for the current commit (refuses stale or modified)."""
    from jatools import release
    try:
        release.upload(tag, to=to, dry_run=dry_run, lanes=[Path(p) for p in lane or []] or None)
    except release.ReleaseError as e:
        raise Exit(f"release.upload: refused: {e}", code=1)


@task(iterable=["lane"],
      help={"to": "the store folder: the files go to <store>/<commit>/, the artifact index to <store>/<lane>/simple/",
            "lane": "a folder holding one lane's release report and files (repeatable; default dist/)"})
def release_index(c, to="", lane=None):
    """Index the distributions of green `nox -s release` runs for the current commit under its name (a CI run's
    index; a tagged release: release.upload --to STORE)."""
    from jatools import release
    if not to:  # a flag, not a positional: a stray word (even --help) never becomes the store
        raise Exit("release.index: --to STORE is required: the store folder to write the files and index into "
                   "(CI's: build/release-store)", code=2)
    try:
        release.index_commit(Path(to), lanes=[Path(p) for p in lane or []] or None)
    except release.ReleaseError as e:
        raise Exit(f"release.index: refused: {e}", code=1)



def _settings_errors_in_one_line(ns: Collection) -> Collection:
    """Every task of `ns`: a bad setting (config.SettingError names the setting, the value, what is allowed and the
    file) stops it with that one line and exit 2, not a traceback ending in it."""
    for t in ns.tasks.values():
        @functools.wraps(t.body)  # invoke reads the task's arguments through __wrapped__
        def body(*args, _body=t.body, **kwargs):
            try:
                return _body(*args, **kwargs)
            except config.SettingError as e:
                raise Exit(f"error: {e}", code=2) from None
        t.body = body
    for sub in ns.collections.values():
        _settings_errors_in_one_line(sub)
    return ns


# One name per task: the contract's (README.md, "Sessions and tasks") for verify, floor, contents and validate;
# wheels are built by `nox -s wheel_lite|wheel_full` (docs/architecture.md lists every door and its code).
ns = _settings_errors_in_one_line(Collection(
    env_report, convergence_check, floor, contents, validate, fill_wheelhouse, verify=jit_verify,
    image=Collection(publish=image_publish),
    jit=Collection(identity=jit_identity, show=jit_show, fetch=jit_fetch, publish=jit_publish, decide=jit_decide,
                   merge_manifests=jit_merge_manifests),
    release=Collection(upload=release_upload, index=release_index)))
