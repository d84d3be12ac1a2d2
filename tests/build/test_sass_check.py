"""jatools/native/sass_check.py on code nvcc compiles here: a real backward instance (built through the JIT
build's own ninja plan), and small kernels with and without an integer division in their MMA loop."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from jatools import config
from jatools.native import (
    jit_build,
    jit_modules,
    jit_ninja,
    jit_packages,
    sass_check,
    toolchain,
)

ROOT = Path(__file__).resolve().parents[2]


def _tools() -> None:
    """Skip, saying why, where nvcc, the CUTLASS headers or cuobjdump are missing (CI's test venv has all three)."""
    if shutil.which("nvcc") is None:
        pytest.skip("no nvcc on PATH: the sm_90a backward cannot be compiled here to read its SASS")
    try:
        sass_check.find_tools()
        jit_packages.package_include(ROOT, "cutlass_include")
    except (sass_check.SassError, jit_modules.BuildError) as e:
        pytest.skip(f"{e} (installed in the tier sessions' venvs: nox -s tests)")


# A kernel named as the backward's (the check reads those names) whose loop runs a warpgroup MMA (one wgmma per
# iteration: HGMMA in SASS) and maps its iteration to (quotient, remainder) of a run-time divisor, either way.
STAND_IN = r"""
#include <cutlass/fast_math.h>
namespace ja { namespace mha_sm90 {
template <int kFast>
__global__ void mha_bwd_sm90_kernel(float* out, unsigned long long da, unsigned long long db, int n, int iters) {
  float d0 = 0.f, d1 = 0.f, d2 = 0.f, d3 = 0.f;
  int acc = 0;
  cutlass::FastDivmod by_n(n);
  for (int it = 0; it < iters; ++it) {
    asm volatile("wgmma.fence.sync.aligned;\n{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, %4, %5, p, 1, 1, 0, 0;\n}\n"
                 "wgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned 0;\n"
                 : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3) : "l"(da + it), "l"(db), "r"(it));
    int q, r;
    if (kFast) by_n(q, r, it);
    else q = it / n, r = it % n;
    acc += q * 3 + r;
  }
  out[threadIdx.x] = d0 + d1 + d2 + d3 + float(acc);
}
template __global__ void mha_bwd_sm90_kernel<0>(float*, unsigned long long, unsigned long long, int, int);
template __global__ void mha_bwd_sm90_kernel<1>(float*, unsigned long long, unsigned long long, int, int);
}}
"""


def test_a_division_in_the_mma_loop_is_named_and_fast_divmod_passes(tmp_path):
    _tools()
    src, obj = tmp_path / "stand_in.cu", tmp_path / "stand_in.o"
    src.write_text(STAND_IN)
    include = jit_packages.package_include(ROOT, "cutlass_include")
    subprocess.run(["nvcc", "-std=c++17", "-O3", toolchain.cuda_arch_flag(sass_check.ARCH), "-isystem", include, "-c",
                    str(src), "-o", str(obj)], check=True, capture_output=True, text=True)
    loops = {loop.kernel: loop for loop in sass_check.check([obj])}
    slow = next(loop for name, loop in loops.items() if "ILi0E" in name)
    fast = next(loop for name, loop in loops.items() if "ILi1E" in name)
    assert slow.hgmma >= 1 and fast.hgmma >= 1, (slow, fast)
    assert slow.divisions and all(sass_check.DIVISION.match(d.split(" ", 1)[1]) for d in slow.divisions), slow
    assert fast.divisions == (), fast
    text, ok = sass_check.report([slow, fast])
    assert not ok and "1 with an integer division in the main loop" in text and "FastDivmod" in text
    assert sass_check.main([str(obj)]) == 1
    with pytest.raises(sass_check.SassError, match="does not exist; build it first"):
        sass_check.check([tmp_path / "libmha_bwd.so"])


def test_the_sm90a_backward_main_loop_holds_no_division(tmp_path, capsys):
    """The causal bf16 head-dim-128 instance (both kernels: plain, and softcap/ALiBi), compiled with the build's
    flags from its own plan: the deterministic grouped-query order's iteration mapping runs in this loop."""
    _tools()
    env = {**os.environ, "JA_BACKEND": "cuda", "GPU_ARCHS": "sm_90", "JA_BUILD_DIR": str(tmp_path / "build")}
    settings = config.load(env=env)
    tc = toolchain.detect(settings, env=env)
    module = jit_modules.module_table(settings)["mha_bwd"]
    one = {"dtype": ["bf16"], "head_dim": [128], "causal": [True]}
    module = {**module, "kind_overrides": {**module.get("kind_overrides", {}), sass_check.KIND: {"axes": one}}}
    plan = jit_build.write_plan(settings, tc, {"mha_bwd": module})
    targets = [s.obj for s in plan.steps if s.rule == sass_check.KIND]
    assert len(targets) == 1, targets
    run = subprocess.run([jit_ninja.find_ninja(), "-f", str(plan.build_file), *targets], cwd=ROOT, check=False,
                         env={**env, **plan.env}, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert sass_check.main([str(ROOT / targets[0])]) == 0
    out = capsys.readouterr().out
    assert "2 backward kernels, no integer division in any main loop" in out, out


def test_missing_tools_and_a_kernel_without_an_mma_loop_are_named(tmp_path, monkeypatch):
    monkeypatch.setattr(sass_check.sys, "path", [str(tmp_path)])
    with pytest.raises(sass_check.SassError, match="nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm"):
        sass_check.find_tools({"PATH": str(tmp_path)})
    with pytest.raises(sass_check.SassError, match="no loop around its HGMMAs"):
        sass_check.main_loop("k", [(0, "MOV R1, c[0x0][0x28]"), (16, "EXIT")])
