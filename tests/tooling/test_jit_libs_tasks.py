"""The invoke tasks (jit.publish/fetch/verify/decide, `invoke verify`): thin wiring, Exit on failure.

`jit.publish --to gh` shells out to the GitHub CLI through the invoke context,
so invoke's MockContext checks the exact command lines without calling GitHub.
"""
from __future__ import annotations

import json
import re

import pytest
from invoke import Exit, MockContext, Result

from jax_aiter.download import manifest as mf
from jax_aiter.download import reuse_gate
from tests.tooling.jit_libs_support import (  # noqa: F401  (pytest fixtures)
    MODULES,
    REPO,
    checkout_fixture,
    checkout_identity,
    make_release,
    server_fixture,
    tasks_fixture,
    write_build,
)


def test_collection_has_the_contract_names(tasks):
    names = set(tasks.ns.task_names)
    assert {"verify", "jit.fetch", "jit.publish", "jit.decide"} <= names and "jit.verify" not in names


# The repository's release-download URL (JA_FETCH_BASE_URL on GitHub, where the producer's publish job sends
# `--to`) is its releases: the same gh commands as gh:OWNER/REPO.
@pytest.mark.parametrize("to", ["gh:ROCm/jax-aiter", "https://github.com/ROCm/jax-aiter/releases/download"])
def test_publish_to_a_github_release_runs_these_gh_commands_in_this_order(tasks, checkout, to):
    ident = checkout_identity(checkout)
    write_build(checkout / "build/aiter_build", ident)
    tag = reuse_gate.release_tag(ident["cache_id"])
    c = MockContext(run={
        re.compile(r"^gh release download "): Result(exited=1, stderr=f"release not found: {tag}"),
        re.compile(r"^gh release view "): [Result(exited=1, stderr="release not found"), Result(exited=0)],
        re.compile(r"^gh release create "): Result(exited=0),
        re.compile(r"^gh release upload "): [Result(exited=0), Result(exited=0)],
    }, repeat=False)
    tasks.jit_publish(c, to=to, level="3", window_log="20")
    cmds = [call.args[0] for call in c.run.call_args_list]
    stage = checkout / "build/jit-libs-publish" / tag
    assert cmds[0] == f"gh release download {tag} --pattern {mf.MANIFEST_NAME} --output - --repo ROCm/jax-aiter"
    assert cmds[2].startswith(f"gh release create {tag} --title 'JIT libraries {tag}' --notes ")
    assert cmds[3] == (f"gh release upload {tag} "
                       + " ".join(str(stage / f"{lib}.zst") for lib in sorted(MODULES.values()))
                       + " --clobber --repo ROCm/jax-aiter")
    assert cmds[-1] == f"gh release upload {tag} {stage / mf.MANIFEST_NAME} --clobber --repo ROCm/jax-aiter"
    assert len(cmds) == 6


def test_publish_targets_by_name():
    """A GitHub release-download URL is that repository's releases; any other URL is an HTTP store that takes PUT
    (the store ci_local serves), anything else a folder."""
    from jatools.jitlibs import publish

    t = publish.target_for("https://github.com/org/repo/releases/download/", "jit-libs-x")
    assert isinstance(t, publish.GhReleaseTarget) and t.repo == "org/repo"
    t = publish.target_for("http://127.0.0.1:8000/releases", "jit-libs-x")
    assert isinstance(t, publish.HttpTarget) and t.url == "http://127.0.0.1:8000/releases/jit-libs-x"
    assert isinstance(publish.target_for("build/jit-store", "jit-libs-x"), publish.FolderTarget)


def test_gh_failure_becomes_exit_with_the_command_and_reason(tasks, checkout):
    write_build(checkout / "build/aiter_build", checkout_identity(checkout))
    c = MockContext(run={re.compile(r"^gh release download "): Result(exited=4, stderr="HTTP 401: Bad credentials")})
    with pytest.raises(Exit) as exc:
        tasks.jit_publish(c, to="gh", level="3", window_log="20")
    assert exc.value.code == 1
    assert "gh release download" in exc.value.message and "Bad credentials" in exc.value.message
    assert "gh auth status" in exc.value.message


def test_verify_alias_passes_and_fails_with_exit_naming_the_file(tasks, checkout, capsys):
    jit = checkout / "build/aiter_build"
    write_build(jit, checkout_identity(checkout))
    tasks.ns["verify"](MockContext())
    assert f"{len(MODULES)} file(s)" in capsys.readouterr().out
    (jit / "libmha_fwd.so").write_bytes(b"\0" * 200_000)
    with pytest.raises(Exit) as exc:
        tasks.ns["verify"](MockContext())
    assert exc.value.code == 1 and "libmha_fwd.so: sha256" in exc.value.message


def test_fetch_and_decide_tasks_reach_the_release(tasks, checkout, server, monkeypatch):
    ident = checkout_identity(checkout)
    with pytest.raises(Exit) as exc:
        tasks.jit_fetch(MockContext(), base_url=server.url)
    assert exc.value.code == 1 and f"no release jit-libs-{ident['cache_id']}" in exc.value.message
    make_release(server.root, ident)
    tasks.jit_fetch(MockContext(), base_url=server.url)
    assert (checkout / "build/aiter_build/libmha_bwd.so").is_file()
    out = checkout / "gh_output"
    monkeypatch.setenv("GITHUB_OUTPUT", str(out))
    tasks.jit_decide(MockContext(), base_url=server.url)
    assert out.read_text().startswith("decision=reuse\nrebuild=false\n")


# --- issue 27: the expected set comes from the op table; bad records are named -------------------------

@pytest.fixture
def jit(checkout):
    folder = checkout / "build/aiter_build"
    write_build(folder, checkout_identity(checkout))
    return folder


def _verify_fails(tasks) -> str:
    with pytest.raises(Exit) as exc:
        tasks.ns["verify"](MockContext())
    assert exc.value.code == 1
    return exc.value.message


def _edit_record(jit, change) -> None:
    path = jit / "build_record.json"
    record = json.loads(path.read_text())
    change(record)
    path.write_text(json.dumps(record))


def test_faults_verify_record_listing_nothing_fails(tasks, jit):
    tasks.ns["verify"](MockContext())  # the good state passes
    _edit_record(jit, lambda r: r.update(files=[]))
    msg = _verify_fails(tasks)
    for lib in MODULES.values():
        assert f"{lib}: the op table names it, but {jit / 'build_record.json'} does not list it" in msg


def test_faults_verify_dropped_and_tampered_library_fails(tasks, jit):
    _edit_record(jit, lambda r: r.update(files=[f for f in r["files"] if f["name"] != "libmha_fwd.so"]))
    (jit / "libmha_fwd.so").write_bytes(b"\0" * 1000)
    msg = _verify_fails(tasks)
    assert "libmha_fwd.so: the op table names it" in msg
    assert f"{jit / 'libmha_fwd.so'}: a library in the folder that" not in msg  # named once, as the op table's


def test_faults_verify_unlisted_and_extra_libraries_fail(tasks, jit):
    (jit / "libstray.so").write_bytes(b"stray")
    _edit_record(jit, lambda r: r["files"].append({"name": "libextra.so", "size": 1, "sha256": "0" * 64}))
    msg = _verify_fails(tasks)
    assert f"{jit / 'libstray.so'}: a library in the folder that" in msg and "does not list" in msg
    assert "libextra.so: listed in" in msg and "the op table" in msg


@pytest.mark.parametrize("text, says", [("{not json", "is not valid JSON"), ('{"modules": {}}', "has no `files` list"),
                                        ('{"files": [{"name": "x"}]}',
                                         "files[0] is not a unique {name, size, sha256}")])
def test_faults_verify_bad_record_names_the_file(tasks, jit, text, says):
    (jit / "build_record.json").write_text(text)
    msg = _verify_fails(tasks)
    assert f"{jit / 'build_record.json'}" in msg and says in msg and "Traceback" not in msg
