"""ci/gpu/*.sh propagate a failing step (issue 40: three of them exited 0 when their test step failed).

The GPU host's tools are stood in for: nvidia-smi and compute-sanitizer (hardware we lack), and the interpreter
the scripts drive (PYTHON), whose build step passes and whose test steps exit 7, as a GPU test run that fails
does. The scripts themselves run for real under bash."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STANDIN_PYTHON = """#!/usr/bin/env bash
# the build (-m jatools.native.build) and the version probe (-c) pass; every test step fails with 7
case "$*" in *jatools.native.build*|-c*) exit 0;; *) echo "stand-in: tests failed"; exit "${FAIL_CODE:-7}";; esac
"""
STANDINS = {
    "nvidia-smi": "#!/usr/bin/env bash\necho 'GPU 0: stand-in'\n",
    # compute-sanitizer [--opt value]... CMD...: runs CMD (the options all take a value)
    "compute-sanitizer": "#!/usr/bin/env bash\nwhile [ \"${1#--}\" != \"$1\" ]; do shift 2; done\nexec \"$@\"\n",
}


def _run(script: str, tmp_path: Path, fail_code: int) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in {**STANDINS, "python-standin": STANDIN_PYTHON}.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": str(bin_dir / "python-standin"),
           "FAIL_CODE": str(fail_code)}
    return subprocess.run(["bash", f"ci/gpu/{script}", str(tmp_path / "out")], check=False, cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("script", ["h200_check.sh", "h200x2_check.sh", "h200x2_tests.sh", "sanitize.sh"])
def test_a_failing_test_step_fails_the_script(script, tmp_path):
    r = _run(script, tmp_path, fail_code=7)
    assert r.returncode != 0, f"{script} exited 0 although its test steps failed:\n{r.stdout[-2000:]}"
    if script == "sanitize.sh":
        assert "FAILED (exit 7)" in r.stdout  # the step's own status, not that of the assignment before it
    elif script != "h200_check.sh":
        assert "FAILED steps:" in r.stdout and "(exit 7)" in r.stdout


@pytest.mark.parametrize("script", ["h200_check.sh", "h200x2_check.sh", "h200x2_tests.sh", "sanitize.sh"])
def test_passing_steps_pass_the_script(script, tmp_path):
    r = _run(script, tmp_path, fail_code=0)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
