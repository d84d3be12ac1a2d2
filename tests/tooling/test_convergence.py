"""Convergence gate against real temporary git repositories, through the module and `invoke convergence-check`."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jatools.ci import convergence

ROOT = Path(__file__).resolve().parents[2]
INVOKE = [sys.executable, "-m", "invoke", "--search-root", str(ROOT)]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository holding the real classification table and a few project-shaped files; tag `base`."""
    r = tmp_path / "repo"
    (r / "ci").mkdir(parents=True)
    shutil.copy(ROOT / convergence.TABLE, r / convergence.TABLE)
    for rel in ("csrc/kernels/rmsnorm/rmsnorm_cpu.h", "tests/ops/test_rmsnorm.py", "docs/ci.md",
                "jax_aiter/ops/rmsnorm.py"):
        (r / rel).parent.mkdir(parents=True, exist_ok=True)
        (r / rel).write_text(f"// {rel}\n")
    git(r.parent, "init", "-q", "-b", "main", str(r))
    git(r, "config", "user.email", "ci@example.invalid")
    git(r, "config", "user.name", "CI")
    git(r, "add", "-A")
    git(r, "commit", "-qm", "base")
    git(r, "tag", "base")
    return r


def commit(repo: Path, files: dict[str, str], message: str) -> None:
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", message)


def run_task(repo: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**__import__("os").environ, "JA_ROOT_DIR": str(repo)}
    return subprocess.run([*INVOKE, "convergence-check", *args], check=False, cwd=repo, capture_output=True,
                          text=True, env=env)


def test_test_only_change_passes(repo: Path) -> None:
    commit(repo, {"tests/ops/test_rmsnorm.py": "# more cases\n", "docs/ci.md": "# doc\n"}, "More tests")
    v = convergence.check(repo, "base")
    assert v.ok and v.triggering == []
    assert {c["class"] for c in v.changed} == {"exempt"}


def test_kernel_change_without_decision_fails_naming_files(repo: Path) -> None:
    commit(repo, {"csrc/kernels/rmsnorm/rmsnorm_cpu.h": "// faster\n", "tests/ops/test_rmsnorm.py": "#\n"}, "Faster")
    v = convergence.check(repo, "base")
    assert not v.ok
    assert [c["path"] for c in v.triggering] == ["csrc/kernels/rmsnorm/rmsnorm_cpu.h"]
    r = run_task(repo, "--base", "base")
    assert r.returncode == 1
    assert "numerics: csrc/kernels/rmsnorm/rmsnorm_cpu.h  (kernel code [csrc/kernels/*])" in r.stderr
    assert "git commit --amend --trailer 'Convergence: not-needed" in r.stderr
    assert "tests/ops/test_rmsnorm.py" not in r.stderr


@pytest.mark.parametrize("trailer,kind,detail", [
    ("Convergence: not-needed (error message only)", "not-needed", "error message only"),
    ("Convergence: run 1234567890", "run", "1234567890"),
])
def test_decision_trailer_passes(repo: Path, trailer: str, kind: str, detail: str, tmp_path: Path) -> None:
    commit(repo, {"jax_aiter/ops/rmsnorm.py": "# new eps check\n"}, f"Check eps\n\nBody text.\n\n{trailer}")
    out = tmp_path / "verdict.json"
    r = run_task(repo, "--base", "base", "--json-out", str(out))
    assert r.returncode == 0, r.stderr
    assert f"decision in {git(repo, 'rev-parse', 'HEAD')[:12]}: {kind} ({detail})" in r.stdout
    data = json.loads(out.read_text())
    assert data["ok"] and data["decisions"][0]["kind"] == kind and data["decisions"][0]["detail"] == detail


def test_decision_in_an_earlier_commit_of_the_range_counts(repo: Path) -> None:
    commit(repo, {"docs/ci.md": "x\n"}, "Docs\n\nConvergence: run 42")
    commit(repo, {"csrc/kernels/rmsnorm/rmsnorm_cpu.h": "// y\n"}, "Kernel")
    assert convergence.check(repo, "base").ok


@pytest.mark.parametrize("value", ["maybe", "not-needed ()", "not-needed", "run"])
def test_malformed_trailer_fails(repo: Path, value: str) -> None:
    commit(repo, {"csrc/kernels/rmsnorm/rmsnorm_cpu.h": "// z\n"}, f"Kernel\n\nConvergence: {value}")
    v = convergence.check(repo, "base")
    assert not v.ok and v.invalid and v.invalid[0]["value"] == value
    assert "malformed trailer" in convergence.report(v)


def test_unclassified_path_takes_the_default(repo: Path) -> None:
    commit(repo, {"newdir/thing.py": "x = 1\n"}, "New folder")
    v = convergence.check(repo, "base")
    assert [c["path"] for c in v.triggering] == ["newdir/thing.py"]
    assert "no rule in ci/convergence_paths.toml matches" in v.triggering[0]["why"]


def test_rename_counts_both_sides(repo: Path) -> None:
    git(repo, "mv", "csrc/kernels/rmsnorm/rmsnorm_cpu.h", "csrc/kernels/rmsnorm/rmsnorm_host.h")
    git(repo, "commit", "-qm", "Rename")
    paths = {c["path"] for c in convergence.check(repo, "base").triggering}
    assert paths == {"csrc/kernels/rmsnorm/rmsnorm_cpu.h", "csrc/kernels/rmsnorm/rmsnorm_host.h"}


def test_unknown_base_exits_2_with_fetch_hint(repo: Path) -> None:
    r = run_task(repo, "--base", "no-such-rev")
    assert r.returncode == 2
    assert "fetch-depth: 0" in r.stderr


def test_bad_table_is_an_error(repo: Path) -> None:
    (repo / convergence.TABLE).write_text('[[rule]]\npattern = "x"\nclass = "maybe"\nwhy = "?"\n')
    with pytest.raises(convergence.ConvergenceError, match="rule 1"):
        convergence.load_table(repo)


def test_every_tracked_file_of_this_checkout_is_classified_by_a_rule() -> None:
    """The default is a safety net; each folder of the project has an explicit rule."""
    table = convergence.load_table(ROOT)
    files = git(ROOT, "ls-files").splitlines()
    unclassified = [f for f in files if table.classify(f)[1].startswith("no rule")]
    assert unclassified == [], f"classify these in {convergence.TABLE}: {unclassified}"
    assert table.classify("csrc/kernels/rmsnorm/rmsnorm_cpu.h")[0] == "numerics"
    assert table.classify("tests/ops/tolerances.py")[0] == "numerics"
    assert table.classify("tests/ops/test_rmsnorm.py")[0] == "exempt"
    assert table.classify("jatools/native/toolchain.py")[0] == "numerics"
    assert table.classify("jatools/validate/cleanroom_env.py")[0] == "exempt"
