"""Backend and toolchain detection with stand-in rocm-sdk/hipcc/nvcc for the hardware we lack."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from jatools import config
from jatools.native import toolchain

GXX = shutil.which("g++") or "g++"

HIPCC = """#!/bin/sh
# stand-in hipcc: knows gfx90a and gfx942 only
case "$*" in
  *--version*) echo "HIP version: 7.14.0-therock"; echo "AMD clang version 20.0.0"; exit 0;;
esac
for a in "$@"; do
  case "$a" in
    --offload-arch=gfx90a|--offload-arch=gfx942) ;;
    --offload-arch=*) echo "clang: error: invalid target ID '${a#--offload-arch=}'" >&2; exit 1;;
  esac
done
exit 0
"""
# stand-in nvcc 13: lists the plain archs only, and takes the a/f variants the real one takes (a --dryrun checks
# the flags); test_real_nvcc_takes_the_suffixes_this_stand_in_does holds it to the real one where nvcc is installed.
NVCC_TAKES = ("sm_80", "sm_86", "sm_90", "sm_90a", "sm_100", "sm_100a", "sm_100f", "sm_120")
NVCC = """#!/bin/sh
case "$1" in
  --version) echo "Cuda compilation tools, release 13.0, V13.0.48"; exit 0;;
  --list-gpu-code) echo "sm_80 sm_86 sm_90 sm_100"; exit 0;;
esac
for a in "$@"; do
  case "$a" in
""" + "".join(f"    --generate-code=arch=compute_{a[3:]},code={a}) ;;\n" for a in NVCC_TAKES) + """\
    --generate-code=*) c="${a#--generate-code=arch=}"; echo "nvcc fatal   : Unsupported gpu architecture '${c%%,*}'" >&2
                       exit 1;;
  esac
done
exit 0
"""


def _tool(bin_dir: Path, name: str, text: str) -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    p = bin_dir / name
    p.write_text(text)
    p.chmod(0o755)
    return p


@pytest.fixture
def tools(tmp_path):
    """An empty PATH folder plus a settings object that never finds the host's /opt/rocm."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()

    def settings(backend: str = "auto", archs: str | None = None):
        s = config.load(backend=backend, gpu_archs=archs, env={})
        return config.Settings(**{**s.__dict__, "raw": {**s.raw, "rocm_legacy_root": str(tmp_path / "no-rocm")}})

    def env(**extra):
        return {"PATH": str(bin_dir), "CXX": GXX, **extra}

    return bin_dir, settings, env


def test_cpu_when_no_gpu_toolchain(tools):
    _, settings, env = tools
    tc = toolchain.detect(settings(), env=env())
    assert tc.backend == "cpu" and tc.archs == ()
    assert "resolved to cpu" in " ".join(tc.how)


def test_auto_picks_cuda_when_only_nvcc(tools):
    bin_dir, settings, env = tools
    _tool(bin_dir, "nvcc", NVCC)
    tc = toolchain.detect(settings(), env=env())
    default = settings().default_archs("cuda")  # their one home: pyproject gpu_archs_cuda
    assert (tc.backend, tc.archs, tc.gpu_compiler_version) == ("cuda", default, "13.0")
    assert toolchain.arch_flags(tc) == [f"--generate-code=arch=compute_{a[3:]},code={a}" for a in default]


def test_therock_root_from_rocm_sdk_and_hipcc_from_path(tools, tmp_path):
    bin_dir, settings, env = tools
    root = tmp_path / "venv/lib/python3.12/site-packages/_rocm_sdk_core"
    _tool(bin_dir, "rocm-sdk", f'#!/bin/sh\ncase "$1" in path) echo {root};; version) echo 7.14.0;; esac\n')
    _tool(bin_dir, "hipcc", HIPCC)
    _tool(bin_dir, "nvcc", NVCC)  # ROCm wins over CUDA under auto
    tc = toolchain.detect(settings(archs="gfx942"), env=env())
    assert tc.backend == "rocm" and tc.rocm_root == str(root) and tc.platform_version == "7.14.0"
    assert any("TheRock" in h for h in tc.how)
    flags = toolchain.compile_flags(tc, settings(archs="gfx942"))
    assert "--offload-arch=gfx942" in flags["gpu"]
    assert not any("_rocm_sdk_devel" in f for fl in flags.values() for f in fl)


def test_rocm_path_wins_and_archs_split_on_both_separators(tools, tmp_path):
    _, settings, env = tools
    rocm = tmp_path / "rocm"
    _tool(rocm / "bin", "hipcc", HIPCC)
    tc = toolchain.detect(settings(archs="gfx90a; gfx942,gfx90a"), env=env(ROCM_PATH=str(rocm)))
    assert tc.rocm_root == str(rocm) and tc.archs == ("gfx90a", "gfx942")
    assert toolchain.arch_flags(tc) == ["--offload-arch=gfx90a", "--offload-arch=gfx942"]


def test_the_order_archs_are_written_in_changes_no_flag_recipe_or_cache_id(tools):
    """GPU_ARCHS=sm_100;sm_120;sm_80;sm_90 (the identity's sorted list, which the release test set again) and
    sm_80;sm_90;sm_100;sm_120 (how the build was asked) gave two recipe hashes: the flags named the archs in the order
    written. Now every order is one build: the same archs, flags, recipe hash and cache id."""
    from jatools.native import jit_build

    bin_dir, settings, env = tools
    _tool(bin_dir, "nvcc", NVCC)
    seen = set()
    for archs in ("sm_100;sm_120;sm_80;sm_90", "sm_80;sm_90;sm_100;sm_120", "120,90,sm_100,80"):
        s = settings("cuda", archs)
        tc = toolchain.detect(s, env=env())
        ident = jit_build.derive_identity(s, tc, jit_build.recipe(s, tc)[0])
        seen.add((tc.archs, tuple(toolchain.arch_flags(tc)), ident["recipe_hash"], ident["cache_id"]))
    assert len(seen) == 1, seen
    assert next(iter(seen))[0] == ("sm_80", "sm_90", "sm_100", "sm_120")
    assert config.canonical_archs(["gfx950", "gfx90a", "gfx942", "gfx90a"]) == ("gfx90a", "gfx942", "gfx950")


def test_the_release_and_the_tests_derive_one_cuda_identity_with_the_real_nvcc():
    """Issue 84's order, with the CUDA toolkit installed here: `nox -s release` under JA_BACKEND=auto built for the
    default archs (GPU_ARCHS unset), then the release test re-derived the identity from the record's archs
    (GPU_ARCHS=sm_100;sm_120;sm_80;sm_90) and found another recipe hash. Both routes now give one cache id."""
    from jatools.native import jit_build

    if shutil.which("nvcc") is None:
        pytest.skip("no nvcc on PATH: the stand-in's test of the same orders runs instead")
    env = {k: v for k, v in os.environ.items() if k not in ("GPU_ARCHS", "JA_BACKEND")}
    built = jit_build.checkout_identity(config.load(env={**env, "JA_BACKEND": "cuda"}))[0]
    again = jit_build.checkout_identity(config.load(env={**env, "JA_BACKEND": "cuda",
                                                         "GPU_ARCHS": ";".join(built["gpu_archs"])}))[0]
    assert built["gpu_archs"] == sorted(built["gpu_archs"]) and len(built["gpu_archs"]) > 1, built["gpu_archs"]
    assert (again["recipe_hash"], again["cache_id"]) == (built["recipe_hash"], built["cache_id"])


def test_therock_without_hipcc_on_path_is_an_error(tools, tmp_path):
    bin_dir, settings, env = tools
    _tool(bin_dir, "rocm-sdk", f"#!/bin/sh\necho {tmp_path}\n")
    with pytest.raises(toolchain.ToolchainError, match="hipcc is not on PATH"):
        toolchain.detect(settings(backend="rocm"), env=env())
    assert "hipcc is not on PATH" in toolchain.detect(settings(), env=env()).how[-1]  # auto: said, and passed by


def test_rejected_rocm_arch_names_arch_and_compiler(tools):
    bin_dir, settings, env = tools
    hipcc = _tool(bin_dir, "hipcc", HIPCC)
    with pytest.raises(toolchain.ToolchainError) as e:
        toolchain.detect(settings(backend="rocm", archs="gfx942;gfx950"), env=env())
    assert "gfx950" in str(e.value) and str(hipcc) in str(e.value) and "invalid target ID" in str(e.value)


def test_rejected_cuda_arch_names_arch_and_compiler(tools):
    bin_dir, settings, env = tools
    nvcc = _tool(bin_dir, "nvcc", NVCC)
    with pytest.raises(toolchain.ToolchainError) as e:
        toolchain.detect(settings(backend="cuda", archs="sm_90,sm_70"), env=env())
    assert "sm_70" in str(e.value) and str(nvcc) in str(e.value)


CUDA_NAMES = ["sm_90", "90", "sm_90a", "90a", "sm_100f", "sm_100a", "100f", "sm_120"]
NOT_CUDA_NAMES = ["sm90", "sm_9", "sm_90x", "sm_90af", "SM_90", "gfx950", "sm_1000"]


@pytest.mark.parametrize("name", CUDA_NAMES + NOT_CUDA_NAMES)
def test_the_settings_and_the_toolchain_accept_the_same_cuda_arch_names(name):
    """One spelling of a CUDA arch: what GPU_ARCHS accepts, the CUDA toolchain takes (sm_100f, CUDA 12.9's
    family-specific name, passed the setting and was refused by the toolchain)."""
    from jax_aiter import settings as registry

    if name in CUDA_NAMES:
        assert registry.check(registry.BY_NAME["GPU_ARCHS"], name) == name
        assert toolchain.normalise_cuda_arch(name) == (name if name.startswith("sm_") else f"sm_{name}")
    else:
        with pytest.raises(toolchain.ToolchainError, match="CUDA archs look like sm_90, sm_90a or sm_100f"):
            toolchain.normalise_cuda_arch(name)
        if not name.startswith("gfx"):
            with pytest.raises(registry.SettingError, match="not a GPU arch name"):
                registry.check(registry.BY_NAME["GPU_ARCHS"], name)


def test_arch_specific_and_family_archs_reach_nvcc_and_a_refused_one_is_named(tools):
    bin_dir, settings, env = tools
    nvcc = _tool(bin_dir, "nvcc", NVCC)
    tc = toolchain.detect(settings(backend="cuda", archs="sm_90a;100f"), env=env())
    assert toolchain.arch_flags(tc) == ["--generate-code=arch=compute_90a,code=sm_90a",
                                        "--generate-code=arch=compute_100f,code=sm_100f"]
    with pytest.raises(toolchain.ToolchainError) as e:
        toolchain.detect(settings(backend="cuda", archs="sm_90,sm_90f"), env=env())
    assert f"GPU arch sm_90f is refused by {nvcc}: nvcc fatal   : Unsupported gpu architecture 'compute_90f'" \
        in str(e.value) and "sm_80 sm_86 sm_90 sm_100" in str(e.value)


def test_real_nvcc_takes_the_suffixes_this_stand_in_does():
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("no nvcc on PATH: the stand-in's a/f arch rules are checked against the real one where it is")
    listed = toolchain._run([nvcc, "--list-gpu-code"]).stdout.split()
    takes = [a for a in NVCC_TAKES if a.rstrip("af") in listed]
    toolchain.check_cuda_archs(nvcc, takes)
    assert {"sm_90a", "sm_100f"} <= set(takes), f"{nvcc} lists {listed}"
    for refused in ("sm_90f", "sm_80a"):
        with pytest.raises(toolchain.ToolchainError, match=f"Unsupported gpu architecture 'compute_{refused[3:]}'"):
            toolchain.check_cuda_archs(nvcc, [refused])


@pytest.mark.parametrize("backend, what", [("rocm", "no ROCm toolchain"), ("cuda", "nvcc was not found")])
def test_requested_backend_without_toolchain(tools, backend, what):
    _, settings, env = tools
    with pytest.raises(toolchain.ToolchainError, match=what):
        toolchain.detect(settings(backend=backend), env=env())


def test_unknown_backend_lists_valid_ones():
    with pytest.raises(ValueError, match="auto, cpu, cuda, rocm"):
        config.load(env={"JA_BACKEND": "metal"})


def test_precedence_flag_over_env_over_pyproject():
    assert config.load(env={}).backend == config.defaults()["backend"]
    assert config.load(env={"JA_BACKEND": "cpu"}).backend == "cpu"
    assert config.load(backend="cuda", env={"JA_BACKEND": "cpu"}).backend == "cuda"
    assert config.load(env={"GPU_ARCHS": "gfx942;gfx950"}).gpu_archs == ("gfx942", "gfx950")


def test_ffi_api_version_of_vendored_headers():
    assert toolchain.ffi_api_version(config.load(env={}).ffi_include_dir) == (0, 3)


# --- GPU_ARCHS unset: the archs of the GPUs present (stand-in nvidia-smi / rocminfo for the GPUs we lack) -------

ROCMINFO = """#!/bin/sh
echo "Agent 1"
echo "  Name:                    AMD EPYC 9654 96-Core Processor"
echo "Agent 2"
echo "  Name:                    gfx942"
echo "  Marketing Name:          AMD Instinct MI300X"
echo "Agent 3"
echo "  Name:                    gfx942"
"""


def test_cuda_archs_from_the_gpus_present(tools):
    bin_dir, settings, env = tools
    _tool(bin_dir, "nvcc", NVCC)
    _tool(bin_dir, "nvidia-smi", '#!/bin/sh\n[ "$1" = --query-gpu=compute_cap ] || exit 9\necho 9.0\necho 8.0\n'
                                 'echo 9.0\n')
    tc = toolchain.detect(settings(), env=env())
    assert tc.archs == ("sm_80", "sm_90")  # in the one order, whatever order the GPUs are listed in
    assert "GPU_ARCHS unset: sm_90;sm_80, the GPUs present (nvidia-smi)" in tc.how
    assert toolchain.detect(settings(archs="sm_86"), env=env()).archs == ("sm_86",)  # GPU_ARCHS wins


def test_rocm_archs_from_the_gpus_present(tools, tmp_path):
    _, settings, env = tools
    rocm = tmp_path / "rocm"
    _tool(rocm / "bin", "hipcc", HIPCC)
    bin_dir, _, _ = tools
    _tool(bin_dir, "rocminfo", ROCMINFO)
    (tmp_path / "kfd").touch()  # the AMD driver's device: a host with AMD GPUs
    tc = toolchain.detect(settings(), env=env(ROCM_PATH=str(rocm), JA_KFD_PATH=str(tmp_path / "kfd")))
    assert tc.archs == ("gfx942",) and "GPU_ARCHS unset: gfx942, the GPUs present (rocminfo)" in tc.how


def test_no_gpu_or_a_failing_probe_keeps_the_default_archs_and_says_why(tools):
    bin_dir, settings, env = tools
    _tool(bin_dir, "nvcc", NVCC)
    tc = toolchain.detect(settings(), env=env())
    default = settings().default_archs("cuda")
    assert tc.archs == default and "GPU_ARCHS unset and no nvidia-smi on PATH: the default archs" in tc.how
    _tool(bin_dir, "nvidia-smi", "#!/bin/sh\necho 'NVIDIA-SMI has failed: no devices were found' >&2\nexit 6\n")
    tc = toolchain.detect(settings(), env=env())
    assert tc.archs == default
    assert any("exited with status 6 (NVIDIA-SMI has failed" in h and h.endswith("the default archs") for h in tc.how)
