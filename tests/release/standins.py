"""Small stand-in distributions with the lanes' names, for the index and install tests.

The wheels are valid (METADATA, WHEEL, RECORD) and py3-none-any, so they install anywhere; their package says which
lane and variant they are. What is tested with them is the index and the installers' choice and hash checks; the
real wheels have their own tests (tests/wheel).
"""
from __future__ import annotations

import base64
import hashlib
import io
import json
import tarfile
import zipfile
from pathlib import Path

from jatools import release_index
from jax_aiter.integrity import sha256_file

LANES = ("0.1.0+cuda13", "0.1.0+cuda13.full", "0.1.0+rocm7", "0.1.0+rocm7.full")


def stand_in_wheel(folder: Path, version: str, requires: tuple[str, ...] = ()) -> Path:
    """A valid wheel of jax-aiter `version` whose package says which lane it is (`requires`: its Requires-Dist)."""
    label = version.split("+")[1]
    files = {"jax_aiter/__init__.py": f"LANE = {label!r}\n".encode(),
             "jax_aiter/_build_identity.json": json.dumps({"version": version, "lane": label.split(".")[0]}).encode()}
    info = f"jax_aiter-{version}.dist-info"
    files[f"{info}/METADATA"] = (f"Metadata-Version: 2.4\nName: jax-aiter\nVersion: {version}\n"
                                 "Requires-Python: >=3.12\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
                                 ).encode()
    files[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = "".join(f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b'=').decode()},"
                     f"{len(b)}\n" for n, b in files.items()) + f"{info}/RECORD,,\n"
    files[f"{info}/RECORD"] = record.encode()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"jax_aiter-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(zipfile.ZipInfo(name, (2023, 11, 14, 22, 13, 20)), data)
    return path


def stand_in_sdist(folder: Path, version: str = "0.1.0") -> Path:
    """An sdist of jax-aiter `version` (what PyPI holds) whose build stops at once, saying it was chosen: an install
    that should have taken a lane's wheel and fell back to a source build fails fast and says why."""
    base = f"jax_aiter-{version}"
    members = {
        f"{base}/PKG-INFO": f"Metadata-Version: 2.4\nName: jax-aiter\nVersion: {version}\nRequires-Python: >=3.12\n",
        f"{base}/pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "refuse"\nbackend-path = ["."]\n',
        f"{base}/refuse.py": "raise SystemExit('the jax-aiter sdist was chosen instead of a lane wheel')\n"}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{base}.tar.gz"
    with tarfile.open(path, "w:gz") as tf:
        for name, text in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(text.encode()), 1700000000
            tf.addfile(info, io.BytesIO(text.encode()))
    return path


def altered(folder: Path, version: str, member: str, text: str) -> Path:
    """stand_in_wheel's wheel in a new `folder` with `member` added: other bytes under the same file name."""
    path = stand_in_wheel(folder, version)
    with zipfile.ZipFile(path, "a") as zf:
        zf.writestr(member, text)
    return path


def published(*paths: Path) -> list[release_index.Published]:
    """The files as a green release report records them (its sha256 and size of each)."""
    return [release_index.Published(p, sha256_file(p), p.stat().st_size) for p in paths]


def pages(store: Path, lane: str) -> tuple[dict, str]:
    """(the JSON page, the HTML page) of jax-aiter in `lane`'s index root."""
    folder = release_index.lane_root(store, lane) / "jax-aiter"
    return json.loads((folder / "index.json").read_text()), (folder / "index.html").read_text()
