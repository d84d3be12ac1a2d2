"""The README's example runs as written, on 4 devices (the CPU's, forced, in the multigpu tier), its claims
included: each claim it makes about a result is an `assert` line, so a claim that is false fails here (issue 84:
the comment `ys.sharding == xs.sharding` evaluated to False, P('data', None) against P('data',))."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import jax
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _example() -> str:
    """The README's first Python block."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL)
    assert blocks, "README.md has no ```python block"
    return blocks[0]


@pytest.mark.multigpu(devices=4)
def test_the_readme_example_runs_and_its_claims_hold():
    code = _example()
    assert "assert ys.sharding.is_equivalent_to(xs.sharding, ys.ndim)" in code, "the sharding claim is no assert"
    assert not re.search(r"#.*\bsharding ==", code), "a claim left as a comment is not checked: write it as an assert"
    # the same devices in the fresh interpreter as here (the tier's XLA_FLAGS are inherited)
    check = (f"\nassert jax.device_count() == {jax.device_count()}, jax.device_count()\n"
             "print('readme ran', flush=True)\n")
    proc = subprocess.run([sys.executable, "-c", code + check], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0 and "readme ran" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-4000:]
