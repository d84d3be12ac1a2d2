"""What a wheel, the editable wheel and the sdist say about the distribution, from pyproject's [project]: its
file name, core metadata (METADATA 2.4, validated by packaging), the dist-info files and RECORD, and the time
stamp every member carries (SOURCE_DATE_EPOCH, else the HEAD commit's time: never the clock, so rebuilds
match).
"""
from __future__ import annotations

import csv
import io
import subprocess
import tomllib
from pathlib import Path

from packaging.metadata import Metadata, RawMetadata, RFC822Message
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from jatools.wheel import wheel_scan
from jatools.wheel.zip_writer import DeterministicZipWriter, WrittenMember
from jax_aiter import settings as numeric

GENERATOR = "jax-aiter jatools.wheel.wheel_build"
MIN_EPOCH = 315532800  # 1980-01-01, the first time a zip can hold
LIB_MODE, FILE_MODE = 0o755, 0o644  # archive members: libraries and executables, other files (wheels, sdist)


class WheelBuildError(RuntimeError):
    """The wheel cannot be built; the message says what is wrong and which command fixes it."""


def file_name(project: dict) -> str:
    """The distribution name as wheel, sdist and dist-info names spell it (jax_aiter)."""
    return canonicalize_name(project["name"]).replace("-", "_")


def project_table(root: Path) -> dict:
    """pyproject.toml's [project] table of the tree at `root`."""
    return tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def default_epoch(root: Path) -> int:
    """SOURCE_DATE_EPOCH, else the HEAD commit's time, else 1980: never the clock, so rebuilds match."""
    if (sde := numeric.from_env("SOURCE_DATE_EPOCH")) is not None:
        return max(MIN_EPOCH, sde)
    out = subprocess.run(["git", "-C", str(root), "log", "-1", "--format=%ct"], capture_output=True, text=True,
                         check=False)
    return max(MIN_EPOCH, int(out.stdout.strip())) if out.returncode == 0 and out.stdout.strip() else MIN_EPOCH


# Core metadata field names as the spec writes them (packaging writes them lower-case, which twine rejects).
_FIELD_CASE = {"author-email": "Author-email", "maintainer-email": "Maintainer-email", "home-page": "Home-page",
               "download-url": "Download-URL", "project-url": "Project-URL"}
METADATA_VERSION = "2.4"  # License-Expression and License-File are 2.4 fields


def license_files(project: dict, root: Path) -> list[str]:
    """The files pyproject's `license-files` globs name (PEP 639), sorted; WheelBuildError when one matches nothing."""
    out: set[str] = set()
    for pattern in project.get("license-files", []):
        found = [p.relative_to(root).as_posix() for p in root.glob(pattern) if p.is_file()]
        if not found:
            raise WheelBuildError(f"pyproject.toml license-files: {pattern!r} matches no file in {root}; add the "
                                  "file (the project declares MIT: LICENSE at the root) or fix the pattern")
        out.update(found)
    return sorted(out)


def metadata_text(project: dict, version: str, root: Path) -> tuple[bytes, list[str]]:
    """METADATA (core metadata 2.4) from pyproject's [project], validated by packaging; notes on anything left out."""
    notes = []
    reqs = list(project.get("dependencies", []))
    extras = project.get("optional-dependencies", {})
    for extra, deps in extras.items():
        for dep in deps:
            r = Requirement(dep)
            marker = f'({r.marker}) and extra == "{extra}"' if r.marker else f'extra == "{extra}"'
            r.marker = None
            reqs.append(f"{r}; {marker}")
    raw: RawMetadata = {
        "metadata_version": METADATA_VERSION, "name": project["name"], "version": version,
        "summary": project.get("description", ""), "requires_python": project.get("requires-python", ""),
        "requires_dist": reqs, "provides_extra": list(extras), "classifiers": list(project.get("classifiers", [])),
        "project_urls": dict(project.get("urls", {})), "license_files": license_files(project, root)}
    if project.get("keywords"):
        raw["keywords"] = list(project["keywords"])
    for role in ("author", "maintainer"):  # PEP 621: names with emails go to *-email, names alone to the name field
        people = project.get(f"{role}s", [])
        if emails := [f"{p['name']} <{p['email']}>" if p.get("name") else p["email"] for p in people if p.get("email")]:
            raw[f"{role}_email"] = ", ".join(emails)
        if names := [p["name"] for p in people if p.get("name") and not p.get("email")]:
            raw[role] = ", ".join(names)
    lic = project.get("license")
    if isinstance(lic, str):
        raw["license_expression"] = lic
    elif isinstance(lic, dict):
        raise WheelBuildError("pyproject.toml: `license` is a table; write the SPDX expression instead "
                              '(license = "MIT") and list the files in license-files (PEP 639)')
    readme = project.get("readme")
    if isinstance(readme, str):
        path = root / readme
        if path.is_file():
            raw["description"] = path.read_text(encoding="utf-8")
            raw["description_content_type"] = "text/markdown" if readme.endswith(".md") else "text/plain"
        else:
            notes.append(f"pyproject names readme {readme!r}, which does not exist; METADATA has no description")
    try:
        meta = Metadata.from_raw(raw, validate=True)
    except Exception as e:  # packaging raises an ExceptionGroup of InvalidMetadata
        errors = getattr(e, "exceptions", [e])
        raise WheelBuildError("pyproject.toml [project] gives invalid metadata: "
                              + "; ".join(str(x) for x in errors)) from e
    out = RFC822Message()
    for name, value in meta.as_rfc822().items():
        out[_FIELD_CASE.get(name.lower(), "-".join(w.capitalize() for w in name.split("-")))] = value
    if meta.description is not None:
        out.set_payload(meta.description)
    return out.as_bytes(), notes


def wheel_text(tag: str, purelib: bool = False) -> bytes:
    # Not purelib: the libraries are platform-specific, so installers put them in platlib.
    return (f"Wheel-Version: 1.0\nGenerator: {GENERATOR}\nRoot-Is-Purelib: {str(purelib).lower()}\n"
            f"Tag: {tag}\n").encode()


def dist_info_files(project: dict, metadata: bytes, wheel: bytes, root: Path) -> dict[str, bytes]:
    """{file in the dist-info: bytes}, RECORD aside: METADATA, the license files (PEP 639: licenses/), WHEEL and
    the entry points. The wheel and prepare_metadata_for_build_wheel write the same ones."""
    groups = {"console_scripts": project.get("scripts", {}), "gui_scripts": project.get("gui-scripts", {}),
              **project.get("entry-points", {})}
    return {"METADATA": metadata,
            **{f"licenses/{rel}": (root / rel).read_bytes() for rel in license_files(project, root)},
            "WHEEL": wheel,
            "entry_points.txt": "".join(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items()) + "\n"
                                        for group, entries in groups.items() if entries).encode()}


def add_dist_info(zw: DeterministicZipWriter, dist_info: str, metadata: bytes, wheel: bytes, project: dict,
                  root: Path) -> list[WrittenMember]:
    """dist_info_files, then RECORD last. Returns the members RECORD lists (every one before it)."""
    for name, data in dist_info_files(project, metadata, wheel, root).items():
        zw.add_bytes(f"{dist_info}/{name}", data)
    written = zw.members
    record = io.StringIO()
    csv.writer(record, lineterminator="\n").writerows(
        [*([m.arcname, wheel_scan.record_hash(m.sha256), m.size] for m in written), [f"{dist_info}/RECORD", "", ""]])
    zw.add_bytes(f"{dist_info}/RECORD", record.getvalue().encode())
    return written
