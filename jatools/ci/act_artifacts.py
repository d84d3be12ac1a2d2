"""The local stand-ins of the artifact and attestation actions under `nox -s ci_local` (ci/act/*/action.yml).

    python3 -m jatools.ci.act_artifacts upload NAME IF_NO_FILES PATHS   # PATHS: globs, one a line
    python3 -m jatools.ci.act_artifacts download NAME_OR_PATTERN DEST
    python3 -m jatools.ci.act_artifacts attest PATHS

Artifacts live in $JA_ACT_ARTIFACTS/<name>/ (ci_local makes that folder per run). Stdlib only: it runs on
the host before any virtual environment exists."""
from __future__ import annotations

import fnmatch
import glob
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path


def _store() -> Path:
    root = os.environ.get("JA_ACT_ARTIFACTS")
    if not root:
        raise SystemExit("act_artifacts: JA_ACT_ARTIFACTS is not set (nox -s ci_local sets it)")
    return Path(root)


def _matches(paths: str) -> list[Path]:
    found = []
    for pattern in filter(None, (p.strip() for p in paths.splitlines())):
        found += [Path(p) for p in sorted(glob.glob(pattern.rstrip("/"), recursive=True))]
    return found


def _root(paths: str) -> Path:
    """The folder an artifact's paths are stored relative to, as actions/upload-artifact chooses it: the least common
    ancestor of the search paths (each pattern up to its first glob segment); one file alone: its folder."""
    search = []
    for pattern in filter(None, (p.strip().rstrip("/") for p in paths.splitlines())):
        parts = Path(pattern).parts
        literal = next((i for i, part in enumerate(parts) if glob.has_magic(part)), len(parts))
        search.append(Path(*parts[:literal]) if literal else Path("."))
    if len(search) == 1 and search[0].is_file():
        return search[0].parent
    return Path(os.path.commonpath([str(p) for p in search]))


def upload(name: str, if_none: str, paths: str) -> int:
    found = _matches(paths)
    files = [f for p in found for f in ([q for q in sorted(p.rglob("*")) if q.is_file()] if p.is_dir() else [p])]
    if not files:
        print(f"upload-artifact (stand-in): no files for {name!r} ({if_none})")
        return 1 if if_none == "error" else 0
    dest, root = _store() / name, _root(paths)
    shutil.rmtree(dest, ignore_errors=True)
    for f in files:
        target = dest / f.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, target)
    print(f"upload-artifact (stand-in): {name}: {len(files)} file(s) from {root}/ -> {dest}")
    return 0


def download(name: str, dest: str) -> int:
    store = _store()
    names = sorted(p.name for p in store.iterdir() if fnmatch.fnmatch(p.name, name)) if store.is_dir() else []
    if not names:
        print(f"download-artifact (stand-in): no artifact matches {name!r} in {store}")
        return 1
    single = names == [name]
    for n in names:
        shutil.copytree(store / n, Path(dest) if single else Path(dest) / n, dirs_exist_ok=True)
    print(f"download-artifact (stand-in): {', '.join(names)} -> {dest}")
    return 0


def attest(paths: str) -> int:
    files = [f for f in _matches(paths) if f.is_file()]
    if not files:
        print(f"attest (stand-in): no subject matches {paths!r}")
        return 1
    subjects = [{"name": f.name, "digest": {"sha256": hashlib.sha256(f.read_bytes()).hexdigest()}} for f in files]
    out = Path("build/attestations/provenance-subjects.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"subject": subjects}, indent=1) + "\n")
    print(f"attest (stand-in): {len(subjects)} subject(s) -> {out} (not signed: no OIDC token here)")
    return 0


def main(argv: list[str]) -> int:
    actions = {"upload": upload, "download": download, "attest": attest}
    if not argv or argv[0] not in actions:
        print(__doc__, file=sys.stderr)
        return 2
    return actions[argv[0]](*argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
