"""The artifact index (jatools/release_index.py) through the installers users run: pip and uv against a real HTTP
server on 127.0.0.1 (jatools/ci/local_store.py, the store ci_local serves), each lane picked by its version.

The wheels are small stand-ins with the lanes' names (py3-none-any, so they install anywhere); what is tested is
the index and the installers' choice and hash checks, the wheel build has its own tests (tests/wheel).
"""
from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
import sys
import urllib.request
import zipfile
from pathlib import Path

import pytest

from jatools import release_index
from jatools.ci.local_store import SIMPLE_JSON, LocalStore

LANES = ("0.1.0+cuda13", "0.1.0+cuda13.full", "0.1.0+rocm7", "0.1.0+rocm7.full")


def stand_in_wheel(folder: Path, version: str) -> Path:
    """A valid wheel of jax-aiter `version` whose package says which lane it is."""
    lane = version.split("+")[1]
    files = {"jax_aiter/__init__.py": f"LANE = {lane!r}\n".encode(),
             "jax_aiter/_build_identity.json": json.dumps({"version": version, "lane": lane.split(".")[0]}).encode()}
    info = f"jax_aiter-{version}.dist-info"
    files[f"{info}/METADATA"] = (f"Metadata-Version: 2.4\nName: jax-aiter\nVersion: {version}\n"
                                 "Requires-Python: >=3.12\n").encode()
    files[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = "".join(f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b'=').decode()},"
                     f"{len(b)}\n" for n, b in files.items()) + f"{info}/RECORD,,\n"
    files[f"{info}/RECORD"] = record.encode()
    path = folder / f"jax_aiter-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path


@pytest.fixture
def store(tmp_path):
    made = tmp_path / "made"
    made.mkdir()
    root = tmp_path / "store"
    release_index.add(root, "v0.1.0", [stand_in_wheel(made, v) for v in LANES])
    with LocalStore(root) as served:
        yield root, served.url


def altered_stand_in(folder: Path, version: str, member: str, text: str) -> Path:
    """stand_in_wheel's wheel in a new `folder` with `member` added: other bytes under the same file name."""
    folder.mkdir()
    path = stand_in_wheel(folder, version)
    with zipfile.ZipFile(path, "a") as zf:
        zf.writestr(member, text)
    return path

def installed(target: Path) -> tuple[str, str]:
    """(version of the installed dist-info, the lane its package names)."""
    (info,) = target.glob("jax_aiter-*.dist-info")
    return info.name.removeprefix("jax_aiter-").removesuffix(".dist-info"), \
        (target / "jax_aiter/__init__.py").read_text().split("'")[1]


def installers() -> list[list[str]]:
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    out = [[sys.executable, "-m", "pip", "install", "--disable-pip-version-check"]]
    if uv:
        out.append([uv, "pip", "install", "--python", sys.executable])
    return out


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=300)
    print("$", " ".join(cmd), "\n", out.stdout[-2000:], out.stderr[-2000:])
    return out


def test_the_pages_list_every_file_with_its_sha256_in_html_and_json(store):
    root, url = store
    page = (root / "simple/jax-aiter/index.html").read_text()
    doc = json.loads((root / "simple/jax-aiter/index.json").read_text())
    assert doc["meta"]["api-version"] == release_index.API_VERSION and doc["name"] == "jax-aiter"
    assert sorted(doc["versions"]) == sorted(LANES)
    for f in doc["files"]:
        data = (root / "v0.1.0" / f["filename"]).read_bytes()
        assert f["hashes"]["sha256"] == hashlib.sha256(data).hexdigest() and f["size"] == len(data)
        assert f'href="../../v0.1.0/{f["filename"]}#sha256={f["hashes"]["sha256"]}"' in page
        assert f["requires-python"] == ">=3.12" and 'data-requires-python="&gt;=3.12"' in page
    assert len({f["filename"] for f in doc["files"]}) == len(LANES), "two lanes share a file name"
    # PEP 691 content negotiation on the served store: JSON for a client that asks for it, HTML otherwise
    req = urllib.request.Request(f"{url}/simple/jax-aiter/", headers={"Accept": SIMPLE_JSON})
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.headers["Content-Type"] == SIMPLE_JSON and json.loads(resp.read())["name"] == "jax-aiter"
    with urllib.request.urlopen(f"{url}/simple/", timeout=30) as resp:
        assert b'href="jax-aiter/"' in resp.read()


@pytest.mark.parametrize("version", ["0.1.0+cuda13", "0.1.0+rocm7.full"])
def test_pip_and_uv_install_the_lane_asked_for_from_the_index(store, tmp_path, version):
    _, url = store
    for i, cmd in enumerate(installers()):
        target = tmp_path / f"t{i}"
        out = run([*cmd, "--no-deps", "--target", str(target), "--index-url", f"{url}/simple",
                   f"jax-aiter=={version}"])
        assert out.returncode == 0, out.stderr
        assert installed(target) == (version, version.split("+")[1]), cmd[0]


def test_pip_and_uv_install_a_lane_from_the_release_assets_page(store, tmp_path):
    """The release's assets as a flat page of links (GitHub's expanded_assets page; here the store's folder)."""
    _, url = store
    for i, cmd in enumerate(installers()):
        target = tmp_path / f"t{i}"
        out = run([*cmd, "--no-deps", "--target", str(target), "--no-index", "--find-links", f"{url}/v0.1.0/",
                   "jax-aiter==0.1.0+cuda13.full"])
        assert out.returncode == 0, out.stderr
        assert installed(target) == ("0.1.0+cuda13.full", "cuda13.full")


def test_a_file_changed_after_indexing_is_refused_by_both_installers(store, tmp_path):
    root, url = store
    other = altered_stand_in(tmp_path / "other", "0.1.0+cuda13", "jax_aiter/planted.py",
                             "print('not what the index pinned')\n")
    shutil.copyfile(other, root / "v0.1.0" / other.name)
    for i, cmd in enumerate(installers()):
        out = run([*cmd, "--no-deps", "--target", str(tmp_path / f"t{i}"), "--index-url", f"{url}/simple",
                   "jax-aiter==0.1.0+cuda13"])
        assert out.returncode != 0, f"{cmd[0]} installed a file whose sha256 differs from the index's"
        assert "hash" in (out.stdout + out.stderr).lower(), out.stderr


def test_a_published_file_never_changes_and_releases_accumulate(store, tmp_path):
    root, _ = store
    changed = altered_stand_in(tmp_path / "next", "0.1.0+cuda13", "jax_aiter/extra.py", "")
    with pytest.raises(release_index.ReleaseIndexError, match="already in the store with other bytes"):
        release_index.add(root, "v0.1.0", [changed])
    release_index.add(root, "v0.2.0", [stand_in_wheel(changed.parent, "0.2.0+cuda13")])
    doc = json.loads((root / "simple/jax-aiter/index.json").read_text())
    assert "0.2.0+cuda13" in doc["versions"] and "0.1.0+rocm7" in doc["versions"]
    with pytest.raises(release_index.ReleaseIndexError, match="cannot name a folder"):
        release_index.add(root, "simple", [changed])
