"""The invoke tasks (jit.publish/fetch/verify/decide, `invoke verify`): thin wiring, Exit on failure.

`jit.publish --to gh` shells out to the GitHub CLI through the invoke context,
so invoke's MockContext checks the exact command lines without calling GitHub.
"""
from __future__ import annotations

import importlib.util
import re

import pytest
from invoke import Exit, MockContext, Result

from jax_aiter import manifest as mf
from jax_aiter import reuse_gate
from tests.tooling.jit_libs_support import (  # noqa: F401  (pytest fixtures)
    MODULES,
    REPO,
    checkout_fixture,
    checkout_identity,
    make_release,
    server_fixture,
    write_build,
)


@pytest.fixture
def tasks(checkout, monkeypatch):
    monkeypatch.setenv("JA_ROOT_DIR", str(checkout))
    monkeypatch.setenv("JA_BACKEND", "cpu")
    spec = importlib.util.spec_from_file_location("ja_tasks_under_test", REPO / "tasks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_collection_has_the_contract_names(tasks):
    names = set(tasks.ns.task_names)
    assert {"verify", "jit.fetch", "jit.publish", "jit.verify", "jit.decide"} <= names


def test_publish_to_a_github_release_runs_these_gh_commands_in_this_order(tasks, checkout):
    ident = checkout_identity(checkout)
    write_build(checkout / "build/aiter_build", ident)
    tag = reuse_gate.release_tag(ident["cache_id"])
    c = MockContext(run={
        re.compile(r"^gh release download "): Result(exited=1, stderr=f"release not found: {tag}"),
        re.compile(r"^gh release view "): [Result(exited=1, stderr="release not found"), Result(exited=0)],
        re.compile(r"^gh release create "): Result(exited=0),
        re.compile(r"^gh release upload "): [Result(exited=0), Result(exited=0)],
    }, repeat=False)
    tasks.jit_publish(c, to="gh:ROCm/jax-aiter", level="3", window_log="20")
    cmds = [call.args[0] for call in c.run.call_args_list]
    stage = checkout / "build/jit-libs-publish" / tag
    assert cmds[0] == f"gh release download {tag} --pattern {mf.MANIFEST_NAME} --output - --repo ROCm/jax-aiter"
    assert cmds[2].startswith(f"gh release create {tag} --title 'JIT libraries {tag}' --notes ")
    assert cmds[3] == (f"gh release upload {tag} " + " ".join(str(stage / f"{lib}.zst") for lib in sorted(MODULES.values()))
                       + " --clobber --repo ROCm/jax-aiter")
    assert cmds[-1] == f"gh release upload {tag} {stage / mf.MANIFEST_NAME} --clobber --repo ROCm/jax-aiter"
    assert len(cmds) == 6


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
    assert "3 file(s)" in capsys.readouterr().out
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
