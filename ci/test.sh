#!/usr/bin/env bash
# Run a test tier:  JA_TEST_TIER=pr|nightly|multigpu bash ci/test.sh [pytest args]
# The tiers, their marker expressions and the runner live in jatools/testing/tiers.py
# (python3 -m jatools.testing.tiers --help).
# PYTHON picks the interpreter (one with pytest, JAX and the `test` dependency group of pyproject.toml).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec "${PYTHON:-python3}" -m jatools.testing.tiers "$@"  # the tier: --tier, else $JA_TEST_TIER, else pr
