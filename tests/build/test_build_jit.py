"""build_jit.py: instance generation, incremental rebuilds, build record, errors."""
from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest

from jax_aiter.integrity import sha256_file
from tests.build.scratch import build_jit, env_for, make_scratch, run


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    root = make_scratch(tmp_path_factory.mktemp("jit"))
    run(["make", "-j2"], root)
    build_jit(root, "--module", "rmsnorm_fwd", "-j", "2")
    return root


def _steps(out: str) -> int:
    m = re.search(r"(\d+) build steps run", out)
    assert m, out
    return int(m.group(1))


def test_instances_are_generated_from_templates(scratch):
    gen = scratch / "build/aiter_build/rmsnorm_fwd/gen"
    names = sorted(p.name for p in gen.glob("*.cpp"))
    assert names == ["ja_rmsnorm_fwd_cpu__bf16.cpp", "ja_rmsnorm_fwd_cpu__f16.cpp", "ja_rmsnorm_fwd_cpu__f32.cpp"]
    text = (gen / "ja_rmsnorm_fwd_cpu__bf16.cpp").read_text()
    assert "ja::type_bf16" in text and "{{" not in text
    table = (gen / "rmsnorm_fwd_cpu_instances.inc").read_text()
    assert "JA_INSTANCE(ja_rmsnorm_fwd_cpu__f16, f16)" in table


def test_noop_rebuild_runs_nothing(scratch):
    assert _steps(build_jit(scratch, "--module", "rmsnorm_fwd").stdout) == 0


def test_touching_a_template_rebuilds_only_its_instances(scratch):
    tpl = scratch / "csrc/kernels/rmsnorm/rmsnorm_fwd_cpu.inst.in"
    tpl.write_text(tpl.read_text() + "// edited\n")
    out = build_jit(scratch, "--module", "rmsnorm_fwd", "--verbose").stdout
    compiled = re.findall(r"-c (\S+) -o", out)
    assert sorted(Path(c).name for c in compiled) == [
        "ja_rmsnorm_fwd_cpu__bf16.cpp", "ja_rmsnorm_fwd_cpu__f16.cpp", "ja_rmsnorm_fwd_cpu__f32.cpp"]
    # editing a header the dispatcher alone includes recompiles just the dispatcher
    disp = scratch / "csrc/kernels/rmsnorm/rmsnorm_fwd_dispatch.cpp"
    disp.write_text(disp.read_text() + "// edited\n")
    out = build_jit(scratch, "--module", "rmsnorm_fwd", "--verbose").stdout
    assert [Path(c).name for c in re.findall(r"-c (\S+) -o", out)] == ["rmsnorm_fwd_dispatch.cpp"]


def test_build_record_matches_outputs(scratch):
    record = json.loads((scratch / "build/aiter_build/build_record.json").read_text())
    entry = record["modules"]["rmsnorm_fwd"]
    lib = scratch / "build/aiter_build/librmsnorm_fwd.so"
    assert entry["file"] == {"name": lib.name, "size": lib.stat().st_size, "sha256": sha256_file(lib)}
    ident = entry["identity"]
    assert ident["backend"] == "cpu" and ident["gpu_archs"] == []
    assert re.fullmatch(r"[0-9a-f]{40}", ident["kernel_source_revision"])
    assert re.fullmatch(r"[0-9a-f]{64}", ident["recipe_hash"])
    assert ident["ffi_api_version"] == "0.3"
    assert entry["instances"] == 3
    assert not list((scratch / "build/aiter_build").glob("*.tmp*")), "temporary files left behind"


def test_log_file_gets_compiler_output(scratch, tmp_path):
    (scratch / "csrc/kernels/rmsnorm/rmsnorm_fwd_dispatch.cpp").touch()
    log = tmp_path / "jit.log"
    build_jit(scratch, "--module", "rmsnorm_fwd", "--log", str(log))
    assert "rmsnorm_fwd_dispatch.cpp" in log.read_text()


def test_unknown_module_is_an_error(scratch):
    out = build_jit(scratch, "--module", "nope", check=False)
    assert out.returncode == 2
    assert "unknown module(s) nope" in out.stderr and "rmsnorm_fwd" in out.stderr


def test_compile_error_fails_with_the_compiler_message(scratch):
    tpl = scratch / "csrc/kernels/rmsnorm/rmsnorm_fwd_cpu.inst.in"
    good = tpl.read_text()
    try:
        tpl.write_text(good + "this is not C++;\n")
        out = build_jit(scratch, "--module", "rmsnorm_fwd", check=False)
        assert out.returncode == 2
        assert "compilation failed" in out.stderr and "this is not C++" in out.stderr + out.stdout
        # the previous library is still there and still matches the record
        record = json.loads((scratch / "build/aiter_build/build_record.json").read_text())
        lib = scratch / "build/aiter_build/librmsnorm_fwd.so"
        assert sha256_file(lib) == record["modules"]["rmsnorm_fwd"]["file"]["sha256"]
    finally:
        tpl.write_text(good)


def test_missing_umbrella_names_make(tmp_path):
    """The JIT builder itself (make jit and build_jit.py build the umbrella first) names `make` when it is missing."""
    root = make_scratch(tmp_path / "fresh")
    out = run([sys.executable, "-m", "jatools.native.jit_build", "--module", "rmsnorm_fwd"], root, check=False)
    assert out.returncode == 2 and "run `make`" in out.stderr


def test_outside_git_the_revision_is_a_content_hash(tmp_path):
    root = make_scratch(tmp_path / "tarball")
    import shutil

    shutil.rmtree(root / ".git")
    run(["make", "-j2"], root)
    out = build_jit(root, "--module", "rmsnorm_fwd")
    assert "using a content hash" in out.stderr
    ident = json.loads((root / "build/aiter_build/build_record.json").read_text())["modules"]["rmsnorm_fwd"]["identity"]
    assert re.fullmatch(r"content-sha256:[0-9a-f]{64}", ident["kernel_source_revision"])
    assert ident["kernel_source_dirty"] is True


def test_a_consumer_never_builds_and_takes_only_matching_libraries(tmp_path):
    """CI=true makes the native build a consumer: no build/aiter_build -> an error naming the cache id and the
    producer within seconds, before make or a compiler runs; after the producer (make jit) it takes them."""
    root = make_scratch(tmp_path / "consumer")
    start = time.monotonic()
    out = run([sys.executable, "-m", "jatools.native.build"], root, env=env_for(root, CI="true"), check=False)
    took = time.monotonic() - start
    assert out.returncode == 2, out.stdout + out.stderr
    assert took < 10, f"a consumer's miss took {took:.1f} s"
    assert re.search(r"no JIT libraries for cache id [0-9a-f]{16}", out.stderr), out.stderr
    assert "invoke jit.fetch" in out.stderr and "nox -s jit" in out.stderr and "jit-libs.yml" in out.stderr
    assert not (root / "build/obj").exists() and not (root / "build/jax_aiter_build").exists(), "something compiled"
    run(["make", "-j2", "jit", f"PYTHON={sys.executable}", "JIT_ARGS=--module rmsnorm_fwd"], root)
    taken = run([sys.executable, "-m", "jatools.native.build", "--check-taken"], root, check=False)
    assert taken.returncode == 0, taken.stderr
    assert "taken from" in taken.stdout and "sha256 match" in taken.stdout
    lib = root / "build/aiter_build/librmsnorm_fwd.so"
    lib.write_bytes(lib.read_bytes() + b"tampered")
    bad = run([sys.executable, "-m", "jatools.native.build", "--check-taken"], root, check=False)
    assert bad.returncode == 2 and "librmsnorm_fwd.so" in bad.stderr, bad.stderr
