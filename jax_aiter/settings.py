"""Every setting of jax-aiter, in one table: its environment variable, its pyproject key, its default, what it
accepts and what it means. docs/settings.md is generated from it, and a test keeps both current.

A setting's default lives in one place: pyproject.toml ``[tool.jax-aiter]`` when the table names a
``key`` (the build tooling reads it there), else here (``default``: the settings the runtime reads, which
an installed wheel has no pyproject for). The environment overrides the default; flags override both.

Every number a user can set (environment variable or flag) is read through ``number(name, text)``: it
must parse, be finite and lie in the setting's range, or the error names the setting, the value given
and the accepted range. So ``nan``, ``inf``, ``0`` where zero makes no sense, negatives and huge values
stop at once instead of waiting forever, overflowing later or eating memory.

The runtime (jax-aiter-fetch-mha, the loader) and the build tooling both read it, so it imports only the
standard library.
"""
from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

GROUPS = ("build", "runtime", "tests", "wheels and validation", "CI")


@dataclass(frozen=True)
class Setting:
    name: str                 # the environment variable ("" for a pyproject-only key)
    group: str                # one of GROUPS
    meaning: str              # one line
    key: str = ""             # the pyproject [tool.jax-aiter] key that holds its default
    default: object = None    # the default when no key holds it (None: unset, or derived as `meaning` says)
    choices: tuple[str, ...] = ()
    accepts: str = ""         # what it accepts, when neither choices nor a range say it
    kind: type | None = None  # int or float: a number in [lo, hi], read through number()
    lo: float = 0
    hi: float = 0
    unit: str = ""
    internal: bool = False    # plumbing between our own processes or set by CI; nobody sets it by hand

    def show(self, value: float) -> str:
        return str(int(value)) if self.kind is int else f"{value:g}"

    def range_text(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        return f"{'an integer' if self.kind is int else 'a number'} from {self.show(self.lo)} to {self.show(self.hi)}{unit}"

    def accepted(self) -> str:
        """What the setting accepts, in words."""
        if self.kind is not None:
            return self.range_text()
        return f"{self.accepts} {', '.join(self.choices)}".strip() if self.choices else self.accepts


def _n(name: str, group: str, meaning: str, kind: type, lo: float, hi: float, default: float | None,
       unit: str = "", internal: bool = False) -> Setting:
    return Setting(name, group, meaning, default=default, kind=kind, lo=lo, hi=hi, unit=unit, internal=internal)


SETTINGS: tuple[Setting, ...] = (
    # --- build --------------------------------------------------------------------------------
    Setting("JA_ROOT_DIR", "build", "the checkout the tooling (and a checkout's runtime) works on",
            default="the folder holding the code", accepts="a folder"),
    Setting("JA_BACKEND", "build", "what to build for and test on (auto: ROCm when a ROCm toolchain is found, "
            "else CUDA when nvcc is, else the CPU); with JA_GPU_COUNT, rocm makes the stand-in GPUs ROCm ones",
            key="backend", choices=("auto", "cpu", "cuda", "rocm")),
    Setting("GPU_ARCHS", "build", "the GPU archs to compile for", default="gpu_archs_rocm or gpu_archs_cuda",
            accepts="a `;` or `,` separated list, e.g. gfx942;gfx950"),
    Setting("", "build", "GPU_ARCHS default for ROCm", key="gpu_archs_rocm"),
    Setting("", "build", "GPU_ARCHS default for CUDA", key="gpu_archs_cuda"),
    Setting("ROCM_PATH", "build", "the ROCm toolchain (else TheRock's rocm-sdk, rocm_legacy_root, hipcc on PATH)",
            accepts="a folder"),
    Setting("", "build", "where a legacy ROCm install lives", key="rocm_legacy_root"),
    Setting("CUDA_HOME", "build", "the CUDA toolkit (else nvcc on PATH)", accepts="a folder"),
    Setting("JA_BUILD_DIR", "build", "the build tree: jax_aiter_build/ (umbrella, FFI shims) and aiter_build/ "
            "(JIT libraries)", key="build_dir", accepts="a folder, relative to the checkout"),
    Setting("JA_FFI_INCLUDE_DIR", "build", "the XLA FFI headers the shims compile against", key="ffi_include_dir",
            accepts="a folder, relative to the checkout"),
    Setting("", "build", "the kernel sources (their revision is part of the JIT identity)", key="kernel_source_dir"),
    Setting("", "build", "the op table: JIT modules, their libraries and instance axes", key="jit_config"),
    Setting("AITER_SYMBOL_VISIBLE", "build", "1: keep every symbol visible (default: -fvisibility=hidden)",
            key="symbol_visible", accepts="1 or 0"),
    Setting("JA_SANITIZE", "build", "sanitizers for the CPU build (address and thread exclude each other)",
            choices=("address", "undefined", "leak", "thread"), accepts="a comma list of"),
    Setting("JA_JIT_LIBS", "build", "build the JIT libraries here, or take them (a consumer: never builds, fails "
            "at once on a miss); auto takes them under CI=true", key="jit_libs", choices=("auto", "build", "take")),
    Setting("JA_TOOLCHAIN_STRICT", "build", "1: a toolchain difference refuses the reuse of JIT libraries "
            "(default: a warning)", key="toolchain_strict", accepts="1 or 0"),
    Setting("JA_CLEAN_JIT", "build", "yes: `make clean` deletes the JIT libraries too (they cost hours)",
            accepts="yes"),
    # --- runtime ------------------------------------------------------------------------------
    Setting("JAX_AITER_LIB_DIR", "runtime", "a folder of libraries the loader tries first (e.g. fetched MHA "
            "libraries)", accepts="a folder"),
    Setting("JA_FETCH_BASE_URL", "runtime", "where JIT-library releases live (a wheel bakes the default in)",
            key="jit_libs_base_url", accepts="https://, http://, file:// or a folder"),
    _n("JA_FETCH_TIMEOUT_S", "runtime", "seconds without data before a fetch attempt is abandoned",
       float, 0.1, 3600, 60.0, "seconds"),
    _n("JA_FETCH_RETRIES", "runtime", "retries of a fetch after the first attempt", int, 0, 20, 4),
    _n("JA_FETCH_BACKOFF_S", "runtime", "first wait before a retry; doubles each retry, at most 60 s",
       float, 0, 600, 2.0, "seconds"),
    _n("JA_FETCH_LOCK_TIMEOUT_S", "runtime", "how long a fetch waits for another fetch into the same folder",
       float, 0, 7 * 86400, 3600.0, "seconds"),
    Setting("JA_POISON_OUTPUTS", "runtime", "1: fill each op output with NaN before the kernel writes it (read "
            "at trace time), so an unwritten output shows", accepts="1"),
    Setting("JA_NUM_THREADS", "runtime", "threads of the CPU kernels", default="the CPU's cores",
            accepts="a positive integer"),
    Setting("JA_CPU_ISA", "runtime", "baseline: the portable CPU attention build even where AVX2+FMA runs",
            accepts="baseline"),
    Setting("JA_GPU_PDL", "runtime", "0: no programmatic dependent launch on CUDA (for A/B benchmarks)",
            accepts="0"),
    Setting("JA_MHA_FWD_SM90", "runtime", "0: the attention forward skips the Hopper (sm_90a) kernels (read on "
            "every call, so a test can compare both paths)", accepts="0"),
    Setting("JA_MHA_BWD_SM90", "runtime", "0: the attention backward skips the Hopper (sm_90a) kernels (read on "
            "every call, so a test can compare both paths)", accepts="0"),
    # --- tests --------------------------------------------------------------------------------
    Setting("JA_TEST_TIER", "tests", "the tier `bash ci/test.sh` and `nox -s tests` run", default="pr",
            choices=("pr", "nightly", "multigpu")),
    _n("JA_TEST_WORKERS", "tests", "xdist workers of a tier's single-device run (default: one per GPU slot on a "
       "GPU host, none on the CPU)", int, 0, 1024, None),
    _n("JA_TEST_RERUNS", "tests", "retries of a failing test (default: 2 on a GPU host, 0 on the CPU)",
       int, 0, 10, None),
    _n("JA_GPU_COUNT", "tests", "the number of GPUs, instead of asking rocminfo and nvidia-smi", int, 0, 1024, None),
    # 0.9 / n must stay >= 0.01 as XLA_PYTHON_CLIENT_MEM_FRACTION with two decimals
    _n("JA_TESTS_PER_GPU", "tests", "GPU slots per GPU: tests that may share one GPU", int, 1, 64, 1),
    _n("JA_GPU_SLOT_TIMEOUT", "tests", "how long to wait for a free GPU slot", float, 0, 7 * 86400, 900.0, "seconds"),
    Setting("JA_GPU_LOCK_DIR", "tests", "where the GPU slot locks live",
            default="$XDG_RUNTIME_DIR/jax-aiter-gpu-locks, else $TMPDIR/jax-aiter-gpu-locks-<uid>", accepts="a folder"),
    Setting("JA_GPU_SLOT", "tests", "0: pytest workers never take a GPU slot; 1: a run without xdist takes one "
            "too; <gpu>:<slot> is set in a process the slot runner pinned", accepts="0 or 1"),
    Setting("JA_GPU_WARMUP", "tests", "0: a pinned CUDA worker does not start the driver in the background",
            accepts="0"),
    Setting("JA_WORKER_FAST_EXIT", "tests", "0: a pinned xdist worker tears everything down at exit (to look for "
            "leaks) instead of ending once it has reported", accepts="0"),
    Setting("JA_FLAKY_JSON", "tests", "where a pytest run writes its report (retries, classified failures, GPU "
            "tests per device); the tier runner sets one per run", default="build/test-results/flaky.json",
            accepts="a file"),
    Setting("JA_GPU_SLOT_RECORD_DIR", "tests", "where each pinned pytest process writes its slot, devices and "
            "times; the slot speed-up measurement sets it", accepts="a folder", internal=True),
    # --- wheels and validation ----------------------------------------------------------------
    Setting("", "wheels and validation", "the Python packages every wheel ships", key="packages"),
    Setting("", "wheels and validation", "what the sdist holds", key="sdist_include"),
    Setting("", "wheels and validation", "fnmatch patterns (paths or file names) the sdist leaves out",
            key="sdist_exclude"),
    Setting("JA_WHEEL_ARCH", "wheels and validation", "the GPU arch a wheel is for, recorded in its build "
            "identity (the JIT libraries must have been built for it)", accepts="one GPU arch"),
    Setting("JA_WHEEL_PLAT_NAME", "wheels and validation", "the wheel's platform tag (checked against the "
            "measured symbol floor)", default="the measured symbol floor", accepts="a manylinux tag"),
    _n("SOURCE_DATE_EPOCH", "wheels and validation", "the timestamp of every wheel member", int, 0, 2**32 - 1,
       None, "seconds since 1970"),
    Setting("", "wheels and validation", "libdeflate level of wheel members (--compress-level overrides)",
            key="wheel_compress_level"),
    Setting("", "wheels and validation", "where `invoke jit.publish` uploads (--to overrides): gh[:OWNER/REPO], "
            "http(s)://, file:// or a folder", key="jit_libs_publish_to"),
    Setting("", "wheels and validation", "zstd level of published JIT-library blobs", key="jit_libs_zstd_level"),
    Setting("", "wheels and validation", "zstd window log of published blobs", key="jit_libs_zstd_window_log"),
    Setting("", "wheels and validation", "bytes per uploaded asset; larger blobs are split",
            key="jit_libs_asset_limit"),
    Setting("JA_WHEELHOUSE", "wheels and validation", "the offline wheels the clean room installs from "
            "(`invoke validate.wheelhouse` fills it)", key="wheelhouse", accepts="a folder"),
    Setting("", "wheels and validation", "the clean room's Python version", key="validation_python"),
    Setting("JA_VALIDATE_PYTHON", "wheels and validation", "the clean room's interpreter",
            default="validation_python found on this host", accepts="a path"),
    Setting("", "wheels and validation", "packages the clean room installs at the lowest version the wheel "
            "declares", key="validation_floor"),
    Setting("", "wheels and validation", "the JAX CUDA plugin (clean room and GPU test sessions)",
            key="validation_plugins_cuda"),
    Setting("", "wheels and validation", "the JAX ROCm plugin (clean room and GPU test sessions)",
            key="validation_plugins_rocm"),
    Setting("", "wheels and validation", "the clean room's report", key="validation_report"),
    Setting("JA_VALIDATION_IMAGE", "wheels and validation", "the validation image's repository (its tag: "
            "ci/validation_image_id.sh)", key="validation_image", accepts="an image repository"),
    # --- CI -----------------------------------------------------------------------------------
    Setting("JA_CONTAINER_IMAGE", "CI", "the job's container image, for the environment report",
            accepts="an image reference", internal=True),
    Setting("JA_ENV_REPORT", "CI", "the environment report ci/build.py wrote first; the later commands of the "
            "build (the release) take it instead of reporting again", accepts="a file", internal=True),
    Setting("JA_ACT_ARTIFACTS", "CI", "the folder where the local stand-ins of the artifact actions keep artifacts "
            "under `nox -s ci_local` (it makes one per run)", accepts="a folder", internal=True),
    Setting("JA_TOOLS_REQUIREMENTS", "CI", "a hash-pinned requirements file scripts/run.sh installs the tools from "
            "(--require-hashes) instead of the `run` group; the jobs that hold a write token set it",
            accepts="a file", internal=True),
    Setting("JA_BASE_REV", "CI", "the revision the convergence gate compares with (`${JA_BASE_REV}` in "
            "ci/build.py)", accepts="a git revision", internal=True),
    Setting("JA_RELEASE_TAG", "CI", "the tag a release upload publishes (`${JA_RELEASE_TAG}` in ci/build.py)",
            accepts="a tag", internal=True),
)

BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS if s.name}
BY_KEY: dict[str, Setting] = {s.key: s for s in SETTINGS if s.key}
# name -> the setting, for every number. Flags that set the same thing are read under the variable's bounds.
NUMERIC: dict[str, Setting] = {s.name: s for s in SETTINGS if s.kind is not None}


class SettingError(ValueError):
    """A setting's value is not usable; the message names it, the value and the accepted range."""


def number(name: str, text: str, flag: str | None = None) -> int | float:
    """Parse `text` as the setting `name` (its table entry decides type and range)."""
    spec = NUMERIC[name]
    shown = flag or name
    try:
        value = spec.kind(str(text).strip())
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or not spec.lo <= value <= spec.hi:
        raise SettingError(f"{shown}={text!r} is not valid: give {spec.range_text()}"
                           + (f" (default {spec.show(spec.default)})" if spec.default is not None else ""))
    return value


def from_env(name: str, env: Mapping[str, str] | None = None) -> int | float | None:
    """The setting from the environment (blank or unset: its default)."""
    env = os.environ if env is None else env
    text = env.get(name)
    if text is None or not text.strip():
        return NUMERIC[name].default
    return number(name, text)


def flag_type(name: str, flag: str):
    """An argparse `type=` that parses a flag under the bounds of the setting it overrides."""
    def parse(text: str):
        import argparse

        try:
            return number(name, text, flag)
        except SettingError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    parse.__name__ = flag  # argparse names it in "invalid <name> value"
    return parse
