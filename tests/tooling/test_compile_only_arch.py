"""nox -s compile_only: ROCm compiles gfx950 where the HIP compiler accepts it, gfx90a where it does not.

The HIP compiler is stood in for (this machine has none): a script that compiles (writes the object) for the
archs it knows and fails like an old hipcc for the others."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from jatools.native import build, toolchain

HIPCC = """#!/usr/bin/env bash
echo "$*" >>"$PROBES"
for a in "$@"; do case "$a" in --offload-arch=*) arch=${a#--offload-arch=};; esac; done
case " $KNOWN " in *" $arch "*) ;; *) echo "clang: error: unsupported HIP gpu architecture: $arch" >&2; exit 1;; esac
while [ $# -gt 0 ]; do [ "$1" = -o ] && : >"$2"; shift; done
"""


@pytest.mark.parametrize(("known", "want"), [("gfx90a gfx942 gfx950", "gfx950"), ("gfx900 gfx90a", "gfx90a")])
def test_the_rocm_arch_is_the_newest_the_compiler_accepts(known, want, tmp_path, monkeypatch, capsys):
    hipcc = tmp_path / "hipcc"
    hipcc.write_text(HIPCC)
    hipcc.chmod(0o755)
    monkeypatch.setenv("KNOWN", known)
    probes = tmp_path / "probes.log"
    monkeypatch.setenv("PROBES", str(probes))
    assert build.rocm_compile_arch(str(hipcc)) == want
    if want == "gfx90a":
        assert "does not compile for gfx950 (clang: error: unsupported HIP gpu architecture: gfx950)" \
            in capsys.readouterr().out
    assert build.default_archs("rocm") == "gfx950"
    # The choice is made by the build's own arch check (one probe, one command line); the arch it took passes it.
    toolchain.check_rocm_archs(str(hipcc), [want], {})
    lines = probes.read_text().splitlines()
    assert len(lines) == 2, lines  # compile-only probes gfx950 once; then the check
    chosen, checked = (re.sub(r"/\S*/|--offload-arch=\S+", "X", line) for line in (lines[0], lines[-1]))
    assert chosen == checked, "compile-only probes an arch with another command than the build's check"


def test_a_missing_compiler_is_an_error_not_a_silent_fallback(tmp_path):
    with pytest.raises(FileNotFoundError):
        build.rocm_compile_arch(str(Path(tmp_path, "no-hipcc")))
