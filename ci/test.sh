#!/usr/bin/env bash
# Run a test tier:  JA_TEST_TIER=pr|nightly|multigpu bash ci/test.sh [pytest args]
# The tiers and their marker expressions live in jatools/testing/tag_filters.py; the
# runner is jatools/testing/test_tiers.py (python3 -m jatools.testing.test_tiers --help).
# PYTHON picks the interpreter (one with pytest, JAX and the `test` dependency group of pyproject.toml).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec "${PYTHON:-python3}" -m jatools.testing.test_tiers --tier "${JA_TEST_TIER:-pr}" "$@"
