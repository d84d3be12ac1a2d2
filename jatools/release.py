"""The main job: turn a checkout into two validated wheels and a release report.

    python -m jatools.release [--fetch-jit URL] [--dry-run]      (nox -s release)

The stages are `stages()`; the native ones are jatools.native.build's sequence (the JIT libraries built, taken,
or fetched with --fetch-jit: a miss fails). A stage whose inputs are unchanged since the last green run is
skipped, and the summary says so. The first failing stage stops the run with its cause and the command that
re-runs just that stage. Ends with a one-screen summary and dist/release-report.json, which
`invoke release.upload` requires.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from jatools import atomic_write, config, steps
from jatools.ci import env_report
from jatools.native import build as native_build
from jatools.native import compiler_cache
from jax_aiter import remedies
from jax_aiter.integrity import sha256_file, sha256_files

REPORT = "dist/release-report.json"
SCHEMA = 1
WHEEL_BUILDER = "jatools.wheel.wheel_build"  # the module the wheel stages run (its imports decide the bytes too)
CHECKER = "jatools.wheel.wheel_checks"
JITLIBS = "jatools.jitlibs"  # fetch and verify: the functions invoke jit.fetch and invoke verify call
GREEN = ("ok", "up-to-date")  # the results of a stage that passed
VARIANTS = ("lite", "full")


class ReleaseError(RuntimeError):
    pass


@dataclass
class Context:
    root: Path
    python: str
    fetch_jit: str | None
    previous: dict
    wheels: dict[str, Path] = field(default_factory=dict)
    inputs: list[tuple[Path, str]] | None = None  # (file, sha256) of every wheel's inputs, hashed once per run
    fingerprints: dict[str, str] = field(default_factory=dict)  # per wheel variant, of its inputs


def _git(root: Path, *args: str) -> str:
    out = subprocess.run(["git", "-C", str(root), *args], check=False, capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else ""


def commit_state(root: Path) -> tuple[str, bool]:
    """(HEAD commit, whether tracked files differ from it)."""
    return _git(root, "rev-parse", "HEAD"), bool(_git(root, "status", "--porcelain", "--untracked-files=no"))


def _make_q(ctx: Context, target: str) -> str | None:
    ok = subprocess.run(["make", "-q", target], check=False, cwd=ctx.root, capture_output=True).returncode == 0
    return f"`make -q {target}`: nothing to do" if ok else None


_PROBE = ("import importlib, json, sys; importlib.import_module(sys.argv[1]); "
          "print(json.dumps(sorted({m.__file__ for m in list(sys.modules.values()) if getattr(m, '__file__', None)})))")


def code_inputs(root: Path, module: str, python: str = sys.executable) -> list[Path]:
    """What a stage's code is made of: every source file of this checkout that importing `module` (in a fresh
    interpreter, not a hand list, so none can be forgotten) loads, the data files beside them (a layout table),
    the packaged runtime, pyproject.toml and the files METADATA is made of (the readme, the licenses)."""
    out = subprocess.run([python, "-c", _PROBE, module], cwd=root, capture_output=True, text=True, check=True,
                         env={**os.environ, "JA_ROOT_DIR": str(root), "PYTHONPATH": str(root)})
    files: set[Path] = set()
    for f in json.loads(out.stdout):
        p = Path(f).resolve()
        if p.is_relative_to(root.resolve()) and p.suffix == ".py":
            files.add(p)
            files.update(q for q in p.parent.iterdir() if q.is_file() and q.suffix not in (".py", ".pyc"))
    files.update(q for q in (root / "jax_aiter").rglob("*") if q.is_file() and "__pycache__" not in q.parts)
    files.add(root / "pyproject.toml")
    project = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    readme = project.get("readme")
    for pattern in ([readme] if isinstance(readme, str) else []) + list(project.get("license-files", [])):
        files.update(q for q in root.glob(pattern) if q.is_file())
    return sorted(files)


def _wheel_up_to_date(ctx: Context, variant: str) -> str | None:
    """Why the wheel need not be built again; its inputs' fingerprint is kept for the report either way."""
    if ctx.inputs is None:  # the libraries and the builder's code are the same for every variant: hashed once
        settings = config.load()
        paths = [*sorted(settings.umbrella_dir.glob("*.so")), *sorted(settings.jit_dir.glob("lib*.so")),
                 *code_inputs(ctx.root, WHEEL_BUILDER, ctx.python)]
        digests = sha256_files(paths)
        ctx.inputs = [(p, digests[str(p)]) for p in paths]
    h = hashlib.sha256(variant.encode())
    for p, digest in ctx.inputs:
        h.update(str(p.relative_to(ctx.root)).encode() + b"\0" + digest.encode())
    for key in ("JA_WHEEL_PLAT_NAME", "JA_WHEEL_ARCH", "SOURCE_DATE_EPOCH"):
        h.update(f"{key}={os.environ.get(key, '')}".encode())
    h.update(commit_state(ctx.root)[0].encode())
    fp = ctx.fingerprints[variant] = h.hexdigest()
    prev = next((s for s in ctx.previous.get("stages", []) if s["name"] == f"wheel_{variant}"), None)
    if not prev or prev["result"] not in GREEN or not prev.get("artifacts"):
        return None
    path, want = ctx.root / prev["artifacts"][0]["path"], prev["artifacts"][0]["sha256"]
    if prev.get("fingerprint") != fp or not path.is_file() or sha256_file(path) != want:
        return None
    ctx.wheels[variant] = path
    return "inputs unchanged since the last green run; the wheel still matches its hash"


def _wheel_artifact(ctx: Context, variant: str) -> list[Path]:
    if variant not in ctx.wheels:
        report = config.load().path("reports") / f"wheel_{variant}.json"
        ctx.wheels[variant] = Path(json.loads(report.read_text())["wheel"])
    return [ctx.wheels[variant]]


def _wheels(ctx: Context) -> list[str]:
    return [str(ctx.wheels[v]) for v in VARIANTS]


def _validated(ctx: Context) -> str | None:
    from jatools.validate import cleanroom_report
    covered = cleanroom_report.covers(cleanroom_report.report_path(ctx.root), [ctx.wheels[v] for v in VARIANTS])
    return "both wheels (same sha256) already passed validation" if covered else None


def _native(ctx: Context, stage, settings: config.Settings) -> list[steps.Step]:
    """The native sequence as jatools.native.build writes it (umbrella, JIT libraries built or taken, shims; a
    consumer's check first), each step given the release's log, re-run command, skip test and artifacts. With
    --fetch-jit the consumer's check is the fetch, which verifies what it fetched."""
    env = {**os.environ, "JA_ROOT_DIR": str(ctx.root)}
    native = native_build.native_steps(jit="take" if ctx.fetch_jit else None, env=env)
    jit_dir, umbrella_dir = settings.jit_dir, settings.umbrella_dir
    jit_libs = lambda: sorted(jit_dir.glob("lib*.so"))
    taken = {"rerun": f"{remedies.door('jit_fetch')}  (or {remedies.door('jit')})", "artifacts": jit_libs}
    if ctx.fetch_jit:  # the release's pins come from where the producer publishes (pyproject)
        taken = {"argv": [ctx.python, "-m", JITLIBS, "fetch", "--base-url", ctx.fetch_jit,
                          "--pins-from", settings.raw["jit_libs_base_url"]],
                 "rerun": f"{remedies.door('jit_fetch')} --base-url {ctx.fetch_jit}", "artifacts": jit_libs}
    extra = {
        "umbrella": {"rerun": "make  (or nox -s umbrella)", "up_to_date": lambda: _make_q(ctx, "umbrella"),
                     "artifacts": lambda: [umbrella_dir / "libjax_aiter.so"]},
        "jit": {"rerun": remedies.door("jit"), "artifacts": jit_libs},
        "jit (taken)": taken,
        "ja_mods": {"rerun": "make ja_mods  (or nox -s ja_mods)", "up_to_date": lambda: _make_q(ctx, "ja_mods"),
                    "artifacts": lambda: sorted(umbrella_dir.glob("*_ja.so"))},
    }
    return [stage(s.name.removesuffix(" (taken)"), **{"argv": s.argv, **extra[s.name]}, env=s.env) for s in native]


def stages(ctx: Context) -> list[steps.Step]:
    """The release's stages, in order; a command that names wheels is read when its stage starts."""
    py = ctx.python
    settings = config.load(root=ctx.root)
    log_dir = settings.path("release")  # one log per stage

    def stage(name: str, argv, rerun, **kw) -> steps.Step:
        return steps.Step(name, argv, cwd=ctx.root, log=log_dir / f"{name}.log", rerun=rerun, **kw)

    wheels = lambda: " ".join(_wheels(ctx))
    sdists = lambda: sorted((ctx.root / "dist").glob("*.tar.gz"))
    return [
        stage("env-report", [py, "-m", "jatools.ci.env_report", "--json-out", "dist/env-report.json"],
              "invoke env-report", up_to_date=lambda: (f"the CI driver reported this job's environment first ({p})"
                                                       if (p := env_report.written_by_ci()) else None),
              artifacts=lambda: [env_report.written_by_ci() or ctx.root / "dist/env-report.json"]),
        *_native(ctx, stage, settings),
        *[stage(f"wheel_{v}", [py, "-m", WHEEL_BUILDER, "--variant", v],
                f"nox -s wheel_{v}  (or bash scripts/build_wheel.sh --variant {v})",
                up_to_date=lambda v=v: _wheel_up_to_date(ctx, v), artifacts=lambda v=v: _wheel_artifact(ctx, v))
          for v in VARIANTS],
        stage("verify", [py, "-m", JITLIBS, "verify"], remedies.door("verify")),
        # One scan of each wheel feeds both checks (the symbol floor and the content policy).
        stage("floor+contents", lambda: [py, "-m", CHECKER, "--floor", "--contents", *_wheels(ctx)],
              lambda: f"invoke floor -- {wheels()}; invoke contents -- {wheels()}"),
        stage("sdist", [py, "-m", WHEEL_BUILDER, "--sdist"],
              "python -m jatools.wheel.wheel_build --sdist  (or python -m build --sdist)", artifacts=sdists),
        # The clients users run must accept every distribution: a candidate none would take is never green.
        stage("clients", lambda: [py, "-m", CHECKER, "--clients", *_wheels(ctx), *map(str, sdists())],
              lambda: "invoke contents --clients -- " + wheels()),
        stage("validate", lambda: [py, "-m", "jatools.validate.cleanroom", *[a for w in _wheels(ctx) for a in
                                                                             ("--wheel", w)]],
              "invoke validate  (or bash scripts/validate_wheel.sh WHEEL)", up_to_date=lambda: _validated(ctx)),
    ]


def _stage_report(rec: steps.Record, ctx: Context) -> dict:
    green_wheel = rec.result in GREEN and rec.name.startswith("wheel_")
    digests = sha256_files(rec.artifacts)
    return {"name": rec.name, "result": rec.result, "seconds": rec.seconds, "command": rec.command,
            "rerun": rec.rerun,
            "artifacts": [{"path": os.path.relpath(p, ctx.root), "sha256": digests[str(p)], "size": p.stat().st_size}
                          for p in rec.artifacts],
            "fingerprint": ctx.fingerprints.get(rec.name.removeprefix("wheel_")) if green_wheel else None,
            "note": rec.note}


def run(fetch_jit: str | None = None, dry_run: bool = False, root: Path | None = None) -> int:
    root = root or config.repo_root()
    report_path = root / REPORT
    ctx = Context(root, sys.executable, fetch_jit, json.loads(report_path.read_text()) if report_path.is_file() else {})
    plan = stages(ctx)
    if dry_run:
        print("release plan (dry run; nothing is run):")
        steps.run(plan, "release", dry_run=True)
        return 0
    commit, dirty = commit_state(root)
    started = time.time()
    since = compiler_cache.log_offset(config.load(root=root))  # this run's compiles, for the summary's last line
    try:
        records = steps.run(plan, "release")
    except steps.StepFailed as e:
        records = e.records
        print(f"\n{e}", flush=True)
    results = [_stage_report(r, ctx) for r in records]
    ok = all(r.result in GREEN for r in records)
    report = {
        "schema": SCHEMA, "kind": "jax-aiter-release", "commit": commit, "dirty": dirty,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "seconds": round(time.time() - started, 2), "ok": ok, "stages": results,
        "wheels": [a for r in results if r["name"].startswith("wheel_") for a in r["artifacts"]],
        "lane": _lane(ctx),
    }
    atomic_write.write_text(report_path, json.dumps(report, indent=2) + "\n")
    print(summary(report))
    print("  " + compiler_cache.summary(config.load(root=root), since, "release"), flush=True)
    return 0 if ok else 1


def _lane(ctx: Context) -> str | None:
    """The lane the release's wheels are (their identity's), for the report and the upload's notes."""
    from jatools.wheel import wheel_scan
    from jatools.wheel.wheel_layout import Layout

    idents = [wheel_scan.read_identity(w, Layout.load()) for w in ctx.wheels.values() if w.is_file()]
    return next((i.get("lane") for i in idents if i), None)


def summary(report: dict) -> str:
    w = max(len("stage"), *(len(s["name"]) for s in report["stages"])) + 2  # the longest stage name, then 2 spaces
    lines = ["", f"release summary ({report['commit'][:12]}{' +dirty' if report['dirty'] else ''})",
             f"  {'stage':<{w}}{'result':<12}{'time':>9}  artifact"]
    for s in report["stages"]:
        art = s["artifacts"][0]["path"] if len(s["artifacts"]) == 1 else (
            f"{len(s['artifacts'])} files" if s["artifacts"] else "")
        lines.append(f"  {s['name']:<{w}}{s['result']:<12}{s['seconds']:>8.1f}s  {art}")
    lane = f" of lane {report['lane']}" if report.get("lane") else ""
    verdict = f"GREEN: both wheels{lane} built, checked and validated" if report["ok"] else "FAILED"
    lines += [f"  {verdict} in {report['seconds']:.1f} s; report: {REPORT}"]
    return "\n".join(lines)


def green_report(report_path: Path) -> dict:
    """The release report at `report_path` if it is one and every stage of it passed; else ReleaseError."""
    if not report_path.is_file():
        raise ReleaseError(f"no {report_path}; run `nox -s release` first")
    report = json.loads(report_path.read_text())
    if report.get("kind") != "jax-aiter-release" or report.get("schema") != SCHEMA:
        raise ReleaseError(f"{report_path} is not a release report of schema {SCHEMA}; run `nox -s release` again")
    bad = [s["name"] for s in report["stages"] if s["result"] not in GREEN]
    if not report.get("ok") or bad:
        raise ReleaseError(f"the release report {report_path} is not green (stages {', '.join(bad)}); fix them and "
                           "run `nox -s release`")
    return report


def _unchanged(report_path: Path, artifact: dict) -> Path:
    """The report's artifact, found beside the report, with the bytes the report recorded; else ReleaseError."""
    path = report_path.parent / Path(artifact["path"]).name
    if not path.is_file():
        raise ReleaseError(f"{path} is missing; run `nox -s release`")
    if (got := sha256_file(path)) != artifact["sha256"]:
        raise ReleaseError(f"{path} changed since the release run: sha256 {got} != reported {artifact['sha256']}")
    return path


def validated_wheel(report_path: Path, lane: str, variant: str = "full") -> tuple[Path, dict]:
    """(the wheel, the report) of `variant` that a green release report of `lane` vouches for: built, checked and
    clean-room validated by `nox -s release`, found beside the report with the bytes it recorded. What a GPU job
    installs to test (jatools/lane_tier.py); ReleaseError for a red report, another lane, or a changed file."""
    report = green_report(report_path)
    if report.get("lane") != lane:
        raise ReleaseError(f"the release report {report_path} is of lane {report.get('lane')}, not {lane}; run "
                           f"`nox -s release` with the backend of lane {lane}")
    artifacts = [a for s in report["stages"] if s["name"] == f"wheel_{variant}" for a in s["artifacts"]]
    if len(artifacts) != 1:
        raise ReleaseError(f"the release report {report_path} names no {variant} wheel; run `nox -s release`")
    return _unchanged(report_path, artifacts[0]), report


def check_uploadable(root: Path, report_path: Path | None = None) -> dict:
    """The report (default <root>/dist/release-report.json; a lane's from another job: its dist folder's), if it
    shows every stage green for this commit and its distributions unchanged; else ReleaseError. Each artifact's
    path is resolved beside the report (`files`: {name: path}; `recorded`: {name: the report's entry for it, its
    sha256 and size}, what the index publishes)."""
    report_path = report_path or root / REPORT
    report = green_report(report_path)
    commit, dirty = commit_state(root)
    if report["commit"] != commit:
        raise ReleaseError(f"the release report {report_path} is for commit {report['commit'][:12]}, but HEAD is "
                           f"{commit[:12]}; run `nox -s release` for this commit")
    if report.get("dirty") or dirty:
        raise ReleaseError("the release was built from (or the checkout now has) uncommitted changes; commit them "
                           "and run `nox -s release`")
    sdists = [a for s in report["stages"] if s["name"] == "sdist" for a in s["artifacts"]]
    report["files"], report["recorded"] = {}, {}
    for w in [*report["wheels"], *sdists]:
        path = _unchanged(report_path, w)
        report["files"][path.name], report["recorded"][path.name] = path, w
    return report


def release_files(reports: list[dict]) -> list[Path]:
    """Every lane's distributions, once each: two lanes' files never share a name (the sdist, the same source in
    every lane, is taken once when its bytes agree)."""
    out: dict[str, Path] = {}
    for report in reports:
        for name, path in report["files"].items():
            if name in out and sha256_file(out[name]) != sha256_file(path):
                raise ReleaseError(f"two lanes made {name} with different bytes ({out[name]}, {path}): no two "
                                   "artifacts of a release may share a file name")
            out.setdefault(name, path)
    return [out[n] for n in sorted(out)]


def validated_files(root: Path, lanes: list[Path] | None = None) -> tuple[list[dict], list[Path]]:
    """(the reports, every lane's distributions once) of green `nox -s release` runs for HEAD, bytes unchanged
    (`lanes`: each a folder holding one lane's release report and files; default this checkout's dist/)."""
    reports = [check_uploadable(root, (lane / Path(REPORT).name) if lane else None) for lane in lanes or [None]]
    return reports, release_files(reports)


def _index(store: Path, tag: str, reports: list[dict], files: list[Path]) -> None:
    """Publish `files` under `tag` in the store, each with the sha256 and size its lane's report recorded (the
    index writer copies and lists only those bytes: jatools/release_index.py)."""
    from jatools import release_index
    recorded = {name: entry for r in reports for name, entry in r["recorded"].items()}
    published = [release_index.Published(f, recorded[f.name]["sha256"], recorded[f.name].get("size")) for f in files]
    try:
        release_index.add(store, tag, published)
    except release_index.ReleaseIndexError as e:
        raise ReleaseError(str(e)) from None


def index_commit(store: Path, root: Path | None = None, lanes: list[Path] | None = None) -> Path:
    """A CI run's artifact index (docs/ci.md: the CUDA lane's GPU job, on every push to main and every PR): the
    distributions green release reports vouch for, for HEAD, copied into <store>/<commit>/ and the index written
    again (jatools/release_index.py); that folder. No git tag names a main commit, so the folder is named by the
    commit the files were built and validated from; a tagged release goes through `upload`, which needs its tag."""
    root = root or config.repo_root()
    reports, files = validated_files(root, lanes)
    commit = reports[0]["commit"]
    print(f"index: {len(files)} files of {commit[:12]} into {store}", flush=True)
    _index(store, commit, reports, files)
    return store / commit


def upload(tag: str, to: str = "gh", dry_run: bool = False, root: Path | None = None,
           lanes: list[Path] | None = None) -> list[list[str]]:
    """Upload the validated distributions of every lane (`lanes`: each a folder holding one lane's release report
    and files; default this checkout's dist/): only green reports for HEAD, and only to a tag that names that
    commit. `to`: gh (the GitHub release; created when missing, a re-run replaces the assets), pypi (the sdist:
    PyPI takes no local versions, so no lane wheel), or a store folder (file:// too), which gets the files and
    the artifact index (jatools/release_index.py)."""
    root = root or config.repo_root()
    reports, files = validated_files(root, lanes)
    if not (tagged := _git(root, "rev-parse", "--verify", "--quiet", f"refs/tags/{tag}^{{commit}}")):
        raise ReleaseError(f"there is no tag {tag!r} in this checkout; a release uploads to a tag that names the "
                           f"built and validated commit: git tag {tag} <commit> && git push origin {tag}")
    if tagged != reports[0]["commit"]:
        raise ReleaseError(f"tag {tag} names commit {tagged[:12]}, but the wheels were built and validated from "
                           f"{reports[0]['commit'][:12]}; move the tag to the validated commit or run `nox -s release` "
                           f"at {tagged[:12]}")
    if to == "pypi":
        cmds = [["twine", "upload", *[str(f) for f in files if f.name.endswith(".tar.gz")]]]
    elif to == "gh":  # the GitHub release is created on the existing tag when missing; --clobber: re-runs replace
        if dry_run:
            print(f"dry run: gh release view {tag}  (created below when missing)", flush=True)
        create = dry_run or subprocess.run(["gh", "release", "view", tag], cwd=root, capture_output=True,
                                           check=False).returncode != 0
        notes = (f"jax-aiter {tag}: wheels built and validated from {reports[0]['commit']}, lanes "
                 f"{', '.join(sorted({r['lane'] for r in reports if r.get('lane')}))} (docs/wheels.md)")
        cmds = [["gh", "release", "create", tag, "--verify-tag", "--title", tag, "--notes", notes]] if create else []
        cmds.append(["gh", "release", "upload", tag, *map(str, files), "--clobber"])
    else:
        store = Path(to.removeprefix("file://"))
        print(("dry run: " if dry_run else "") + f"index: {len(files)} files of {tag} into {store}", flush=True)
        if not dry_run:
            _index(store, tag, reports, files)
        return []
    for cmd in cmds:
        print(("dry run: " if dry_run else "$ ") + " ".join(cmd), flush=True)
        if not dry_run:
            subprocess.run(cmd, cwd=root, check=True)
    return cmds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m jatools.release", description=__doc__.splitlines()[0])
    p.add_argument("--fetch-jit", metavar="URL", help="fetch the JIT libraries from this base URL (a miss fails)")
    p.add_argument("--dry-run", action="store_true", help="print the plan without running it")
    args = p.parse_args(argv)
    return run(fetch_jit=args.fetch_jit, dry_run=args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
