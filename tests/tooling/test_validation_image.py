"""The validation image tag is the recipe hash of Dockerfile.lite, through the module and the shell wrapper."""
from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

from jatools.validate import cleanroom_env as vi

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def scratch_root(tmp_path: Path) -> Path:
    """A copy of the pieces the module reads (pyproject + Dockerfile), so edits cannot touch the checkout."""
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / vi.DOCKERFILE.parent).mkdir(parents=True)
    shutil.copy(ROOT / vi.DOCKERFILE, tmp_path / vi.DOCKERFILE)
    return tmp_path


def test_tag_is_first_12_hex_of_sha256() -> None:
    digest = hashlib.sha256((ROOT / vi.DOCKERFILE).read_bytes()).hexdigest()
    assert vi.image_tag(root=ROOT) == "v" + digest[:12]
    assert vi.image_tag("rocm", root=ROOT) == f"v{digest[:12]}-rocm"


def test_editing_the_recipe_changes_the_tag(scratch_root: Path) -> None:
    before = vi.image_tag("cpu", root=scratch_root)
    path = scratch_root / vi.DOCKERFILE
    path.write_text(path.read_text() + "\n# a comment is still a recipe change\n")
    assert vi.image_tag("cpu", root=scratch_root) != before


def test_variants_come_from_the_dockerfile_stages(scratch_root: Path) -> None:
    assert vi.variants(scratch_root) == ("cpu", "rocm", "cuda")
    path = scratch_root / vi.DOCKERFILE
    path.write_text(path.read_text().replace("AS base-cuda", "AS base-xpu"))
    assert vi.variants(scratch_root) == ("cpu", "rocm", "xpu")
    with pytest.raises(vi.CleanRoomError, match="unknown validation image variant 'cuda'.*cpu, rocm, xpu"):
        vi.image_tag("cuda", root=scratch_root)


def test_missing_dockerfile_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(vi.CleanRoomError, match="git checkout -- docker/validation/Dockerfile.lite"):
        vi.image_tag(root=tmp_path)


def test_repository_default_and_override() -> None:
    assert vi.image_ref("rocm", ROOT, env={}).startswith("ghcr.io/rocm/jax-aiter-validate:v")
    assert vi.image_ref("cpu", ROOT, env={"JA_VALIDATION_IMAGE": "localhost:5000/v"}).startswith("localhost:5000/v:v")


def test_build_command_and_the_publish_dry_run(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.delenv("JA_VALIDATION_IMAGE", raising=False)
    ref = vi.image_ref("rocm", ROOT, env={})
    cmd = vi.build_command("rocm", ROOT, env={})
    assert cmd[:4] == ["docker", "build", "--build-arg", "VARIANT=rocm"]
    assert cmd[cmd.index("--tag") + 1] == ref
    assert cmd[cmd.index("--file") + 1] == str(ROOT / vi.DOCKERFILE)
    assert vi.publish("rocm", push=True, dry_run=True, root=ROOT) == "dry-run"
    out = capsys.readouterr().out
    assert "image.publish: [build] $ docker build --build-arg VARIANT=rocm" in out
    assert f"image.publish: [push] $ docker push {ref}" in out


def registry(monkeypatch: pytest.MonkeyPatch, codes: dict[str, list[int]]) -> list[list[str]]:
    """Stands in for docker and the registry: each command's exit code from `codes` (by docker verb), in order."""
    calls: list[list[str]] = []

    def run(argv, **kw):
        calls.append(list(argv))
        return subprocess.CompletedProcess(argv, codes[argv[1]].pop(0))

    monkeypatch.delenv("JA_VALIDATION_IMAGE", raising=False)
    monkeypatch.setattr(subprocess, "run", run)
    return calls


def test_publish_skips_a_tag_the_registry_has(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = registry(monkeypatch, {"manifest": [0]})  # the manifest exists
    assert vi.publish("cpu", push=True, root=ROOT, log=lambda m: None) == "present"
    assert calls == [["docker", "manifest", "inspect", vi.image_ref("cpu", ROOT)]]


def test_publish_builds_and_pushes_once_and_a_failed_push_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """No retry loop of ours around docker push (docker retries each layer itself): one layer of retries."""
    results = {"manifest": [1, 1], "build": [0, 0], "push": [0, 1]}  # absent, built, pushed; then the push fails
    registry(monkeypatch, results)
    assert vi.publish("cpu", push=True, root=ROOT, log=lambda m: None) == "published"
    with pytest.raises(vi.CleanRoomError, match=r"(?s)step push failed \(exit 1\): docker push .*docker login ghcr.io"):
        vi.publish("cpu", push=True, root=ROOT, log=lambda m: None)
    assert results == {"manifest": [], "build": [], "push": []}


def test_shell_wrapper_prints_the_same_tag(tmp_path: Path) -> None:
    out = subprocess.run(["bash", str(ROOT / "ci/validation_image_id.sh"), "--variant", "rocm"], cwd=tmp_path,
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == vi.image_tag("rocm", root=ROOT)
    bad = subprocess.run(["bash", str(ROOT / "ci/validation_image_id.sh"), "--variant", "nope"],
                         check=False, capture_output=True, text=True)
    assert bad.returncode == 2 and "defines cpu, rocm, cuda" in bad.stderr
