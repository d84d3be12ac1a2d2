"""The artifact index: a PEP 503 simple index, with the PEP 691 JSON beside each page, over a store of releases.

    python -m jatools.release_index STORE --tag TAG DIST...      (invoke release.upload --to STORE and invoke
                                                                  release.index run its `add`: jatools/release.py)

A store is a folder (or a folder an HTTP server serves: ci_local's store, any static host) laid out as GitHub's
release downloads are: `<store>/<tag>/<file>`. Adding a release copies its distributions there (a file already
present with other bytes is refused: a published file never changes) and writes the index again from everything
the store holds, every tag of every lane, so one index serves every release:

    <store>/simple/index.html, index.json                    the projects
    <store>/simple/<project>/index.html, index.json          each file, linked as ../../<tag>/<file>#sha256=<hex>

pip and uv check each download against its `#sha256=` (and the JSON's `hashes`), so a verified index pins every
file it lists; the index's own files are attested by the release workflow (docs/security.md says what that
proves). The HTML page is what a static host serves for the folder; the JSON is the same list in PEP 691's
form, which a server that negotiates `Accept: application/vnd.pypi.simple.v1+json` (jatools/ci/local_store.py)
returns instead. Every page is written to a temporary file and renamed, the project pages before the root.
"""
from __future__ import annotations

import argparse
import html
import json
import shutil
import sys
import zipfile
from email.parser import HeaderParser
from pathlib import Path

from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)

from jatools import atomic_write
from jatools.ci.local_store import SIMPLE_JSON as JSON_TYPE  # noqa: F401 (the media type the JSON pages are served as)
from jax_aiter.integrity import sha256_file

API_VERSION = "1.1"  # PEP 700: files carry `size`, projects list their `versions`
SIMPLE = "simple"


class ReleaseIndexError(RuntimeError):
    """A distribution that cannot go into the index (a bad name, or other bytes under a published name)."""


def dist_name(path: Path) -> tuple[str, str]:
    """(canonical project name, version) from a wheel's or sdist's file name; ReleaseIndexError for anything else."""
    try:
        if path.name.endswith(".whl"):
            name, version, _, _ = parse_wheel_filename(path.name)
        else:
            name, version = parse_sdist_filename(path.name)
    except (InvalidWheelFilename, InvalidSdistFilename) as e:
        raise ReleaseIndexError(f"{path.name} is not a wheel or sdist file name: {e}") from None
    return canonicalize_name(name), str(version)


def requires_python(path: Path) -> str | None:
    """The distribution's Requires-Python (METADATA of a wheel, PKG-INFO of an sdist), for the index entry."""
    import tarfile

    try:
        if path.name.endswith(".whl"):
            with zipfile.ZipFile(path) as zf:
                meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
                text = zf.read(meta).decode()
        else:
            with tarfile.open(path) as tf:
                member = next(m for m in tf.getmembers() if m.name.count("/") == 1 and m.name.endswith("/PKG-INFO"))
                text = tf.extractfile(member).read().decode()  # type: ignore[union-attr]
    except (StopIteration, OSError, zipfile.BadZipFile, tarfile.TarError):
        return None
    return HeaderParser().parsestr(text).get("Requires-Python")


def add(store: Path, tag: str, dists: list[Path]) -> list[Path]:
    """Copy `dists` into `<store>/<tag>/` and write the index again; the index files written."""
    if not tag or "/" in tag or tag.startswith(".") or tag == SIMPLE:
        raise ReleaseIndexError(f"release tag {tag!r} cannot name a folder of the store")
    folder = store / tag
    folder.mkdir(parents=True, exist_ok=True)
    for d in dists:
        dist_name(d)
        target = folder / d.name
        if target.exists():
            if sha256_file(target) != sha256_file(d):
                raise ReleaseIndexError(f"{tag}/{d.name} is already in the store with other bytes; a published file never "
                                  "changes: release under a new version or tag")
            continue
        tmp = target.with_name(f".{target.name}.tmp")
        shutil.copyfile(d, tmp)
        tmp.replace(target)
    return write(store)


def entries(store: Path) -> dict[str, list[dict]]:
    """{project: [{filename, url, sha256, size, version, requires-python}]} of every distribution in the store."""
    out: dict[str, list[dict]] = {}
    for path in sorted(store.glob("*/*")):
        if path.parent.name == SIMPLE or path.name.startswith(".") or not path.is_file() or path.is_symlink():
            continue
        if not (path.name.endswith(".whl") or path.name.endswith(".tar.gz")):
            continue
        project, version = dist_name(path)
        out.setdefault(project, []).append({
            "filename": path.name, "url": f"../../{path.parent.name}/{path.name}", "sha256": sha256_file(path),
            "size": path.stat().st_size, "version": version, "requires-python": requires_python(path)})
    return out


def _page(title: str, links: list[tuple[str, str, dict[str, str]]]) -> str:
    rows = "".join(f'    <a href="{html.escape(href)}"'
                   + "".join(f' {k}="{html.escape(v)}"' for k, v in attrs.items())
                   + f">{html.escape(text)}</a><br/>\n" for href, text, attrs in links)
    return ("<!DOCTYPE html>\n<html>\n  <head>\n"
            f'    <meta name="pypi:repository-version" content="{API_VERSION}">\n'
            f"    <title>{html.escape(title)}</title>\n  </head>\n  <body>\n    <h1>{html.escape(title)}</h1>\n"
            f"{rows}  </body>\n</html>\n")


def write(store: Path) -> list[Path]:
    """Write every index page of the store from what it holds; the files written."""
    found = entries(store)
    written = []
    for project, files in sorted(found.items()):
        files.sort(key=lambda f: f["filename"])
        links = [(f"{f['url']}#sha256={f['sha256']}", f["filename"],
                  {"data-requires-python": f["requires-python"]} if f["requires-python"] else {}) for f in files]
        doc = {"meta": {"api-version": API_VERSION}, "name": project,
               "versions": sorted({f["version"] for f in files}),
               "files": [{"filename": f["filename"], "url": f["url"], "hashes": {"sha256": f["sha256"]},
                          "size": f["size"], **({"requires-python": f["requires-python"]}
                                                if f["requires-python"] else {})} for f in files]}
        folder = store / SIMPLE / project
        folder.mkdir(parents=True, exist_ok=True)
        written.append(atomic_write.write_text(folder / "index.json", json.dumps(doc, indent=1) + "\n"))
        written.append(atomic_write.write_text(folder / "index.html", _page(f"Links for {project}", links)))
    root = store / SIMPLE
    root.mkdir(parents=True, exist_ok=True)
    written.append(atomic_write.write_text(root / "index.json", json.dumps(
        {"meta": {"api-version": API_VERSION}, "projects": [{"name": p} for p in sorted(found)]}, indent=1) + "\n"))
    written.append(atomic_write.write_text(root / "index.html", _page("Simple index", [
        (f"{p}/", p, {}) for p in sorted(found)])))
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m jatools.release_index", description=__doc__.splitlines()[0])
    p.add_argument("store", type=Path, help="the store folder (<store>/<tag>/<file>, <store>/simple/)")
    p.add_argument("--tag", required=True, help="the release the distributions belong to")
    p.add_argument("dists", nargs="*", type=Path, help="wheels and sdists to add (none: only rewrite the index)")
    a = p.parse_intermixed_args(argv)  # STORE --tag T DIST...: the tag may come between the positionals
    try:
        written = add(a.store, a.tag, a.dists) if a.dists else write(a.store)
    except (ReleaseIndexError, OSError) as e:
        print(f"release_index: error: {e}", file=sys.stderr)
        return 1
    print(f"release_index: {len(written)} index files in {a.store / SIMPLE}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
