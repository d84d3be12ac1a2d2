"""Faults of the fetch: endless documents, full-body answers to a resume, redirects to another host with
substituted bytes, a destination that is a file, a full disk, bad timeouts. A real HTTP server on 127.0.0.1
(tests/tooling/jit_libs_support.FaultServer) and real jax-aiter-fetch-mha processes."""
from __future__ import annotations

import json
import os
import re
import resource
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jatools import release as release_job
from jax_aiter import op_table
from jax_aiter.download import manifest as mf
from jax_aiter.download import release as fetcher
from jax_aiter.download import transfer
from jax_aiter.integrity import diff_entries
from tests.tooling.jit_libs_support import (  # noqa: F401  (pytest fixtures)
    FAST_FETCH_ENV,
    MODULES,
    REPO,
    FaultServer,
    checkout_fixture,
    checkout_identity,
    fast_fetch_env_fixture,
    git,
    make_release,
    run_py,
    server_fixture,
    wheel_identity,
)

MHA = list(op_table.fetched_libraries(op_table.load()).values())  # what jax-aiter-fetch-mha fetches
SIZES = {**dict.fromkeys(MODULES.values(), 50_000), "libmha_fwd.so": 300_000, "libmha_bwd.so": 200_000}


@pytest.fixture
def release(checkout, server):
    ident = checkout_identity(checkout)
    return ident, make_release(server.root, ident, sizes=SIZES)


def _identity_file(tmp_path: Path, ident: dict, manifest: dict | None, base_url: str | None = None) -> Path:
    """The installed wheel's identity: its pins are the producer's libraries (what the wheel was built with)."""
    out = wheel_identity(ident, base_url)
    if manifest is not None:
        out["pins"] = mf.raw_entries(manifest["files"])
    path = tmp_path / "_build_identity.json"
    path.write_text(json.dumps(out))
    return path


def _fetch_mha(idf: Path, dest: Path, *args: str, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    return run_py(["-m", "jax_aiter.fetch_mha", "--identity", str(idf), "--dest", str(dest), "--quiet", *args],
                  env, **kw)


def test_a_full_wheel_has_nothing_to_fetch(release, server, tmp_path):
    """The +full wheel ships the attention libraries (their pins name its own bytes, with the wheel's RUNPATH), so
    jax-aiter-fetch-mha says so and asks the store nothing."""
    ident, manifest = release
    idf = _identity_file(tmp_path, ident, manifest, server.url)
    idf.write_text(json.dumps({**json.loads(idf.read_text()), "variant": "full"}))
    r = _fetch_mha(idf, tmp_path / "dest", "--skip-arch-check")
    assert r.returncode == 0 and "nothing to fetch: this is the +full wheel" in r.stdout, r.stdout + r.stderr
    assert not server.sent and not (tmp_path / "dest").exists()


def test_faults_endless_manifest_is_refused_while_streaming(release, server, tmp_path):
    """1 GiB behind the manifest's URL: refused after the cap, in a process that stays small."""
    ident, _ = release
    server.faults[mf.MANIFEST_NAME] = "huge"
    idf = _identity_file(tmp_path, ident, None, server.url)
    r = _fetch_mha(idf, tmp_path / "dest", "--skip-arch-check")
    assert r.returncode == 1, r.stderr
    assert f"more than {transfer.MAX_MANIFEST_BYTES} bytes; this is not a manifest" in r.stderr
    assert server.sent[mf.MANIFEST_NAME] < transfer.MAX_MANIFEST_BYTES + (64 << 20)  # not the whole 1 GiB
    server.faults[mf.MANIFEST_NAME] = "huge"
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(transfer.FetchError, match="this is not a manifest"):
        transfer.fetch_bytes(f"{server.url}/{mf.MANIFEST_NAME}", transfer.FetchOptions(retries=0), log=lambda m: None)
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < 2 * transfer.MAX_MANIFEST_BYTES / 2**20 + 64, grown_mb


def test_faults_resume_answered_with_the_whole_body_restarts_from_zero(release, server, tmp_path, fast_fetch_env):
    ident, manifest = release
    part = mf.select_files(manifest, ["libmha_fwd.so"])[0]["compressed"]["parts"][0]["name"]
    server.faults[part] = "truncate_once"
    server.full_206 = True
    dest = tmp_path / "dest"
    fetcher.fetch_release(server.url, ident, dest, MHA, opts=transfer.FetchOptions.from_env(), log=lambda m: None)
    ranged = [r for r in server.gets(part) if r[2]]
    assert ranged, "the second attempt must have asked to resume"
    assert diff_entries(dest, mf.raw_entries(mf.select_files(manifest, MHA))) == []


def test_faults_redirect_to_another_host_is_logged_and_pins_decide(release, server, tmp_path):
    """The front host redirects to a mirror: pinned bytes are installed (the log names the mirror); a mirror
    with substituted libraries and a manifest rehashed to match them is refused."""
    ident, manifest = release
    good_root, bad_root = tmp_path / "mirror", tmp_path / "evil"
    for root in (good_root, bad_root):
        root.mkdir()
    make_release(good_root, ident, sizes=SIZES)  # the same bytes, published again
    substituted = make_release(bad_root, ident, sizes=SIZES, seed=1)
    assert mf.raw_entries(substituted["files"]) != mf.raw_entries(manifest["files"])
    idf = _identity_file(tmp_path, ident, manifest, server.url)
    with FaultServer(good_root) as mirror:
        server.redirect_to = mirror.url.replace("127.0.0.1", "localhost")
        ok = _fetch_mha(idf, tmp_path / "ok", env={"JA_FETCH_BASE_URL": ""})
        ok_log = run_py(["-m", "jax_aiter.fetch_mha", "--identity", str(idf), "--dest", str(tmp_path / "ok"),
                         "--force"], {"JA_FETCH_BASE_URL": ""})
    assert ok.returncode == 0, ok.stderr
    assert ok_log.returncode == 0 and "redirected to host localhost:" in ok_log.stderr
    assert diff_entries(tmp_path / "ok", [p for p in json.loads(idf.read_text())["pins"] if p["name"] in MHA]) == []
    with FaultServer(bad_root) as evil:
        server.redirect_to = evil.url
        bad = _fetch_mha(idf, tmp_path / "bad", env={"JA_FETCH_BASE_URL": ""})
        parts = [r for r in evil.requests if not r[1].endswith(mf.MANIFEST_NAME)]
    assert bad.returncode == 1
    assert "offers libraries other than the pinned ones: libmha_bwd.so is" in bad.stderr, bad.stderr
    assert "but the pin is" in bad.stderr and not (tmp_path / "bad").exists() and not parts


def test_faults_pinned_install_refuses_an_unpinned_earlier_install(release, server, tmp_path, fast_fetch_env):
    """A folder holding a verified install of another (self-consistent) release is not 'present'."""
    ident, manifest = release
    other = tmp_path / "other"
    other.mkdir()
    substituted = make_release(other, ident, sizes=SIZES, seed=1)
    dest = tmp_path / "dest"
    fetcher.fetch_release(f"file://{other}", ident, dest, MHA, opts=transfer.FetchOptions.from_env(),
                          log=lambda m: None)
    pinned = {**ident, "pins": mf.raw_entries(manifest["files"])}
    r = fetcher.fetch_release(server.url, pinned, dest, MHA, opts=transfer.FetchOptions.from_env(), log=lambda m: None)
    assert r.status == "fetched"
    assert diff_entries(dest, mf.raw_entries(mf.select_files(manifest, MHA))) == []
    assert mf.raw_entries(substituted["files"]) != mf.raw_entries(manifest["files"])


def test_faults_destination_that_is_a_file_fails_before_downloading(release, server, tmp_path):
    ident, manifest = release
    dest = tmp_path / "dest"
    dest.write_text("not a folder\n")
    r = _fetch_mha(_identity_file(tmp_path, ident, manifest, server.url), dest)
    assert r.returncode == 1 and f"the destination {dest} is not a folder" in r.stderr, r.stderr
    assert server.requests == [] and dest.read_text() == "not a folder\n"


def _small_files():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, as a full disk does
    resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))


def test_faults_full_disk_names_the_file_and_keeps_nothing(release, server, tmp_path):
    ident, manifest = release
    dest = tmp_path / "dest"
    r = _fetch_mha(_identity_file(tmp_path, ident, manifest, server.url), dest, preexec_fn=_small_files)
    assert r.returncode == 1, r.stderr
    assert f"cannot write {tmp_path}/.dest.fetch-" in r.stderr and "File too large" in r.stderr
    assert "free disk space" in r.stderr
    assert not dest.exists() and not list(tmp_path.glob(".dest.fetch-*"))


@pytest.mark.parametrize("name, value", [("JA_FETCH_TIMEOUT_S", "0"), ("JA_FETCH_TIMEOUT_S", "inf"),
                                         ("JA_FETCH_TIMEOUT_S", "nan"), ("JA_FETCH_RETRIES", "-1"),
                                         ("JA_FETCH_RETRIES", "1e9"), ("JA_FETCH_LOCK_TIMEOUT_S", "inf")])
def test_faults_bad_fetch_settings_name_variable_value_and_range(tmp_path, name, value):
    idf = _identity_file(tmp_path, {"cache_id": "0" * 16, "version": "0.1.0"}, None, "http://127.0.0.1:9")
    r = _fetch_mha(idf, tmp_path / "dest", "--skip-arch-check", env={name: value})
    assert r.returncode == 1 and f"{name}={value!r} is not valid: give" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("value", ["nan", "inf", "0"])
def test_faults_bad_timeout_flag_is_refused(tmp_path, value):
    idf = _identity_file(tmp_path, {"cache_id": "0" * 16, "version": "0.1.0"}, None, "http://127.0.0.1:9")
    r = _fetch_mha(idf, tmp_path / "dest", "--timeout", value)
    assert r.returncode == 2 and f"--timeout={value!r} is not valid" in r.stderr


def _release_fetch(checkout, base_url: str, monkeypatch) -> subprocess.CompletedProcess:
    """The release's jit stage for `--fetch-jit base_url`, run as the release runs it (a real process)."""
    monkeypatch.setenv("JA_ROOT_DIR", str(checkout))
    jit = next(s for s in release_job.stages(release_job.Context(checkout, sys.executable, base_url, {}))
               if s.name == "jit")
    argv = list(jit.argv)  # the stage's command, known when the stages are made
    env = {**os.environ, **FAST_FETCH_ENV, "JA_ROOT_DIR": str(checkout), "JA_BACKEND": "cpu"}
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_faults_release_refuses_a_fetched_set_other_than_the_producers(checkout, server, tmp_path, monkeypatch):
    """The producer published its libraries where pyproject's jit_libs_base_url says (server); a mirror serves a
    self-consistent release of the same cache id with other bytes: the release's fetch refuses it before
    downloading. The same bytes from a mirror pass."""
    pyproject = checkout / "pyproject.toml"
    text = pyproject.read_text()
    pyproject.write_text(re.sub(r'(?m)^jit_libs_base_url = .*$', f'jit_libs_base_url = "{server.url}"', text))
    git(checkout, "commit", "-qam", "producer base URL")
    ident = checkout_identity(checkout)
    make_release(server.root, ident)
    for name, seed in (("evil", 1), ("mirror", 0)):
        (tmp_path / name).mkdir()
        make_release(tmp_path / name, ident, seed=seed)
    with FaultServer(tmp_path / "evil") as evil:
        bad = _release_fetch(checkout, evil.url, monkeypatch)
        downloaded = [r for r in evil.requests if not r[1].endswith("jit-libs-manifest.json")]
    assert bad.returncode == 1 and "offers libraries other than the pinned ones" in bad.stderr, bad.stderr
    assert f"--pins-from {server.url}" in " ".join(bad.args)
    assert not downloaded and not (checkout / "build/aiter_build").exists()
    with FaultServer(tmp_path / "mirror") as mirror:
        good = _release_fetch(checkout, mirror.url, monkeypatch)
    assert good.returncode == 0, good.stderr
    assert f"pinned to the {len(MODULES)} libraries the producer published at" in good.stdout + good.stderr


def test_faults_release_pins_its_fetch_to_the_producers_base_url():
    from jatools import config

    jit = next(s for s in release_job.stages(release_job.Context(REPO, sys.executable, "http://mirror.example", {}))
               if s.name == "jit")
    argv = list(jit.argv)  # the stage's command, known when the stages are made
    assert argv[argv.index("--base-url") + 1] == "http://mirror.example"
    assert argv[argv.index("--pins-from") + 1] == config.load().raw["jit_libs_base_url"]


def test_faults_fetch_without_pins_says_it_trusts_the_store(release, server, tmp_path, fast_fetch_env):
    """`invoke jit.fetch` without --pins-from (--force or not) accepts a self-consistent substituted release:
    that is what trusting the store means, and the fetch now says so instead of 'every file verified'."""
    ident, _ = release
    other = tmp_path / "substituted"
    other.mkdir()
    make_release(other, ident, sizes=SIZES, seed=1)
    said: list[str] = []
    r = fetcher.fetch_release(f"file://{other}", ident, tmp_path / "dest", MHA, force=True,
                            opts=transfer.FetchOptions.from_env(), log=said.append)
    assert r.status == "fetched"
    text = "\n".join(said)
    assert "no pins: the release's own manifest is all that vouches for these bytes" in text, text
    assert "every file verified against the release manifest (no pins)" in text
    assert "provenance not checked: file://" in text and "is not a GitHub release store" in text


def test_faults_resumed_part_never_shows_more_than_100_percent(release, server, tmp_path, fast_fetch_env):
    """A server that answers the resume with the whole part again: progress counts the new bytes only."""
    ident, manifest = release
    part = mf.select_files(manifest, ["libmha_fwd.so"])[0]["compressed"]["parts"][0]["name"]
    server.faults[part] = "truncate_once"
    server.full_206 = True
    said: list[str] = []
    fetcher.fetch_release(server.url, ident, tmp_path / "dest", MHA, opts=transfer.FetchOptions.from_env(),
                        log=said.append)
    shown = [int(m) for line in said for m in re.findall(rf"{re.escape(part)}: (\d+)%", line)]
    assert shown and max(shown) == 100, said


def test_faults_full_disk_gives_sizes_people_read(release, server, tmp_path):
    """A real 64 KiB tmpfs as the destination's disk: the refusal gives the sizes in kB, not '0.00 GB'."""
    ident, manifest = release
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], capture_output=True,
                             text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({mounted.stderr.strip() or 'not permitted'}); the full disk "
                    "needs one")
    try:
        r = _fetch_mha(_identity_file(tmp_path, ident, manifest, server.url), disk / "dest")
    finally:
        subprocess.run(["umount", str(disk)], check=False)
    need = sum(f["size"] for f in mf.select_files(manifest, MHA))
    assert r.returncode == 1, r.stderr
    assert f"not enough disk space in {disk}: {transfer.byte_text(need)} needed, " in r.stderr, r.stderr
    assert "0.00 GB" not in r.stderr and re.search(r"needed, \d+(\.\d+)? kB free", r.stderr), r.stderr


def test_faults_byte_text_reads_at_every_scale():
    assert [transfer.byte_text(n) for n in (0, 1, 999, 65_536, 500_000, 2_500_000_000)] == \
        ["0 bytes", "1 byte", "999 bytes", "65.5 kB", "500 kB", "2.5 GB"]


def _gh(tmp_path: Path, attested: str) -> dict[str, str]:
    """A stand-in GitHub CLI (GitHub's attestation service cannot be reached from a test): logged in, and it
    vouches for files whose content contains `attested` only."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    gh = bin_dir / "gh"
    gh.write_text("#!/bin/sh\n"
                  "[ \"$1\" = auth ] && exit 0\n"
                  f"if grep -q '{attested}' \"$3\"; then echo \"Verification succeeded for $3 ($5)\"; exit 0; fi\n"
                  "echo 'Error: no attestations found for subject' >&2; exit 1\n")
    gh.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


def test_faults_provenance_refuses_a_file_gh_finds_no_attestation_for(tmp_path, monkeypatch):
    """jax_aiter.download.provenance through the gh on PATH:
    a file from a GitHub store that gh cannot vouch for stops the
    fetch; without gh the note says provenance was not checked."""
    from jax_aiter.download import provenance

    good, bad = tmp_path / "libgood.so", tmp_path / "libbad.so"
    good.write_text("ATTESTED bytes")
    bad.write_text("other bytes")
    base = "https://github.com/ROCm/jax-aiter/releases/download"
    with_gh = _gh(tmp_path, "ATTESTED")["PATH"]
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert "the GitHub CLI (gh) is not installed" in provenance.verify([good], base)
    monkeypatch.setenv("PATH", with_gh)
    assert provenance.verify([good], base) == ("provenance: 1 libraries attested by ROCm/jax-aiter's workflows "
                                               "(gh attestation verify)")
    with pytest.raises(provenance.ProvenanceError, match=r"libbad.so: `gh attestation verify --repo ROCm/jax-aiter` "
                                                          r"refused it \(Error: no attestations found"):
        provenance.verify([good, bad], base)
    assert provenance.github_repo("https://github.com/a/b/releases/download/") == "a/b"
    assert provenance.github_repo("https://example.com/a/b/releases/download") is None


def test_faults_failed_fetch_leaves_nothing_beside_the_destination(release, server, tmp_path):
    """A failed fetch (full disk) leaves the destination's folder as it found it: no staging folder and no lock
    file (the lock is a flock on the folder itself)."""
    ident, manifest = release
    parent = tmp_path / "cache"
    parent.mkdir()
    idf = _identity_file(tmp_path, ident, manifest, server.url)
    r = _fetch_mha(idf, parent / "dest", preexec_fn=_small_files)
    assert r.returncode == 1 and "File too large" in r.stderr, r.stderr
    assert sorted(p.name for p in parent.iterdir()) == []


def test_faults_fetch_waits_for_a_held_folder_lock_then_names_it(release, server, tmp_path):
    """Another process holding the folder's lock: the fetch says it waits, then gives up after
    JA_FETCH_LOCK_TIMEOUT_S naming the folder and the fix; the destination is untouched."""
    import fcntl
    ident, manifest = release
    parent = tmp_path / "cache"
    parent.mkdir()
    fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        r = _fetch_mha(_identity_file(tmp_path, ident, manifest, server.url), parent / "dest",
                       env={"JA_FETCH_LOCK_TIMEOUT_S": "1"})
    finally:
        os.close(fd)
    assert r.returncode == 1, r.stderr
    assert f"another fetch into {parent} held its lock for more than 1 s; wait for it or stop it" in r.stderr
    assert sorted(p.name for p in parent.iterdir()) == []


def test_faults_fetch_refuses_a_symlinked_destination_folder(release, server, tmp_path):
    """The destination's folder is a symlink: the lock never follows it, the fetch stops naming it."""
    ident, manifest = release
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    r = _fetch_mha(_identity_file(tmp_path, ident, manifest, server.url), tmp_path / "link" / "dest")
    assert r.returncode == 1, r.stderr
    assert f"cannot lock {tmp_path / 'link'} for the fetch" in r.stderr and "not a symlink" in r.stderr
    assert list(real.iterdir()) == []


# --- bounded time: a server trickling bytes, a deadline; progress on every download ----------------------------

def test_faults_trickling_server_fails_in_bounded_time_with_progress(release, server, tmp_path):
    """A server sending the manifest at 1 byte/s: JA_FETCH_TIMEOUT_S bounded only the gap between bytes, so the fetch
    ran for days and printed nothing. Now the attempt is abandoned when it averages under JA_FETCH_MIN_RATE over
    the timeout, retried, and the fetch ends within seconds, having said how far the manifest got."""
    ident, _ = release
    server.faults[mf.MANIFEST_NAME] = "trickle"
    env = {"JA_FETCH_TIMEOUT_S": "2", "JA_FETCH_RETRIES": "1", "JA_FETCH_BACKOFF_S": "0.1", "CI": "1"}
    start = time.monotonic()
    r = run_py(["-m", "jax_aiter.fetch_mha", "--identity", str(_identity_file(tmp_path, ident, None, server.url)),
                "--dest", str(tmp_path / "dest"), "--skip-arch-check"], env)
    took = time.monotonic() - start
    assert r.returncode == 1, r.stderr
    assert took < 20, took
    assert f"fetch: reading the manifest {server.url}/" in r.stderr, r.stderr
    assert re.search(r"jit-libs-manifest\.json: \d+ bytes in \d+ s \(\d+ bytes?/s\) from 127\.0\.0\.1:", r.stderr), \
        r.stderr
    # the window is JA_FETCH_TIMEOUT_S=2 or longer: a loaded machine reads the clock late (3.0 s was seen), so no figure
    assert re.search(r"too slow: \d+ bytes in \d+\.\d s \(\d+ bytes?/s\), "
                     r"under the 10 kB/s JA_FETCH_MIN_RATE asks for; "
                     r"gave up after 2 attempts", r.stderr), r.stderr
    assert not (tmp_path / "dest").exists()


def test_faults_deadline_stops_a_fetch_that_never_stalls(release, server, tmp_path):
    """No minimum rate (JA_FETCH_MIN_RATE=0): the whole fetch still stops at JA_FETCH_DEADLINE_S, naming it."""
    ident, manifest = release
    part = mf.select_files(manifest, ["libmha_bwd.so"])[0]["compressed"]["parts"][0]["name"]
    server.faults[part] = "trickle"
    server.trickle_pause = 0.2
    env = {"JA_FETCH_TIMEOUT_S": "2", "JA_FETCH_MIN_RATE": "0", "JA_FETCH_DEADLINE_S": "3", "CI": "1"}
    start = time.monotonic()
    r = _fetch_mha(_identity_file(tmp_path, ident, manifest, server.url), tmp_path / "dest", env=env)
    took = time.monotonic() - start
    assert r.returncode == 1 and took < 15, (took, r.stderr)
    assert f"{part}: the fetch did not finish within JA_FETCH_DEADLINE_S=3 s (" in r.stderr, r.stderr
    assert "allow more time with JA_FETCH_DEADLINE_S=<seconds>" in r.stderr
    assert not (tmp_path / "dest").exists() and not list(tmp_path.glob(".dest.fetch-*"))


def test_faults_gzip_encoded_answers_are_decoded_not_called_truncated(release, server, tmp_path, fast_fetch_env):
    """A server that gzips what it sends though asked not to (Content-Encoding: gzip): the manifest and a part are
    decoded and verified as usual (the compressed length was reported as 'truncated')."""
    ident, manifest = release
    part = mf.select_files(manifest, ["libmha_fwd.so"])[0]["compressed"]["parts"][0]["name"]
    server.faults[mf.MANIFEST_NAME] = "gzip"
    server.faults[part] = "gzip"
    dest = tmp_path / "dest"
    fetcher.fetch_release(server.url, ident, dest, MHA, opts=transfer.FetchOptions.from_env(), log=lambda m: None)
    assert diff_entries(dest, mf.raw_entries(mf.select_files(manifest, MHA))) == []


def test_faults_failure_after_a_redirect_names_the_host_that_failed(release, server, tmp_path, fast_fetch_env):
    """The front host redirects to a mirror whose part is cut short every time: the error names the mirror's host,
    where it failed (it named only the first URL)."""
    ident, manifest = release
    mirror_root = tmp_path / "mirror"
    mirror_root.mkdir()
    make_release(mirror_root, ident, sizes=SIZES)
    part = mf.select_files(manifest, ["libmha_fwd.so"])[0]["compressed"]["parts"][0]["name"]
    with FaultServer(mirror_root) as mirror:
        mirror.faults[part] = "truncate"
        server.redirect_to = mirror.url.replace("127.0.0.1", "localhost")
        with pytest.raises(transfer.FetchError) as e:
            fetcher.fetch_release(server.url, ident, tmp_path / "dest", MHA, opts=transfer.FetchOptions.from_env(),
                                log=lambda m: None)
    host = mirror.url.replace("127.0.0.1", "localhost").split("//", 1)[1]
    assert f"(at {host}, where {server.url.split('//', 1)[1]} redirected: " in str(e.value), e.value
    assert "gave up after 3 attempts" in str(e.value)


# --- what the answer was: cut short in transit, a replaced file, an HTML page, a redirect that led nowhere --------

def _part(manifest: dict, lib: str = "libmha_fwd.so") -> str:
    return mf.select_files(manifest, [lib])[0]["compressed"]["parts"][0]["name"]


def _fetch_error(base: str, ident: dict, dest: Path) -> str:
    with pytest.raises(transfer.FetchError) as e:
        fetcher.fetch_release(base, ident, dest, MHA, opts=transfer.FetchOptions.from_env(), log=lambda m: None)
    assert not dest.exists()
    return str(e.value)


def test_faults_a_cut_short_answer_a_replaced_file_and_an_html_page_are_told_apart(release, server, tmp_path,
                                                                                  fast_fetch_env):
    """A transfer cut short, a part replaced on the server by a shorter file, and a sign-in page where the part
    should be were all "truncated ... check the network, or allow more with JA_FETCH_TIMEOUT_S". Now: the first is
    retried and blames the network; the replaced file is named as replaced at once (no retry mends it); the HTML
    page is named as one, with the base URL to check."""
    ident, manifest = release
    part = _part(manifest)
    server.faults[part] = "truncate"
    cut = _fetch_error(server.url, ident, tmp_path / "cut")
    assert "connection closed early after" in cut and "gave up after 3 attempts. Check the network" in cut, cut
    del server.faults[part]

    stored = next(server.root.rglob(part))
    whole = stored.read_bytes()
    stored.write_bytes(whole[: len(whole) // 2])
    server.requests.clear()
    swapped = _fetch_error(server.url, ident, tmp_path / "swapped")
    assert f"{part}: the server's copy is {len(whole) // 2} bytes, but the manifest says {len(whole)}: the asset at " \
           in swapped and "was replaced (or cut short where it is stored), not cut short in transit" in swapped
    assert "Check the network" not in swapped and "republish the release" in swapped, swapped
    assert len(server.gets(part)) == 1, "a replaced file was asked for again"
    stored.write_bytes(whole)

    server.faults[part] = "html"
    page = _fetch_error(server.url, ident, tmp_path / "page")
    assert "the server answered with an HTML page (Content-Type: text/html), not the release file" in page, page
    assert "check the base URL (JA_FETCH_BASE_URL, --base-url)" in page and "Check the network" not in page, page


def test_faults_a_folder_store_tells_a_replaced_file_and_an_html_page_apart(release, server, tmp_path,
                                                                           fast_fetch_env):
    """The same from a local folder store (a base URL that is a folder): a shorter part was 'truncated ... check the
    network'; a page saved in its place likewise."""
    ident, manifest = release
    part = _part(manifest)
    stored = next(server.root.rglob(part))
    whole = stored.read_bytes()
    stored.write_bytes(whole[: len(whole) - 1000])
    swapped = _fetch_error(str(server.root), ident, tmp_path / "swapped")
    assert f"the server's copy is {len(whole) - 1000} bytes, but the manifest says {len(whole)}" in swapped, swapped
    assert "was replaced" in swapped and "network" not in swapped, swapped
    stored.write_bytes(b"  <html><body>The page you asked for moved</body></html>\n")
    page = _fetch_error(str(server.root), ident, tmp_path / "page")
    assert "answered with an HTML page (its first bytes are HTML), not the release file" in page, page


def test_faults_a_redirect_to_a_port_nobody_listens_on_names_where_it_went(release, server, tmp_path,
                                                                          fast_fetch_env):
    """The server redirects to another port on the same host, where nothing listens: the error named only the first
    URL ("cannot connect (Connection refused)"). Now it names the host and port the redirect went to."""
    ident, _ = release
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends: nothing listens there
    server.redirect_to = f"http://127.0.0.1:{port}"
    said = _fetch_error(server.url, ident, tmp_path / "dest")
    front = server.url.split("//", 1)[1]
    assert "cannot connect (" in said and f"(at 127.0.0.1:{port}, where {front} redirected: " \
           f"http://127.0.0.1:{port}/" in said, said
    assert "Check the network and the server it was redirected to" in said, said


# --- where the fetch installs: a home folder, folders nobody else may write --------------------------------------

def test_faults_empty_home_is_refused_not_the_filesystem_root(release, server, tmp_path):
    """HOME='' and no XDG_CACHE_HOME: the fetch installed into /.cache (Path.home() of an empty HOME is /). Now it
    says there is no cache folder and how to give one, and writes nothing."""
    ident, manifest = release
    had = os.path.exists("/.cache/jax-aiter")
    r = run_py(["-m", "jax_aiter.fetch_mha", "--identity", str(_identity_file(tmp_path, ident, manifest, server.url)),
                "--quiet"], {"HOME": "", "XDG_CACHE_HOME": "", "JAX_AITER_LIB_DIR": ""})
    assert r.returncode == 1, r.stderr
    assert "no cache folder for fetched libraries: HOME='' is not a home folder and XDG_CACHE_HOME is unset" in r.stderr
    assert "set XDG_CACHE_HOME (or JAX_AITER_LIB_DIR) to a folder of your own, or pass --dest" in r.stderr
    assert os.path.exists("/.cache/jax-aiter") == had and server.requests == []


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_faults_fetch_under_umask_000_makes_no_folder_others_may_write(release, server, tmp_path):
    """umask 000: the fetch made a mode-777 library folder (and parents), which the loader must then refuse. Every
    folder it makes is 755 and every file 755 (libraries) or 644 (the manifest copy), whatever the umask."""
    ident, manifest = release
    dest = tmp_path / "cache" / "jax-aiter" / "dest"
    r = _fetch_mha(_identity_file(tmp_path, ident, manifest, server.url), dest, preexec_fn=lambda: os.umask(0))
    assert r.returncode == 0, r.stderr
    assert [_mode(p) for p in (tmp_path / "cache", dest.parent, dest)] == [0o755] * 3
    assert {p.name: _mode(p) for p in dest.iterdir()} == {**dict.fromkeys(MHA, 0o755), mf.MANIFEST_NAME: 0o644}


@pytest.mark.parametrize("where", ["dest", "parent"])
def test_faults_fetch_refuses_a_folder_others_may_write(release, server, tmp_path, where):
    """`--force` into a mode-777 folder (or beside one in a mode-777 parent) is refused before downloading, naming
    the folder, its mode and the fix; a sticky parent such as /tmp is not a risk (others cannot rename what is
    ours in it) and is used."""
    ident, manifest = release
    parent = tmp_path / "shared"
    dest = parent / "dest"
    dest.mkdir(parents=True)
    (dest if where == "dest" else parent).chmod(0o777)
    idf = _identity_file(tmp_path, ident, manifest, server.url)
    r = _fetch_mha(idf, dest, "--force")
    shown = dest if where == "dest" else parent
    assert r.returncode == 1, r.stderr
    assert (f"refusing to install libraries {'into' if where == 'dest' else 'beside'} {shown}: group and others may "
            f"write to it (mode 777)") in r.stderr and f"(chmod go-w {shown})" in r.stderr, r.stderr
    assert [q for q in server.requests if not q[1].endswith(mf.MANIFEST_NAME)] == [] and list(dest.iterdir()) == []
    if where == "parent":
        parent.chmod(0o1777)
        assert _fetch_mha(idf, dest, "--force").returncode == 0
