"""Every numeric setting goes through jax_aiter.settings: nan, inf, out-of-range and non-numbers stop with the
variable, the value and the accepted range. The table is checked whole, and the entry points by real processes."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from jax_aiter import settings

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", sorted(settings.NUMERIC))
def test_faults_every_numeric_setting_is_bounded(name):
    spec = settings.NUMERIC[name]
    for bad in ("nan", "inf", "-inf", "abc", "", str(spec.hi * 10 + 1), str(spec.lo - 1)):
        with pytest.raises(settings.SettingError) as e:
            settings.number(name, bad)
        assert f"{name}={bad!r} is not valid: give" in str(e.value) and f"from {spec.show(spec.lo)} to {spec.show(spec.hi)}" in str(e.value)
    assert settings.number(name, str(spec.kind(spec.lo))) == spec.lo
    assert settings.from_env(name, {}) == spec.default


def _run(args: list[str], **env: str) -> subprocess.CompletedProcess:
    full = {**{k: v for k, v in os.environ.items() if not k.startswith("JA_")}, "PYTHONPATH": str(ROOT), **env}
    return subprocess.run([sys.executable, *args], env=full, cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=False)


@pytest.mark.parametrize("name, value", [("JA_TEST_RERUNS", "nan"), ("JA_TEST_WORKERS", "-2"),
                                         ("JA_TESTS_PER_GPU", "0")])
def test_faults_test_tier_runner_names_a_bad_setting(name, value):
    r = _run(["-m", "jatools.testing.tiers", "--dry-run"], **{name: value, "JA_GPU_COUNT": "1"})
    assert r.returncode == 2 and f"{name}={value!r} is not valid" in r.stderr and "Traceback" not in r.stderr


def test_faults_wheel_build_names_a_bad_source_date_epoch():
    r = _run(["-m", "jatools.wheel.wheel_build", "--variant", "lite", "--dist", "/nonexistent"],
             SOURCE_DATE_EPOCH="yesterday", JA_ROOT_DIR=str(ROOT))
    assert r.returncode == 2 and "SOURCE_DATE_EPOCH='yesterday' is not valid" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
