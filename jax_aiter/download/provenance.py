"""Build provenance of fetched libraries: `gh attestation verify` where the GitHub CLI is present.

The JIT-library workflow attests every library it publishes (actions/attest-build-provenance: a Sigstore-signed
statement that this repository's workflow built a file with that sha256). A fetch from a GitHub release store asks
`gh` to verify each library before installing it, when gh is installed and logged in; otherwise it says that it did
not. What this adds to the pins and hashes: docs/security.md.

Runs at runtime, so it must not import JAX.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

GITHUB_RELEASES = re.compile(r"https://github\.com/([A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+)/releases/download/?")
TIMEOUT_S = 120


class ProvenanceError(RuntimeError):
    """gh found no valid attestation for a file from this repository."""


def github_repo(base_url: str) -> str | None:
    """OWNER/REPO of a GitHub release store's base URL, else None."""
    m = GITHUB_RELEASES.fullmatch(base_url.strip())
    return m.group(1) if m else None


def _gh(gh: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([gh, *args], capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
                          stdin=subprocess.DEVNULL)


def verify(paths: list[Path], base_url: str) -> str:
    """Verify each file's attestation with gh; a note saying what was checked (or why nothing was).
    ProvenanceError names the file and what gh said when a file has none from the store's repository."""
    repo = github_repo(base_url)
    if repo is None:
        return f"provenance not checked: {base_url} is not a GitHub release store (attestations live on GitHub)"
    gh = shutil.which("gh")
    if gh is None:
        return ("provenance not checked: the GitHub CLI (gh) is not installed; with it, each library's build "
                "attestation is verified (docs/security.md)")
    try:
        if _gh(gh, "auth", "status").returncode != 0:
            return "provenance not checked: gh is not logged in (`gh auth login` enables the check)"
        for path in paths:
            out = _gh(gh, "attestation", "verify", str(path), "--repo", repo)
            if out.returncode != 0:
                said = (out.stderr.strip() or out.stdout.strip() or f"exit {out.returncode}").splitlines()[-1]
                raise ProvenanceError(f"{path.name}: `gh attestation verify --repo {repo}` refused it ({said}): no "
                                      f"build attestation from {repo} names these bytes")
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ProvenanceError(f"`{gh} attestation verify` could not run: {e}") from None
    return f"provenance: {len(paths)} libraries attested by {repo}'s workflows (gh attestation verify)"
