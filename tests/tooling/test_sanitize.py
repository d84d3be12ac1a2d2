"""Sanitizer plumbing: JA_SANITIZE reaches the compile and link flags, and the runtime environment of
`nox -s sanitize` really catches faults in a library loaded into Python (planted in a real g++ build)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from jatools import config
from jatools.native import jit_build, sanitize, toolchain

ROOT = Path(__file__).resolve().parents[2]

PLANTED = r"""
#include <cstdlib>
#include <stdexcept>
#define API extern "C" __attribute__((visibility("default")))
API int ok(int n) { int* p = (int*)std::malloc(n * sizeof(int)); for (int i = 0; i < n; ++i) p[i] = i;
  int s = p[n - 1]; std::free(p); return s; }
API int heap_overflow(int n) { int* p = (int*)std::malloc(n * sizeof(int)); p[n] = 1; int s = p[0];
  std::free(p); return s; }
API int use_after_free(int n) { int* p = (int*)std::malloc(n * sizeof(int)); std::free(p); return p[0]; }
API int bad_shift(int s) { return 1 << s; }
API int throw_and_catch(int n) { try { throw std::runtime_error("x"); } catch (const std::exception&) {
  return n; } }
"""


@pytest.fixture(scope="module")
def planted_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A shared library built with exactly the flags jatools.native.toolchain gives under JA_SANITIZE."""
    d = tmp_path_factory.mktemp("planted")
    (d / "planted.cpp").write_text(PLANTED)
    settings = config.load(env={"JA_BACKEND": "cpu", "JA_SANITIZE": sanitize.SANITIZERS}, root=ROOT)
    tc = toolchain.Toolchain("cpu", "g++", toolchain.cxx_version("g++"))
    flags = toolchain.compile_flags(tc, settings)
    cxx = [f for f in flags["cxx"] if not f.startswith(("-I", "-isystem", "third_party"))]
    lib = d / "libplanted.so"
    subprocess.run([*flags["link"], *cxx, "-O0", str(d / "planted.cpp"), "-o", str(lib)], check=True, cwd=ROOT)
    return lib


def call(lib: Path, fn: str, arg: int) -> subprocess.CompletedProcess:
    env = sanitize.runtime_env(ROOT, {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"})
    code = f"import ctypes; print(ctypes.CDLL({str(lib)!r}).{fn}({arg}))"
    return subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, env=env,
                          timeout=120)


def test_ja_sanitize_parsed_and_validated() -> None:
    assert config.load(env={"JA_SANITIZE": "address;undefined"}, root=ROOT).sanitize == ("address", "undefined")
    assert config.load(env={}, root=ROOT).sanitize == ()
    with pytest.raises(ValueError, match="JA_SANITIZE='adress'"):
        config.load(env={"JA_SANITIZE": "adress"}, root=ROOT)
    with pytest.raises(ValueError, match="exclude each other"):
        config.load(env={"JA_SANITIZE": "address,thread"}, root=ROOT)


def test_flags_reach_compile_and_link_for_cpu_only() -> None:
    settings = config.load(env={"JA_BACKEND": "cpu", "JA_SANITIZE": "address,undefined"}, root=ROOT)
    cpu = toolchain.Toolchain("cpu", "g++", "g++ 12")
    flags = toolchain.compile_flags(cpu, settings)
    assert "-fsanitize=address,undefined" in flags["cxx"] and "-fno-sanitize-recover=all" in flags["cxx"]
    assert flags["link"][-1] == "-fsanitize=address,undefined"
    plain = toolchain.compile_flags(cpu, config.load(env={"JA_BACKEND": "cpu"}, root=ROOT))
    assert not any("sanitize" in f for f in plain["cxx"] + plain["link"])
    cuda = toolchain.Toolchain("cuda", "g++", "g++ 12", "/usr/bin/nvcc", "13.0", "13.0", archs=("sm_90",))
    with pytest.raises(toolchain.ToolchainError, match="needs JA_BACKEND=cpu"):
        toolchain.compile_flags(cuda, settings)


def test_build_env_isolates_the_sanitized_tree() -> None:
    env = sanitize.build_env({"GPU_ARCHS": "gfx950", "JA_BACKEND": "rocm", "PATH": "/bin"})
    assert env == {"PATH": "/bin", "JA_BACKEND": "cpu", "JA_BUILD_DIR": "build/sanitize",
                   "JA_SANITIZE": "address,undefined"}


def test_runtime_env_preloads_asan_then_libstdcxx_and_names_the_suppressions() -> None:
    env = sanitize.runtime_env(ROOT, {"LD_PRELOAD": "/x/libother.so"})
    libs = env["LD_PRELOAD"].split()
    assert "libasan.so" in libs[0] and "libstdc++.so" in libs[1] and libs[2] == "/x/libother.so"
    for var, name in (("ASAN_OPTIONS", "asan.supp"), ("UBSAN_OPTIONS", "ubsan.supp"), ("LSAN_OPTIONS", "lsan.supp")):
        supp = env[var].split("suppressions=")[1].split(":")[0]
        assert supp.endswith(name) and Path(supp).is_file()
    assert "halt_on_error=1" in env["ASAN_OPTIONS"] and "halt_on_error=1" in env["UBSAN_OPTIONS"]


def test_clean_code_and_cpp_exceptions_run(planted_lib: Path) -> None:
    r = call(planted_lib, "ok", 10)
    assert (r.returncode, r.stdout.strip()) == (0, "9"), r.stderr[-2000:]
    r = call(planted_lib, "throw_and_catch", 7)  # needs libstdc++ preloaded with ASan
    assert (r.returncode, r.stdout.strip()) == (0, "7"), r.stderr[-2000:]


@pytest.mark.parametrize("fn,report", [
    ("heap_overflow", "AddressSanitizer: heap-buffer-overflow"),
    ("use_after_free", "AddressSanitizer: heap-use-after-free"),
    ("bad_shift", "runtime error: shift exponent 40 is too large"),
])
def test_planted_faults_abort_with_a_report(planted_lib: Path, fn: str, report: str) -> None:
    r = call(planted_lib, fn, 40 if fn == "bad_shift" else 8)
    assert r.returncode != 0, f"{fn} was not caught: {r.stdout} {r.stderr[-1000:]}"
    assert report in r.stderr, r.stderr[-2000:]


PLANTED_THREADS = r"""
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include "ja/api.h"
int main(int argc, char** argv) {
  setenv("JA_NUM_THREADS", "4", 1);
  std::vector<long> per_row(1 << 12, 0);
  long shared = 0;
  const bool race = argc > 1 && std::strcmp(argv[1], "race") == 0;
  ja::parallel_for(per_row.size(), 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      per_row[i] = i;            // disjoint rows: what every kernel does
      if (race) shared += 1;     // every chunk writes one variable: a data race
    }
  });
  std::printf("%ld %ld\n", per_row.back(), shared);
  return 0;
}
"""


@pytest.fixture(scope="module")
def planted_threads(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real csrc/common/parallel.cpp and a user of it, built with the flags JA_SANITIZE=thread gives."""
    d = tmp_path_factory.mktemp("tsan")
    (d / "main.cpp").write_text(PLANTED_THREADS)
    settings = config.load(env={"JA_BACKEND": "cpu", "JA_SANITIZE": sanitize.SANITIZER_KINDS["thread"].flags},
                           root=ROOT)
    tc = toolchain.Toolchain("cpu", "g++", toolchain.cxx_version("g++"))
    cxx = toolchain.compile_flags(tc, settings)["cxx"]
    exe = d / "planted"
    subprocess.run(["g++", *cxx, str(d / "main.cpp"), "csrc/common/parallel.cpp", "-o", str(exe),
                    "-fsanitize=thread", "-lpthread"], check=True, cwd=ROOT)
    return exe


def test_tsan_passes_clean_parallel_for_users_and_aborts_on_a_planted_race(planted_threads: Path) -> None:
    env = sanitize.tsan_env(ROOT, dict(os.environ))
    supp = env["TSAN_OPTIONS"].split("suppressions=")[1].split(":")[0]
    assert Path(supp).is_file() and "halt_on_error=1" in env["TSAN_OPTIONS"]
    clean = subprocess.run([str(planted_threads)], capture_output=True, text=True, env=env, timeout=120, check=False)
    assert clean.returncode == 0 and clean.stdout.split()[0] == "4095", clean.stderr[-2000:]
    assert "ThreadSanitizer" not in clean.stderr
    racy = subprocess.run([str(planted_threads), "race"], capture_output=True, text=True, env=env, timeout=120,
                          check=False)
    assert racy.returncode == 66, racy.stdout + racy.stderr[-2000:]
    assert "WARNING: ThreadSanitizer: data race" in racy.stderr


def test_tsan_builds_into_its_own_tree_and_links_the_driver_against_it() -> None:
    kind = sanitize.SANITIZER_KINDS["thread"]
    env = sanitize.build_env({"JA_BACKEND": "cuda", "GPU_ARCHS": "sm_90"}, kind)
    assert env == {"JA_BACKEND": "cpu", "JA_BUILD_DIR": "build/sanitize-thread", "JA_SANITIZE": "thread"}
    settings = config.load(env=env, root=ROOT)
    cmd = sanitize.tsan_driver_command(settings, Path("out"))
    assert "-fsanitize=thread" in cmd and str(sanitize.TSAN_DRIVER) in cmd
    assert f"-L{settings.jit_dir}" in cmd and "build/sanitize-thread" in str(settings.jit_dir)
    # every JIT library of the op table, before the umbrella they need
    linked = [a for a in cmd if a.startswith("-l")]
    assert (linked[:-2] == [f"-l{m}" for m in jit_build.libraries(settings)]
            and linked[-2:] == ["-ljax_aiter", "-lpthread"])
