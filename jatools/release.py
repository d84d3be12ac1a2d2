"""The main job: turn a checkout into two validated wheels and a release report.

    python -m jatools.release [--fetch-jit URL] [--dry-run]      (nox -s release)

Stages, in order: environment report; umbrella; JIT libraries (built, or
fetched with --fetch-jit, failing on a miss); FFI shims; the lite and full
wheels; verify, floor and contents; the sdist; the clients users run (twine
check --strict, check-wheel-contents, wheel unpack + pack) on the wheels and
the sdist; clean-room validation of both wheels. A
stage whose inputs are unchanged since the last green run is skipped and the
summary says so (make's own -q for the native targets, input fingerprints for
the wheels, the validation report's wheel hashes for validation). The first
failing stage stops the run with its cause and the command that re-runs just
that stage. Ends with a one-screen summary and dist/release-report.json, which
`invoke release.upload` requires.
"""
from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from jatools import atomic_write, config
from jatools.native import build as native_build
from jax_aiter.integrity import sha256_file, sha256_files

REPORT = "dist/release-report.json"
SCHEMA = 1
WHEEL_BUILDER = "jatools.wheel.wheel_build"  # the module the wheel stages run (its imports decide the bytes too)


class ReleaseError(RuntimeError):
    pass


@dataclass
class StageResult:
    name: str
    result: str  # ok | up-to-date | failed | not run
    seconds: float = 0.0
    command: str = ""
    rerun: str = ""
    artifacts: list[dict] = field(default_factory=list)
    fingerprint: str | None = None
    note: str = ""


@dataclass(frozen=True)
class Stage:
    name: str
    argv: Callable[[Context], list[str]]
    rerun: Callable[[Context], str]
    up_to_date: Callable[[Context], str | None] | None = None  # a reason when nothing needs doing
    fingerprint: Callable[[Context], str] | None = None
    artifacts: Callable[[Context], list[Path]] = lambda ctx: []


@dataclass
class Context:
    root: Path
    python: str
    fetch_jit: str | None
    previous: dict
    wheels: dict[str, Path] = field(default_factory=dict)
    code: list[Path] | None = None  # the wheel builder's code inputs, found once per run

    def prev_stage(self, name: str) -> dict | None:
        for s in self.previous.get("stages", []):
            if s["name"] == name:
                return s
        return None


def _git(root: Path, *args: str) -> str:
    out = subprocess.run(["git", "-C", str(root), *args], check=False, capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else ""


def commit_state(root: Path) -> tuple[str, bool]:
    """(HEAD commit, whether tracked files differ from it)."""
    return _git(root, "rev-parse", "HEAD"), bool(_git(root, "status", "--porcelain", "--untracked-files=no"))


def _make_q(target: str) -> Callable[[Context], str | None]:
    def check(ctx: Context) -> str | None:
        ok = subprocess.run(["make", "-q", target], check=False, cwd=ctx.root, capture_output=True).returncode == 0
        return f"`make -q {target}`: nothing to do" if ok else None
    return check


_PROBE = ("import importlib, json, sys; importlib.import_module(sys.argv[1]); "
          "print(json.dumps(sorted({m.__file__ for m in list(sys.modules.values()) if getattr(m, '__file__', None)})))")


def code_inputs(root: Path, module: str, python: str = sys.executable) -> list[Path]:
    """What a stage's code is made of: every source file of this checkout that importing `module` loads,
    the data files beside them (a layout table), the packaged runtime, and pyproject.toml.

    Derived by importing the module in a fresh interpreter, not from a hand list: a module that decides a
    wheel's bytes or tag (the floor check, the ELF reader, the settings) cannot be left out of the
    fingerprint by forgetting to list it.
    """
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
    with open(root / "pyproject.toml", "rb") as f:  # the files METADATA is made of: the readme, the licenses
        project = tomllib.load(f)["project"]
    readme = project.get("readme")
    for pattern in ([readme] if isinstance(readme, str) else []) + list(project.get("license-files", [])):
        files.update(q for q in root.glob(pattern) if q.is_file())
    return sorted(files)


def _wheel_fingerprint(variant: str) -> Callable[[Context], str]:
    def fp(ctx: Context) -> str:
        settings = config.load()
        libs = sorted(settings.umbrella_dir.glob("*.so")) + sorted(settings.jit_dir.glob("lib*.so"))
        h = hashlib.sha256(variant.encode())
        if ctx.code is None:
            ctx.code = code_inputs(ctx.root, WHEEL_BUILDER, ctx.python)
        for p in libs + ctx.code:
            h.update(str(p.relative_to(ctx.root)).encode() + b"\0" + sha256_file(p).encode())
        for key in ("JA_WHEEL_PLAT_NAME", "JA_WHEEL_ARCH", "SOURCE_DATE_EPOCH"):
            h.update(f"{key}={os.environ.get(key, '')}".encode())
        h.update(commit_state(ctx.root)[0].encode())
        return h.hexdigest()
    return fp


def _wheel_up_to_date(variant: str) -> Callable[[Context], str | None]:
    def check(ctx: Context) -> str | None:
        prev = ctx.prev_stage(f"wheel_{variant}")
        if not prev or prev["result"] not in ("ok", "up-to-date") or not prev.get("artifacts"):
            return None
        art = prev["artifacts"][0]
        path = ctx.root / art["path"]
        if prev.get("fingerprint") != _wheel_fingerprint(variant)(ctx) or not path.is_file():
            return None
        if sha256_file(path) != art["sha256"]:
            return None
        ctx.wheels[variant] = path
        return "inputs unchanged since the last green run; the wheel still matches its hash"
    return check


def _wheel_artifact(variant: str) -> Callable[[Context], list[Path]]:
    def art(ctx: Context) -> list[Path]:
        if variant not in ctx.wheels:
            report = config.load().build_dir / "reports" / f"wheel_{variant}.json"
            ctx.wheels[variant] = Path(json.loads(report.read_text())["wheel"])
        return [ctx.wheels[variant]]
    return art


def _wheels(ctx: Context) -> list[str]:
    return [str(ctx.wheels[v]) for v in ("lite", "full")]


def _validated(ctx: Context) -> str | None:
    from jatools.validate import cleanroom_report
    path = ctx.root / str(config.defaults(ctx.root).get("validation_report", "build/validate/report.json"))
    wheels = [ctx.wheels[v] for v in ("lite", "full")]
    return "both wheels (same sha256) already passed validation" if cleanroom_report.covers(path, wheels) else None


def stages(fetch_jit: str | None) -> list[Stage]:
    py = lambda ctx: ctx.python
    libs = lambda ctx: sorted(config.load().jit_dir.glob("lib*.so"))
    if native_build.jit_mode(None, dict(os.environ)) == "build":
        jit = Stage("jit", lambda ctx: [py(ctx), "-m", "jatools.native.jit_build"],
                    lambda ctx: "nox -s jit  (or make jit, python3 jax_aiter/jit/build_jit.py)", artifacts=libs)
    else:  # a consumer (CI=true or JA_JIT_LIBS=take): never builds, fails at once on a miss
        jit = Stage("jit", lambda ctx: [py(ctx), "-m", "jatools.native.build", "--check-taken"],
                    lambda ctx: "invoke jit.fetch  (or nox -s jit)", artifacts=libs)
    if fetch_jit:
        jit = Stage("jit", lambda ctx: [py(ctx), "-m", "invoke", "jit.fetch", "--base-url", fetch_jit,
                                        "--pins-from", config.load().raw["jit_libs_base_url"]],
                    lambda ctx: f"invoke jit.fetch --base-url {fetch_jit}",
                    artifacts=libs)
    return [
        Stage("env-report", lambda ctx: [py(ctx), "-m", "jatools.ci.env_report", "--json-out", "dist/env-report.json"],
              lambda ctx: "invoke env-report", artifacts=lambda ctx: [ctx.root / "dist/env-report.json"]),
        Stage("umbrella", lambda ctx: ["make", "umbrella"], lambda ctx: "make  (or nox -s umbrella)",
              up_to_date=_make_q("umbrella"),
              artifacts=lambda ctx: [config.load().umbrella_dir / "libjax_aiter.so"]),
        jit,
        Stage("ja_mods", lambda ctx: ["make", "ja_mods"], lambda ctx: "make ja_mods  (or nox -s ja_mods)",
              up_to_date=_make_q("ja_mods"), artifacts=lambda ctx: sorted(config.load().umbrella_dir.glob("*_ja.so"))),
        *[Stage(f"wheel_{v}", lambda ctx, v=v: [py(ctx), "-m", "jatools.wheel.wheel_build", "--variant", v],
                lambda ctx, v=v: f"nox -s wheel_{v}  (or bash scripts/build_wheel.sh --variant {v})",
                up_to_date=_wheel_up_to_date(v), fingerprint=_wheel_fingerprint(v), artifacts=_wheel_artifact(v))
          for v in ("lite", "full")],
        Stage("verify", lambda ctx: [py(ctx), "-m", "invoke", "verify"], lambda ctx: "invoke verify"),
        Stage("floor", lambda ctx: [py(ctx), "-m", "jatools.wheel.wheel_floor", *_wheels(ctx)],
              lambda ctx: "invoke floor -- " + " ".join(_wheels(ctx))),
        Stage("contents", lambda ctx: [py(ctx), "-m", "jatools.wheel.wheel_contents", *_wheels(ctx)],
              lambda ctx: "invoke contents -- " + " ".join(_wheels(ctx))),
        Stage("sdist", lambda ctx: [py(ctx), "-m", "jatools.wheel.wheel_build", "--sdist"],
              lambda ctx: "python -m jatools.wheel.wheel_build --sdist  (or python -m build --sdist)",
              artifacts=lambda ctx: sorted((ctx.root / "dist").glob("*.tar.gz"))),
        # The clients users run must accept every distribution: a candidate none would take is never green.
        Stage("clients", lambda ctx: [py(ctx), "-m", "jatools.wheel.wheel_contents", "--clients", *_wheels(ctx),
                                      *map(str, sorted((ctx.root / "dist").glob("*.tar.gz")))],
              lambda ctx: "invoke contents --clients -- " + " ".join(_wheels(ctx))),
        Stage("validate", lambda ctx: [py(ctx), "-m", "jatools.validate.cleanroom",
                                       *[a for w in _wheels(ctx) for a in ("--wheel", w)]],
              lambda ctx: "invoke validate  (or bash scripts/validate_wheel.sh WHEEL)", up_to_date=_validated),
    ]


def _run_stage(stage: Stage, ctx: Context, log_dir: Path) -> tuple[int, str, float]:
    """Run the stage's command, streaming its output, keeping the tail for the failure message."""
    argv = stage.argv(ctx)
    log_dir.mkdir(parents=True, exist_ok=True)
    tail: collections.deque[str] = collections.deque(maxlen=25)
    start = time.monotonic()
    with open(log_dir / f"{stage.name}.log", "w") as log:
        proc = subprocess.Popen(argv, cwd=ctx.root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in proc.stdout:  # type: ignore[union-attr]
            sys.stdout.write(f"  {line}")
            log.write(line)
            tail.append(line)
        rc = proc.wait()
    return rc, "".join(tail), time.monotonic() - start


def _artifacts(paths: list[Path], root: Path) -> list[dict]:
    paths = [p for p in paths if p.is_file()]
    digests = sha256_files(paths)
    return [{"path": os.path.relpath(p, root), "sha256": digests[str(p)], "size": p.stat().st_size} for p in paths]


def run(fetch_jit: str | None = None, dry_run: bool = False, root: Path | None = None) -> int:
    root = root or config.repo_root()
    report_path = root / REPORT
    previous = json.loads(report_path.read_text()) if report_path.is_file() else {}
    ctx = Context(root, sys.executable, fetch_jit, previous)
    plan = stages(fetch_jit)
    if dry_run:
        print("release plan (dry run; nothing is run):")
        for i, st in enumerate(plan, 1):
            try:
                cmd = " ".join(st.argv(ctx))
            except (OSError, KeyError, ValueError):
                cmd = "(command depends on the wheels built by the earlier stages)"
            print(f"  {i:2}. {st.name:<11} {cmd}")
        return 0
    commit, dirty = commit_state(root)
    results: list[StageResult] = []
    failed: StageResult | None = None
    started = time.time()
    for st in plan:
        if failed:
            results.append(StageResult(st.name, "not run"))
            continue
        print(f"release: [{st.name}]", flush=True)
        res = StageResult(st.name, "ok")
        t0 = time.monotonic()
        reason = st.up_to_date(ctx) if st.up_to_date else None
        if reason:
            res.result, res.note = "up-to-date", reason
            print(f"  skipped: {reason}")
        else:
            res.command = " ".join(st.argv(ctx))
            rc, tail, _ = _run_stage(st, ctx, root / "build/release")
            if rc != 0:
                res.result = "failed"
                res.rerun = st.rerun(ctx)
                res.note = f"exit {rc}"
                failed = res
                res.seconds = time.monotonic() - t0
                results.append(res)
                print(f"\nrelease: stage '{st.name}' failed (exit {rc}). Its last lines:\n{tail.rstrip()}\n"
                      f"Full log: build/release/{st.name}.log\nRe-run just this stage: {res.rerun}", flush=True)
                continue
        res.rerun = st.rerun(ctx)
        res.fingerprint = st.fingerprint(ctx) if st.fingerprint else None
        res.artifacts = _artifacts(st.artifacts(ctx), root)
        res.seconds = time.monotonic() - t0
        results.append(res)
    report = {
        "schema": SCHEMA, "kind": "jax-aiter-release", "commit": commit, "dirty": dirty,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "seconds": round(time.time() - started, 2), "ok": failed is None,
        "stages": [asdict(r) for r in results],
        "wheels": [a for r in results if r.name.startswith("wheel_") for a in r.artifacts],
    }
    atomic_write.write_text(report_path, json.dumps(report, indent=2) + "\n")
    print(summary(report))
    return 0 if failed is None else 1


def summary(report: dict) -> str:
    lines = ["", f"release summary ({report['commit'][:12]}{' +dirty' if report['dirty'] else ''})",
             f"  {'stage':<12}{'result':<12}{'time':>9}  artifact"]
    for s in report["stages"]:
        art = s["artifacts"][0]["path"] if len(s["artifacts"]) == 1 else (
            f"{len(s['artifacts'])} files" if s["artifacts"] else "")
        lines.append(f"  {s['name']:<12}{s['result']:<12}{s['seconds']:>8.1f}s  {art}")
    verdict = "GREEN: both wheels built, checked and validated" if report["ok"] else "FAILED"
    lines += [f"  {verdict} in {report['seconds']:.1f} s; report: {REPORT}"]
    return "\n".join(lines)


# --- upload ---------------------------------------------------------------------------------------

def check_uploadable(root: Path) -> dict:
    """The report, if it shows every stage green for this commit and the wheels unchanged; else ReleaseError."""
    path = root / REPORT
    if not path.is_file():
        raise ReleaseError(f"no {REPORT}; run `nox -s release` first")
    report = json.loads(path.read_text())
    if report.get("kind") != "jax-aiter-release" or report.get("schema") != SCHEMA:
        raise ReleaseError(f"{REPORT} is not a release report of schema {SCHEMA}; run `nox -s release` again")
    bad = [s["name"] for s in report["stages"] if s["result"] not in ("ok", "up-to-date")]
    if not report.get("ok") or bad:
        raise ReleaseError(f"the release report is not green (stages {', '.join(bad)}); fix them and run "
                           "`nox -s release`")
    commit, dirty = commit_state(root)
    if report["commit"] != commit:
        raise ReleaseError(f"the release report is for commit {report['commit'][:12]}, but HEAD is {commit[:12]}; "
                           "run `nox -s release` for this commit")
    if report.get("dirty") or dirty:
        raise ReleaseError("the release was built from (or the checkout now has) uncommitted changes; commit them "
                           "and run `nox -s release`")
    for w in report["wheels"]:
        p = root / w["path"]
        if not p.is_file():
            raise ReleaseError(f"{w['path']} is missing; run `nox -s release`")
        got = sha256_file(p)
        if got != w["sha256"]:
            raise ReleaseError(f"{w['path']} changed since the release run: sha256 {got} != reported {w['sha256']}")
    return report


def tag_commit(root: Path, tag: str) -> str:
    """The commit `tag` names in this checkout; ReleaseError when there is no such tag."""
    cp = subprocess.run(["git", "-C", str(root), "rev-parse", "--verify", "--quiet", f"refs/tags/{tag}^{{commit}}"],
                        capture_output=True, text=True, check=False)
    if cp.returncode != 0:
        raise ReleaseError(f"there is no tag {tag!r} in this checkout; a release uploads to a tag that names the "
                           f"built and validated commit: git tag {tag} <commit> && git push origin {tag}")
    return cp.stdout.strip()


def upload_commands(report: dict, tag: str, to: str, create: bool = False) -> list[list[str]]:
    """The upload; for a GitHub release missing so far (`create`), its creation first, on the existing tag."""
    wheels = [w["path"] for w in report["wheels"]]
    if to == "pypi":
        return [["twine", "upload", *[w for w in wheels if "+full" not in w]]]
    notes = f"jax-aiter {tag}: wheels built and validated from {report['commit']} (dist/release-report.json)"
    make = [["gh", "release", "create", tag, "--verify-tag", "--title", tag, "--notes", notes]] if create else []
    return [*make, ["gh", "release", "upload", tag, *wheels, "--clobber"]]  # --clobber: a re-run replaces, not fails


def upload(tag: str, to: str = "gh", dry_run: bool = False, root: Path | None = None) -> list[list[str]]:
    """Upload the validated wheels: only a green report for HEAD, and only to a tag that names that commit.

    Idempotent: the GitHub release is created when missing, and a re-run replaces the assets.
    """
    root = root or config.repo_root()
    report = check_uploadable(root)
    tagged = tag_commit(root, tag)
    if tagged != report["commit"]:
        raise ReleaseError(f"tag {tag} names commit {tagged[:12]}, but the wheels were built and validated from "
                           f"{report['commit'][:12]}; move the tag to the validated commit or run `nox -s release` "
                           f"at {tagged[:12]}")
    create = False
    if to == "gh":
        if dry_run:
            print(f"dry run: gh release view {tag}  (created below when missing)", flush=True)
        create = dry_run or subprocess.run(["gh", "release", "view", tag], cwd=root, capture_output=True,
                                           check=False).returncode != 0
    cmds = upload_commands(report, tag, to, create)
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
