#!/usr/bin/env bash
# Validation image tag from the hash of docker/validation/Dockerfile.lite:
#   ci/validation_image_id.sh                        -> v<first 12 hex of its sha256>
#   ci/validation_image_id.sh --variant rocm         -> v<hash12>-rocm
#   ci/validation_image_id.sh --ref --variant rocm   -> ghcr.io/rocm/jax-aiter-validate:v<hash12>-rocm
# The logic is jatools/validate/cleanroom_env.py; this wrapper only finds the checkout.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
exec "${PYTHON:-python3}" -m jatools.validate.cleanroom_env "$@"
