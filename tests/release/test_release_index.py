"""The artifact index (jatools/release_index.py): one root per lane, every file held to what was published, writers
taking turns, and the installers users run (pip and uv against a real HTTP server on 127.0.0.1:
jatools/ci/local_store.py, the store ci_local serves).

The wheels are stand-ins with the lanes' names (tests/release/standins.py); what is tested is the index, the store's
checks and the installers' choice and hash checks.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import urllib.request
import zipfile
from pathlib import Path

import pytest

from jatools import release_index
from jatools.ci.local_store import SIMPLE_JSON, LocalStore
from tests.release.standins import (
    LANES,
    altered,
    pages,
    published,
    stand_in_sdist,
    stand_in_wheel,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def store(tmp_path):
    made = tmp_path / "made"
    root = tmp_path / "store"
    release_index.add(root, "v0.1.0", published(*[stand_in_wheel(made, v) for v in LANES], stand_in_sdist(made)))
    with LocalStore(root) as served:
        yield root, served.url


def index_files(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in root.rglob("index.*")}


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
    else:
        print("uv is not installed for this interpreter or on PATH: only pip is tested (the test group installs uv)")
    return out


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=300, **kw)
    print("$", " ".join(cmd), "\n", out.stdout[-2000:], out.stderr[-2000:])
    return out


def test_each_lane_root_lists_its_own_wheels_with_their_sha256_in_html_and_json(store):
    root, url = store
    for lane in ("cuda13", "rocm7"):
        doc, page = pages(root, lane)
        assert doc["meta"]["api-version"] == release_index.API_VERSION and doc["name"] == "jax-aiter"
        assert doc["versions"] == sorted(v for v in LANES if v.split("+")[1].split(".")[0] == lane)
        for f in doc["files"]:
            data = (root / "v0.1.0" / f["filename"]).read_bytes()
            assert f["hashes"]["sha256"] == hashlib.sha256(data).hexdigest() and f["size"] == len(data)
            assert f'href="../../../v0.1.0/{f["filename"]}#sha256={f["hashes"]["sha256"]}"' in page
            assert f["requires-python"] == ">=3.12" and 'data-requires-python="&gt;=3.12"' in page
        assert [f["filename"] for f in doc["files"]] == [n for n in (
            f["filename"] for f in doc["files"]) if f"+{lane}" in n], "a lane root lists another lane's wheel"
    assert not (root / release_index.SIMPLE).exists(), "no root over every lane: it hands out the highest label"
    record = json.loads((root / "v0.1.0" / release_index.RECORD).read_text())
    assert "jax_aiter-0.1.0.tar.gz" in record["files"], "the sdist is published (PyPI's too), in no lane's root"
    # PEP 691 content negotiation on the served store: JSON for a client that asks for it, HTML otherwise
    req = urllib.request.Request(f"{url}/cuda13/simple/jax-aiter/", headers={"Accept": SIMPLE_JSON})
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.headers["Content-Type"] == SIMPLE_JSON and json.loads(resp.read())["name"] == "jax-aiter"
    with urllib.request.urlopen(f"{url}/cuda13/simple/", timeout=30) as resp:
        assert b'href="jax-aiter/"' in resp.read()


@pytest.mark.parametrize(("lane", "spec", "want"), [
    ("cuda13", "jax-aiter", "0.1.0+cuda13.full"),  # unpinned: the lane's full wheel, never another lane's
    ("rocm7", "jax-aiter", "0.1.0+rocm7.full"),
    ("cuda13", "jax-aiter==0.1.0+cuda13", "0.1.0+cuda13"),
    ("cuda13", "jax-aiter==0.1.0", "0.1.0+cuda13.full"),  # a public pin matches every label of the root: its lane
])
def test_pip_and_uv_install_from_a_lane_root_only_that_lane(store, tmp_path, lane, spec, want):
    _, url = store
    for i, cmd in enumerate(installers()):
        target = tmp_path / f"t{i}"
        out = run([*cmd, "--no-deps", "--target", str(target), "--index-url", f"{url}/{lane}/simple", spec])
        assert out.returncode == 0, out.stderr
        assert installed(target) == (want, want.split("+")[1]), cmd[0]


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
    other = altered(tmp_path / "other", "0.1.0+cuda13", "jax_aiter/planted.py", "print('not what the index pinned')\n")
    shutil.copyfile(other, root / "v0.1.0" / other.name)
    for i, cmd in enumerate(installers()):
        out = run([*cmd, "--no-deps", "--target", str(tmp_path / f"t{i}"), "--index-url", f"{url}/cuda13/simple",
                   "jax-aiter==0.1.0+cuda13"])
        assert out.returncode != 0, f"{cmd[0]} installed a file whose sha256 differs from the index's"
        assert "hash" in (out.stdout + out.stderr).lower(), out.stderr


def test_a_published_file_never_changes_and_releases_accumulate(store, tmp_path):
    root, _ = store
    changed = altered(tmp_path / "next", "0.1.0+cuda13", "jax_aiter/extra.py", "")
    with pytest.raises(release_index.ReleaseIndexError, match="already published with other bytes"):
        release_index.add(root, "v0.1.0", published(changed))
    release_index.add(root, "v0.2.0", published(stand_in_wheel(tmp_path / "v2", "0.2.0+cuda13")))
    assert "0.2.0+cuda13" in pages(root, "cuda13")[0]["versions"] and "0.1.0+cuda13" in pages(root, "cuda13")[0][
        "versions"]
    assert "0.2.0+cuda13" not in pages(root, "rocm7")[0]["versions"]
    for tag in ("simple", "cuda13", ".hidden", "a/b"):
        with pytest.raises(release_index.ReleaseIndexError, match="cannot name a folder of the store"):
            release_index.add(root, tag, published(changed))


def test_a_wheel_whose_version_names_no_lane_is_refused(tmp_path):
    wheel = tmp_path / "w" / "jax_aiter-0.1.0+gpu-py3-none-any.whl"
    shutil.copyfile(stand_in_wheel(tmp_path / "src", "0.1.0+cuda13"), tmp_path / "x.whl")
    wheel.parent.mkdir()
    with zipfile.ZipFile(tmp_path / "x.whl") as zin, zipfile.ZipFile(wheel, "w") as zout:
        for n in zin.namelist():
            data = zin.read(n).replace(b"0.1.0+cuda13", b"0.1.0+gpu")
            zout.writestr(n.replace("0.1.0+cuda13", "0.1.0+gpu"), data)
    with pytest.raises(release_index.ReleaseIndexError, match=r"version 0.1.0\+gpu names no lane"):
        release_index.add(tmp_path / "store", "v0.1.0", published(wheel))


# --- faults: an index that cannot be fooled (issue 84) ----------------------------------------------------------

def test_faults_index_a_swapped_wheel_is_refused_on_rewrite_and_on_the_next_release(store, tmp_path):
    """A published wheel replaced by one with a payload: rewriting the index or adding the next release stops,
    naming the file, and the index keeps the published sha256 (so the installers refuse the payload)."""
    root, url = store
    before = index_files(root)
    payload = altered(tmp_path / "payload", "0.1.0+cuda13", "jax_aiter/payload.py", "import os\n")
    shutil.copyfile(payload, root / "v0.1.0" / payload.name)
    where = str(root / "v0.1.0" / payload.name)
    for attempt in (lambda: release_index.write(root),
                    lambda: release_index.add(root, "v0.2.0",
                                              published(stand_in_wheel(tmp_path / "n", "0.2.0+cuda13")))):
        with pytest.raises(release_index.ReleaseIndexError, match="changed after it was published") as e:
            attempt()
        assert where in str(e.value) and "restore the published file" in str(e.value)
    assert index_files(root) == before, "the index was written over a changed file"
    assert not (root / "v0.2.0").exists() or not any((root / "v0.2.0").iterdir())
    cli = run([sys.executable, "-m", "jatools.release_index", str(root)], cwd=ROOT)
    assert cli.returncode == 1 and where in cli.stderr and cli.stderr.count("\n") == 1, "one line naming the file"
    out = run([*installers()[0], "--no-deps", "--target", str(tmp_path / "t"), "--index-url",
               f"{url}/cuda13/simple", "jax-aiter==0.1.0+cuda13"])
    assert out.returncode != 0 and "hash" in out.stderr.lower(), "pip installed the payload"


def test_faults_index_a_deleted_wheel_is_refused_not_dropped(store):
    root, _ = store
    before = index_files(root)
    (root / "v0.1.0" / "jax_aiter-0.1.0+rocm7-py3-none-any.whl").unlink()
    with pytest.raises(release_index.ReleaseIndexError,
                       match=r"v0.1.0/jax_aiter-0.1.0\+rocm7-py3-none-any.whl is missing: .*published.json publishes"):
        release_index.write(root)
    assert index_files(root) == before


@pytest.mark.parametrize("how", ["added", "planted"])
def test_faults_index_random_bytes_named_like_a_wheel_are_refused(store, tmp_path, how):
    root, _ = store
    before = index_files(root)
    fake = tmp_path / "jax_aiter-0.3.0+cuda13-py3-none-any.whl"
    fake.write_bytes(os.urandom(4096))
    if how == "added":  # even when a report vouches for its bytes, it is no wheel
        with pytest.raises(release_index.ReleaseIndexError,
                           match=re.escape(f"{fake} is named like a wheel but is not one")):
            release_index.add(root, "v0.3.0", published(fake))
    else:
        shutil.copyfile(fake, root / "v0.1.0" / fake.name)
        with pytest.raises(release_index.ReleaseIndexError,
                           match=re.escape(f"{root / 'v0.1.0' / fake.name} is in the store but was never published")):
            release_index.write(root)
    assert index_files(root) == before


def test_faults_index_a_file_that_differs_from_its_report_is_not_copied(tmp_path):
    """The report recorded other bytes than the file now holds (changed after the release validated it)."""
    wheel = stand_in_wheel(tmp_path / "dist", "0.1.0+cuda13")
    entry = published(wheel)[0]
    wheel.write_bytes(altered(tmp_path / "other", "0.1.0+cuda13", "x.py", "").read_bytes())
    store = tmp_path / "store"
    with pytest.raises(release_index.ReleaseIndexError, match="changed after `nox -s release` validated it"):
        release_index.add(store, "v0.1.0", [entry])
    assert not any((store / "v0.1.0").iterdir()), "a refused add left files behind"


WRITER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from tests.release.standins import published
    from jatools import release_index
    store, tag = Path(sys.argv[1]), sys.argv[2]
    wheels = sorted(Path(sys.argv[3]).glob("*.whl"))
    for _ in range(int(sys.argv[4])):
        release_index.write(store)
    release_index.add(store, tag, published(*wheels))
""")


def test_faults_index_two_writers_take_turns_and_the_html_and_json_pages_agree(tmp_path):
    """Two writers at once, several rounds: each waits for the other (saying so), and every lane root's HTML and
    JSON list the same files, every release of both writers included."""
    store = tmp_path / "store"
    release_index.add(store, "v0.0.1", published(stand_in_wheel(tmp_path / "first", "0.0.1+cuda13")))
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    waited = 0
    for r in range(3):
        procs = []
        for w in range(2):
            version = f"0.{r + 1}.{w}"
            made = tmp_path / f"r{r}w{w}"
            for v in (f"{version}+cuda13", f"{version}+cuda13.full", f"{version}+rocm7"):
                stand_in_wheel(made, v)
            procs.append(subprocess.Popen([sys.executable, str(script), str(store), f"v{version}",
                                           str(made), "3"], env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        for p in procs:
            out = p.communicate(timeout=300)[0]
            assert p.returncode == 0, out
            waited += "another run writing into" in out and "holds its lock; waiting for it" in out
        for lane in ("cuda13", "rocm7"):
            doc, page = pages(store, lane)
            assert {f["filename"] for f in doc["files"]} == set(re.findall(r">([^<>]+\.whl)</a>", page)), \
                f"the {lane} root's HTML and JSON pages disagree after round {r}"
            want = {f"0.{r2 + 1}.{w}+{lane}" for r2 in range(r + 1) for w in range(2)}
            assert want <= set(doc["versions"]), f"a release is missing from the {lane} root after round {r}"
    assert waited, "no writer ever waited for the other: the lock was not exercised"


KILLED = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from tests.release.standins import published
    from jatools import release_index
    real = release_index._copy_checked
    done = []
    def copy_then_die(src, target, want):
        if done:  # the second file: half of it written to its temporary, then killed
            tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
            tmp.write_bytes(src.read_bytes()[:100])
            os.kill(os.getpid(), signal.SIGKILL)
        real(src, target, want)
        done.append(target)
    release_index._copy_checked = copy_then_die
    release_index.add(Path(sys.argv[1]), sys.argv[2], published(*sorted(Path(sys.argv[3]).glob("*.whl"))))
""")


def test_faults_index_a_killed_write_leaves_nothing_the_next_run_does_not_clean(store, tmp_path):
    root, _ = store
    before = index_files(root)
    made = tmp_path / "next"
    for v in ("0.2.0+cuda13", "0.2.0+cuda13.full"):
        stand_in_wheel(made, v)
    script = tmp_path / "killed.py"
    script.write_text(KILLED)
    proc = run([sys.executable, str(script), str(root), "v0.2.0", str(made)],
               env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == -9, "the writer was not killed mid-write"
    left = sorted(p.name for p in (root / "v0.2.0").iterdir())
    assert any(n.startswith(release_index.JOURNAL) for n in left) and any(".tmp-" in n for n in left), left
    assert index_files(root) == before, "a killed add changed the index"
    logged = []
    release_index.write(root, log=logged.append)
    assert not any((root / "v0.2.0").iterdir()), "the killed add's files are still there"
    assert any("never recorded it" in line for line in logged) and any("no longer running" in line for line in logged)
    assert index_files(root) == before
    release_index.add(root, "v0.2.0", published(*sorted(made.glob("*.whl"))))  # and the add can be run again
    assert "0.2.0+cuda13.full" in pages(root, "cuda13")[0]["versions"]


def test_the_index_over_every_lane_an_earlier_writer_made_is_removed(store):
    root, _ = store
    old = root / release_index.SIMPLE / "jax-aiter"
    old.mkdir(parents=True)
    (old / "index.html").write_text("every lane's wheels")
    logged = []
    release_index.write(root, log=logged.append)
    assert not (root / release_index.SIMPLE).exists()
    assert any("took the highest lane label" in line for line in logged), logged
