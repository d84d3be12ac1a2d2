"""The artifact index: one PEP 503 simple index per lane, with the PEP 691 JSON beside each page, over a store of
releases whose every file is held to what was published.

    python -m jatools.release_index STORE      check every file of the store and write its index again
                                               (adding a release: invoke release.upload --to STORE, invoke
                                               release.index; both call `add` from jatools/release.py)

A store is a folder (or a folder an HTTP server serves: ci_local's store, any static host) laid out as GitHub's
release downloads are: `<store>/<tag>/<file>`. Beside a release's files, `<tag>/published.json` records what was
published under the tag: each file's sha256 and size as the lanes' green release reports recorded them (`add` takes
them from there and copies only those bytes). A published file never changes.

The index has one root per lane, as PyTorch serves one per backend (download.pytorch.org/whl/cu130): a root lists
only its lane's wheels, every release of them, so `pip install --extra-index-url <store>/cuda13/simple jax-aiter`
can only get the cuda13 lane (docs/wheels.md, "Lanes", says why not one root for all lanes):

    <store>/<lane>/simple/index.html, index.json             the projects
    <store>/<lane>/simple/<project>/index.html, index.json   its wheels, linked as ../../../<tag>/<file>#sha256=<hex>

pip and uv check each download against its `#sha256=` (and the JSON's `hashes`), so a verified index pins every
file it lists; the index files and the records are attested by the release workflow (docs/security.md says what
that proves). The HTML page is what a static host serves for the folder; the JSON is the same list in PEP 691's
form, which a server that negotiates `Accept: application/vnd.pypi.simple.v1+json` (jatools/ci/local_store.py)
returns instead.

Before anything is listed, every file of the store is held to its tag's record: a file whose bytes changed, a
recorded file that is gone, a file no record lists, or a file that is no wheel or sdist stops the write, naming
it, and the index stays as it was. Writers take turns
(a lock on the store folder, jax_aiter/download/folder_lock.py); each
lane's root is written whole in a temporary folder and renamed into place, so its HTML and JSON pages always
agree; what a killed write left (temporary files and folders, and the files of an `add` that never reached its
record) is removed by the next writer.
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import html
import json
import os
import sys
import tarfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path

from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import Version

from jatools import atomic_write
from jatools.ci.local_store import SIMPLE_JSON as JSON_TYPE  # noqa: F401 (the media type the JSON pages are served as)
from jax_aiter.download import folder_lock
from jax_aiter.integrity import CHUNK, sha256_files
from jax_aiter.lane import INDEX_ROOT

API_VERSION = "1.1"  # PEP 700: files carry `size`, projects list their `versions`
SIMPLE = "simple"  # the all-lanes root an earlier writer made at <store>/simple (removed when found)
RECORD = "published.json"  # <store>/<tag>/RECORD: what was published under the tag
RECORD_SCHEMA = 1
JOURNAL = ".adding-"  # <store>/<tag>/.adding-<pid>.json: the files an unfinished `add` put in place
Log = Callable[[str], None]


class ReleaseIndexError(RuntimeError):
    """A file that cannot go into the index (a bad name, bytes other than the published ones, not a distribution,
    missing, or never published); the message names it and the fix."""


@dataclass(frozen=True)
class Published:
    """A distribution to publish and the bytes a green release report recorded for it (its sha256; its size, where
    the report has it)."""

    path: Path
    sha256: str
    size: int | None = None


@functools.cache
def _lanes() -> dict[str, str]:
    """{lane name: backend}: the lanes jatools/wheel/wheel_layout.toml declares (one index root each)."""
    from jatools.wheel.wheel_layout import Layout

    return {lane.name: backend for backend, lane in Layout.load().lanes.items()}


def lane_of_version(version: str) -> str | None:
    """The lane a wheel's version names (its local label's first part: 0.1.0+cuda13.full -> cuda13), or None."""
    first = (Version(version).local or "").split(".")[0]
    return first if first in _lanes() else None


def _metadata(path: Path) -> tuple[str, str, str | None]:
    """(project, version, Requires-Python) from the distribution's own metadata, checked against its file name;
    ReleaseIndexError naming the file when it is no wheel or sdist of that name."""
    try:
        if path.name.endswith(".whl"):
            name, version, _, _ = parse_wheel_filename(path.name)
            kind = "wheel"
        else:
            name, version = parse_sdist_filename(path.name)
            kind = "sdist"
    except (InvalidWheelFilename, InvalidSdistFilename) as e:
        raise ReleaseIndexError(f"{path.name} is not a wheel or sdist file name: {e}") from None
    try:
        if kind == "wheel":
            with zipfile.ZipFile(path) as zf:
                meta = [n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
                if len(meta) != 1:
                    raise ValueError(f"it has {len(meta)} .dist-info/METADATA files, not one")
                text = zf.read(meta[0]).decode()
        else:
            with tarfile.open(path, "r:gz") as tf:
                pkg = [m for m in tf.getmembers() if m.isfile() and m.name.count("/") == 1
                       and m.name.endswith("/PKG-INFO")]
                if len(pkg) != 1:
                    raise ValueError(f"it has {len(pkg)} top-level PKG-INFO files, not one")
                text = tf.extractfile(pkg[0]).read().decode()  # type: ignore[union-attr]
    except (OSError, EOFError, ValueError, zipfile.BadZipFile, tarfile.TarError, UnicodeDecodeError) as e:
        raise ReleaseIndexError(f"{path} is named like a {kind} but is not one ({e}); only the distributions a "
                                "green release report names are published: run `nox -s release`") from None
    meta = HeaderParser().parsestr(text)
    said = (canonicalize_name(meta.get("Name") or ""), meta.get("Version") or "")
    if said[0] != canonicalize_name(name) or said[1] != str(version):
        raise ReleaseIndexError(f"{path}: its metadata names {said[0]} {said[1]}, its file name {name} {version}; "
                                "a renamed file is not published")
    return canonicalize_name(name), str(version), meta.get("Requires-Python")


def check_tag(tag: str) -> None:
    if not tag or "/" in tag or tag.startswith(".") or tag == SIMPLE or tag in _lanes():
        raise ReleaseIndexError(f"release tag {tag!r} cannot name a folder of the store (not empty, no '/', not "
                                f"hidden, not {SIMPLE!r}, not a lane's index root: {', '.join(sorted(_lanes()))})")


def _copy_checked(src: Path, target: Path, want: str) -> None:
    """Copy `src` to `target` through a temporary file, hashing the bytes as they are written; a copy whose sha256
    is not `want` (the file changed since its report was checked) is deleted and refused."""
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    h = hashlib.sha256()
    try:
        with open(src, "rb") as fin, open(tmp, "xb") as fout:
            while chunk := fin.read(CHUNK):
                h.update(chunk)
                fout.write(chunk)
        if h.hexdigest() != want:
            raise ReleaseIndexError(f"{src} has sha256 {h.hexdigest()}, but its release report recorded {want}: it "
                                    "changed after `nox -s release` validated it; run the release again")
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def _read_record(folder: Path) -> dict | None:
    path = folder / RECORD
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise ReleaseIndexError(f"{path} is not a plain file; restore the record the release wrote")
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        if data.get("schema") != RECORD_SCHEMA or not isinstance(data.get("files"), dict):
            raise ValueError(f"not a record of schema {RECORD_SCHEMA}")
    except (ValueError, UnicodeDecodeError) as e:
        raise ReleaseIndexError(f"{path} cannot be read ({e}); restore the record the release wrote") from None
    return data


def _clean(store: Path, log: Log) -> None:
    """Remove what killed writes left (call it holding the lock): temporary files and folders of dead processes,
    and the files an unfinished `add` put in place that its tag's record does not list."""
    atomic_write.remove_dead_temps(store, log)
    for folder in sorted(p for p in store.iterdir() if p.is_dir() and not p.is_symlink() and
                         not p.name.startswith(".")):
        atomic_write.remove_dead_temps(folder, log)
        recorded = (_read_record(folder) or {}).get("files", {})
        for journal in sorted(folder.glob(f"{JOURNAL}*.json")):
            _undo(journal, recorded, log)


def _undo(journal: Path, recorded: dict, log: Log) -> None:
    """Remove the files an unfinished `add` put in place (its journal names them) that the record does not list,
    then the journal."""
    try:
        names = json.loads(journal.read_text())
    except (OSError, ValueError):
        names = []
    for name in names if isinstance(names, list) else []:
        path = journal.parent / str(name)
        if "/" not in str(name) and name not in recorded and (path.exists() or path.is_symlink()):
            log(f"release_index: removing {path}: an interrupted add put it there and never recorded it")
            folder_lock.remove(path)
    journal.unlink(missing_ok=True)


def add(store: Path, tag: str, files: list[Published], log: Log = print) -> list[Path]:
    """Copy the published `files` into `<store>/<tag>/`, record them in its published.json, and write the index
    again; the index files written. Each copy must have the bytes its report recorded."""
    check_tag(tag)
    store.mkdir(parents=True, exist_ok=True)
    with folder_lock.hold(store, "release index", log):
        _clean(store, log)
        folder = store / tag
        if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
            raise ReleaseIndexError(f"{folder} is not a folder; remove it")
        record = _read_record(folder) or {"schema": RECORD_SCHEMA, "tag": tag, "files": {}}
        new = {}
        for f in files:
            project, version, requires = _metadata(f.path)
            lane = lane_of_version(version) if f.path.name.endswith(".whl") else None
            if f.path.name.endswith(".whl") and lane is None:
                raise ReleaseIndexError(f"{f.path.name}: version {version} names no lane ({', '.join(_lanes())}); "
                                        "a released wheel carries its lane in its local label (docs/wheels.md)")
            entry = {"sha256": f.sha256, "size": f.size if f.size is not None else f.path.stat().st_size,
                     "project": project, "version": version, "lane": lane, "requires_python": requires}
            old = record["files"].get(f.path.name)
            if old is not None and (old["sha256"], old["size"]) != (entry["sha256"], entry["size"]):
                raise ReleaseIndexError(f"{tag}/{f.path.name} is already published with other bytes (sha256 "
                                        f"{old['sha256']}); a published file never changes: release under a new "
                                        "version or tag")
            if old is None:
                new[f.path.name] = (f, entry)
        entries(store)  # the store holds what was published, or nothing is added to it
        folder.mkdir(exist_ok=True)
        if new:  # the journal names the files before any is in place, so a killed add can be undone
            journal = folder / f"{JOURNAL}{os.getpid()}.json"
            atomic_write.write_text(journal, json.dumps(sorted(new)))
            try:
                for name, (f, _) in sorted(new.items()):
                    _copy_checked(f.path, folder / name, f.sha256)
                files_now = dict(sorted({**record["files"], **{n: e for n, (_, e) in new.items()}}.items()))
                atomic_write.write_text(folder / RECORD, json.dumps({**record, "files": files_now}, indent=1) + "\n")
            except BaseException:
                _undo(journal, record["files"], log)
                raise
            journal.unlink()
        return _write_locked(store, log)


def _verify_folder(folder: Path, record: dict) -> list[str]:
    """Every file of a release folder against its record: raise ReleaseIndexError naming each changed, missing,
    unrecorded or non-regular file; the published names otherwise."""
    problems = []
    recorded = record["files"]
    present = {p.name: p for p in folder.iterdir() if not p.name.startswith(".") and p.name != RECORD}
    for name in sorted(set(present) - set(recorded)):
        problems.append(f"{present[name]} is in the store but was never published ({folder / RECORD} does not list "
                        "it): remove it; files are published with invoke release.upload --to STORE")
    regular = {n: p for n, p in present.items() if n in recorded and p.is_file() and not p.is_symlink()}
    problems += [f"{present[n]} is not a plain file (a symlink or a folder), but {folder / RECORD} publishes a "
                 f"file of that name; restore the published file" for n in sorted(set(present) & set(recorded))
                 if n not in regular]
    problems += [f"{folder / n} is missing: {folder / RECORD} publishes it (sha256 {recorded[n]['sha256']}); restore "
                 "it from the release's assets or the lane's dist/" for n in sorted(set(recorded) - set(present))]
    digests = sha256_files(regular.values())
    for name, path in sorted(regular.items()):
        want, got = recorded[name], (digests[str(path)], path.stat().st_size)
        if (want["sha256"], want["size"]) != got:
            problems.append(f"{path} changed after it was published: sha256 {got[0]} ({got[1]} bytes), published "
                            f"{want['sha256']} ({want['size']} bytes); restore the published file from the "
                            "release's assets or the lane's dist/, never re-publish other bytes under its name")
    if problems:
        raise ReleaseIndexError("the store does not hold what was published, so no index is written: "
                                + "; ".join(problems))
    return sorted(recorded)


def entries(store: Path) -> dict[str, dict[str, list[dict]]]:
    """{lane: {project: [{filename, url, sha256, size, version, requires-python}]}} of every published wheel,
    each file verified against its tag's record first (ReleaseIndexError naming every file that is not)."""
    out: dict[str, dict[str, list[dict]]] = {}
    problems = []
    lanes = _lanes()
    for folder in sorted(p for p in store.iterdir() if not p.name.startswith(".")):
        if folder.name in lanes or folder.name == SIMPLE:
            continue  # an index root: written here, never listed
        if folder.is_symlink() or not folder.is_dir():
            if folder.name.endswith((".whl", ".tar.gz")) or folder.is_dir():
                problems.append(f"{folder} is not a release folder (a symlink, or a distribution outside a release's "
                                "folder): it was never published; remove it")
            continue
        try:
            record = _read_record(folder)
            if record is None:
                stray = sorted(p.name for p in folder.iterdir() if p.name.endswith((".whl", ".tar.gz")))
                if stray:  # a folder of distributions nobody published (not a JIT-library release, say)
                    problems.append(f"{folder} holds {', '.join(stray)} but no {RECORD}: they were never "
                                    "published; remove them, or publish with invoke release.upload --to STORE")
                continue
            names = _verify_folder(folder, record)
        except ReleaseIndexError as e:
            problems.append(str(e).removeprefix("the store does not hold what was published, so no index is "
                                                "written: "))
            continue
        for name in names:
            e = record["files"][name]
            if e.get("lane"):
                out.setdefault(e["lane"], {}).setdefault(e["project"], []).append({
                    "filename": name, "url": f"../../../{folder.name}/{name}", "sha256": e["sha256"],
                    "size": e["size"], "version": e["version"], "requires-python": e.get("requires_python")})
    if problems:
        raise ReleaseIndexError("the store does not hold what was published, so no index is written: "
                                + "; ".join(problems))
    return out


def _page(title: str, links: list[tuple[str, str, dict[str, str]]]) -> str:
    rows = "".join(f'    <a href="{html.escape(href)}"'
                   + "".join(f' {k}="{html.escape(v)}"' for k, v in attrs.items())
                   + f">{html.escape(text)}</a><br/>\n" for href, text, attrs in links)
    return ("<!DOCTYPE html>\n<html>\n  <head>\n"
            f'    <meta name="pypi:repository-version" content="{API_VERSION}">\n'
            f"    <title>{html.escape(title)}</title>\n  </head>\n  <body>\n    <h1>{html.escape(title)}</h1>\n"
            f"{rows}  </body>\n</html>\n")


def write_root(folder: Path, projects: dict[str, list[dict]]) -> list[Path]:
    """The pages of one simple index root in `folder` (which must not exist yet): the projects page and each
    project's page, HTML and JSON; the files written (relative to `folder`)."""
    written = []
    for project, files in sorted(projects.items()):
        files = sorted(files, key=lambda f: f["filename"])
        links = [(f"{f['url']}#sha256={f['sha256']}", f["filename"],
                  {"data-requires-python": f["requires-python"]} if f["requires-python"] else {}) for f in files]
        doc = {"meta": {"api-version": API_VERSION}, "name": project,
               "versions": sorted({f["version"] for f in files}),
               "files": [{"filename": f["filename"], "url": f["url"], "hashes": {"sha256": f["sha256"]},
                          "size": f["size"], **({"requires-python": f["requires-python"]}
                                                if f["requires-python"] else {})} for f in files]}
        (folder / project).mkdir(parents=True)
        (folder / project / "index.json").write_text(json.dumps(doc, indent=1) + "\n")
        (folder / project / "index.html").write_text(_page(f"Links for {project}", links))
        written += [Path(project, "index.json"), Path(project, "index.html")]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "index.json").write_text(json.dumps(
        {"meta": {"api-version": API_VERSION}, "projects": [{"name": p} for p in sorted(projects)]}, indent=1) + "\n")
    (folder / "index.html").write_text(_page("Simple index", [(f"{p}/", p, {}) for p in sorted(projects)]))
    return [*written, Path("index.json"), Path("index.html")]


def _swap_in(final: Path, build: Callable[[Path], list[Path]]) -> list[Path]:
    """Write a whole folder through a temporary one, then rename it into place: a reader sees the old pages or the
    new ones, never a mix (for an instant between the two renames, none)."""
    pid = os.getpid()
    tmp, old = final.with_name(f".{final.name}.tmp-{pid}"), final.with_name(f".{final.name}.old-{pid}")
    final.parent.mkdir(parents=True, exist_ok=True)
    try:
        written = [final / p for p in build(tmp)]
        for p in [tmp, *tmp.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)  # served as any published file is, whatever the umask
        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
    except BaseException:
        if old.exists() and not final.exists():
            os.replace(old, final)  # the previous pages stay
        raise
    finally:
        folder_lock.remove(tmp)
        folder_lock.remove(old)
    return written


def lane_root(store: Path, lane: str) -> Path:
    """A lane's index root in the store (jax_aiter/lane.py INDEX_ROOT: the runtime names it in its messages)."""
    return Path(INDEX_ROOT.format(store=store, lane=lane))


def _write_locked(store: Path, log: Log) -> list[Path]:
    found = entries(store)
    written = []
    for lane, projects in sorted(found.items()):
        written += _swap_in(lane_root(store, lane), lambda tmp, projects=projects: write_root(tmp, projects))
    for lane in sorted(set(_lanes()) - set(found)):
        if lane_root(store, lane).is_dir():  # no wheel of the lane is published any more (only by hand)
            log(f"release_index: removing {lane_root(store, lane)}: no published wheel of lane {lane}")
            folder_lock.remove(lane_root(store, lane))
    if (store / SIMPLE).is_dir():  # the one root over every lane an earlier writer made: installs pick a lane's
        log(f"release_index: removing {store / SIMPLE}, the index over every lane an earlier version wrote: an "
            f"unpinned install from it took the highest lane label, not the user's backend; each lane has its own "
            f"root now ({', '.join(str(lane_root(store, lane)) for lane in sorted(found))})")
        folder_lock.remove(store / SIMPLE)
    return written


def write(store: Path, log: Log = print) -> list[Path]:
    """Check every file of the store against what was published and write every lane's index root again; the
    index files written."""
    with folder_lock.hold(store, "release index", log):
        _clean(store, log)
        return _write_locked(store, log)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m jatools.release_index", description=__doc__.splitlines()[0])
    p.add_argument("store", type=Path, help="the store folder (<store>/<tag>/<file>, <store>/<lane>/simple/)")
    a = p.parse_args(argv)
    try:
        written = write(a.store)
    except (ReleaseIndexError, OSError) as e:
        print(f"release_index: error: {e}", file=sys.stderr)
        return 1
    roots = sorted({str(lane_root(a.store, p.relative_to(a.store).parts[0])) for p in written})
    print(f"release_index: {len(written)} index files in {', '.join(roots) or 'no lane root (nothing published)'}",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
