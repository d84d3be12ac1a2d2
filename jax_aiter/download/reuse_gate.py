"""When two JIT-library builds are interchangeable: the gated identity fields and the cache id.

A stale library silently reused is a wrong-answer bug, so reuse is hard-gated
on the fields that decide what the libraries compute and for which GPUs:
kernel-source revision, GPU arch set (order-insensitive), recipe hash, backend
and FFI API version. The toolchain is provenance: a difference is a warning,
and a mismatch only when strict comparison is asked for.

Shared by the build tooling (identity, decision, publishing) and the
runtime fetch client (jax-aiter-fetch-mha), so it must not import JAX.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

GATED_FIELDS = ("kernel_source_revision", "gpu_archs", "recipe_hash", "backend", "ffi_api_version")
TAG_PREFIX = "jit-libs-"


def _normalised(ident: dict, key: str):
    value = ident.get(key)
    return sorted(set(value)) if key == "gpu_archs" and value is not None else value


def cache_id(ident: dict) -> str:
    """Short hash of the gated fields: names the immutable release `jit-libs-<cache-id>`."""
    gated = {k: _normalised(ident, k) for k in GATED_FIELDS}
    return hashlib.sha256(json.dumps(gated, sort_keys=True).encode()).hexdigest()[:16]


def release_tag(cid: str) -> str:
    return f"{TAG_PREFIX}{cid}"


def _show(value) -> str:
    if isinstance(value, list):
        return ";".join(value) if value else "(none)"
    return "(missing)" if value is None else str(value)


@dataclass
class Comparison:
    """Outcome of comparing a wanted identity with one found (in a manifest or build record)."""

    mismatches: list[str] = field(default_factory=list)
    matched: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.mismatches


def compare(want: dict, have: dict, strict_toolchain: bool = False) -> Comparison:
    """Field-by-field comparison; every difference is named with both values."""
    result = Comparison()
    for key in GATED_FIELDS:
        w, h = _normalised(want, key), _normalised(have, key)
        if w == h:
            result.matched.append(key)
        else:
            result.mismatches.append(f"{key}: wanted {_show(w)}, found {_show(h)}")
    tw, th = want.get("toolchain"), have.get("toolchain")
    if not tw or not th:
        result.warnings.append("toolchain not compared: " + ("not detected here" if not tw else "not recorded"))
        return result
    for key in sorted(set(tw) | set(th)):
        if tw.get(key) != th.get(key):
            text = f"toolchain {key}: wanted {_show(tw.get(key))}, found {_show(th.get(key))}"
            (result.mismatches if strict_toolchain else result.warnings).append(
                text if strict_toolchain else text + " (advisory; strict comparison would refuse it)")
    return result
