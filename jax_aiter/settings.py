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
standard library (and jax_aiter.remedies, the doors a meaning names, which is standard library only too).
"""
from __future__ import annotations

import math
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from jax_aiter import remedies
from jax_aiter.download import folder_lock

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
    rule: str = ""            # how check() reads a value that is neither a number nor a choice: one of RULES
    config_key: bool = False  # a change regenerates build/config.mk: the Makefile's CFG_KEY_NOW names it (tested)

    def show(self, value: float) -> str:
        return str(int(value)) if self.kind is int else f"{value:g}"

    def range_text(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        return (f"{'an integer' if self.kind is int else 'a number'} from {self.show(self.lo)} "
                f"to {self.show(self.hi)}{unit}")

    def accepted(self) -> str:
        """What the setting accepts, in words."""
        if self.kind is not None:
            return self.range_text()
        if self.rule in RULE_TEXT and not self.accepts:
            return RULE_TEXT[self.rule]
        return f"{self.accepts} {', '.join(self.choices)}".strip() if self.choices else self.accepts


def _n(name: str, group: str, meaning: str, kind: type, lo: float, hi: float, default: float | None,
       unit: str = "", internal: bool = False, key: str = "") -> Setting:
    return Setting(name, group, meaning, key=key, default=default, kind=kind, lo=lo, hi=hi, unit=unit,
                   internal=internal)


# The attention kernel families, as the API's implementation= and JA_MHA_IMPLEMENTATION spell them; a family's
# index is its code in the C ABI (JaMhaImpl, csrc/include/ja/kernels/mha.h; tests/build/test_abi_constants.py).
MHA_IMPLEMENTATIONS = ("auto", "cpu", "simt", "mma", "decode", "sm90")

# GPU arch names GPU_ARCHS (and gpu_archs_rocm, gpu_archs_cuda, JA_WHEEL_ARCH) accept, the one home of their
# spelling (the native build's toolchain check reads these too). ROCm's gfx<digits><hex> with optional target
# features (gfx942:xnack+); CUDA's sm_<2-3 digits>, or the bare number (90) the CUDA toolchain writes as sm_90,
# with an optional suffix: `a`, the arch-specific features of one GPU (sm_90a, sm_100a), or `f`, CUDA 12.9+'s
# family-specific code that runs on every GPU of a family (sm_100f). Which numbers take which suffix (nvcc 13
# takes sm_90a and sm_100f, refuses sm_90f and sm_80a) is the compiler's to say: the toolchain asks it.
ROCM_ARCH = r"gfx[0-9]{2,4}[0-9a-f]?(:(sramecc|xnack)[+-])*"
CUDA_ARCH = r"(sm_)?[0-9]{2,3}[af]?"
ARCH_NAME = re.compile(f"{ROCM_ARCH}|{CUDA_ARCH}")
FLAG_VALUES = ("1", "0", "true", "false", "yes", "no", "on", "off")
# What each rule accepts, in words (Setting.accepts overrides it where a setting says more).
RULE_TEXT = {
    "flag": "1 or 0 (also true/false, yes/no, on/off)",
    "archs": "a `;` or `,` separated list of GPU arch names (gfx950, gfx942:xnack+, sm_90, sm_90a, sm_100f)",
    "folder": "an existing folder",
    "absolute": "an absolute path",
    "inside": "a path relative to the checkout, inside it",
    "build": "a path relative to the checkout, inside it (through a symlink there, or from the environment anywhere: "
             "to an empty folder or a build tree)",
    "list": "a list of strings",
    "text": "a string",
}

# The build tree's library folders under JA_BUILD_DIR: the loader searches them in a checkout, and the build tooling's
# table of every build folder takes them from here.
LIBRARY_DIRS = {"umbrella": "jax_aiter_build",  # libjax_aiter.so and the FFI shims (make, make ja_mods)
                "jit": "aiter_build"}           # the JIT libraries and their build record
CONFIG_MK = "config.mk"  # make's toolchain and flags, the first thing a build writes in its build tree


SETTINGS: tuple[Setting, ...] = (
    # --- build --------------------------------------------------------------------------------
    Setting("JA_ROOT_DIR", "build", "the checkout the tooling (and a checkout's runtime) works on",
            default="the folder holding the code", rule="folder"),
    Setting("JA_BACKEND", "build", "what to build for and test on (auto: the first of ROCm and CUDA whose compiler "
            "builds for the archs it would target, else the CPU; resolved once per run); with JA_GPU_COUNT, rocm "
            "makes the stand-in GPUs ROCm ones",
            key="backend", choices=("auto", "cpu", "cuda", "rocm"), accepts="one of", config_key=True),
    Setting("GPU_ARCHS", "build", "the GPU archs to compile for (unset: the archs of the GPUs present, from "
            "rocminfo or nvidia-smi, else gpu_archs_rocm or gpu_archs_cuda)", rule="archs", config_key=True),
    Setting("", "build", "the ROCm archs: the ROCm lane's, CI's, and GPU_ARCHS' default when no GPU is present",
            key="gpu_archs_rocm", rule="archs"),
    Setting("", "build", "the CUDA archs: the CUDA lane's, CI's, and GPU_ARCHS' default when no GPU is present",
            key="gpu_archs_cuda", rule="archs"),
    Setting("ROCM_PATH", "build", "the ROCm toolchain (else TheRock's rocm-sdk, rocm_legacy_root, hipcc on PATH)",
            accepts="a folder", config_key=True),
    Setting("", "build", "where a legacy ROCm install lives", key="rocm_legacy_root", rule="text", accepts="a path"),
    Setting("CUDA_HOME", "build", "the CUDA toolkit (else nvcc on PATH)", accepts="a folder", config_key=True),
    Setting("JA_BUILD_DIR", "build", f"the build tree: {LIBRARY_DIRS['umbrella']}/ (umbrella, FFI shims) and "
            f"{LIBRARY_DIRS['jit']}/ (JIT libraries)", key="build_dir", rule="build"),
    Setting("JA_FFI_INCLUDE_DIR", "build", "the XLA FFI headers the shims compile against", key="ffi_include_dir",
            rule="inside", config_key=True),
    Setting("", "build", "the kernel sources (their revision is part of the JIT identity)", key="kernel_source_dir",
            rule="inside"),
    Setting("", "build", "the op table: JIT modules, their libraries and instance axes", key="jit_config",
            rule="inside"),
    Setting("AITER_SYMBOL_VISIBLE", "build", "1: keep every symbol visible (default: -fvisibility=hidden)",
            key="symbol_visible", rule="flag", config_key=True),
    Setting("JA_SANITIZE", "build", "sanitizers for the CPU build (address and thread exclude each other)",
            choices=("address", "undefined", "leak", "thread"), accepts="a `,` or `;` separated list of", rule="comma",
            config_key=True),
    Setting("JA_JIT_LIBS", "build", "build the JIT libraries here, or take them (a consumer: never builds, fails "
            "at once on a miss); auto takes them under CI=true", key="jit_libs", choices=("auto", "build", "take"),
            accepts="one of"),
    Setting("JA_TOOLCHAIN_STRICT", "build", "1: a toolchain difference refuses the reuse of JIT libraries "
            "(default: a warning)", key="toolchain_strict", rule="flag"),
    Setting("JA_COMPILER_CACHE", "build", "auto: every native and JIT compile goes through ccache (the build "
            "dependency group installs it), shared by this user's checkouts; off: compile without it",
            default="auto", choices=("auto", "off"), accepts="one of"),
    Setting("JA_COMPILER_CACHE_DIR", "build", "the compiler cache's folder (made mode 0700; refused when it is a "
            "symlink, another user's, writable by others, or not a folder)", default="$XDG_CACHE_HOME/jax-aiter/ccache",
            accepts="an absolute path to a folder of your own", rule="absolute"),
    Setting("JA_CLEAN_JIT", "build", "yes: `make clean` deletes the JIT libraries too (they cost hours)",
            choices=("yes", "no"), accepts="one of"),
    # --- runtime ------------------------------------------------------------------------------
    Setting("JAX_AITER_LIB_DIR", "runtime", "a folder of libraries the loader tries first (e.g. fetched MHA "
            "libraries); a folder that does not exist is an error, not a silent fall-back", rule="folder"),
    Setting("JA_FETCH_BASE_URL", "runtime", "where JIT-library releases live (a wheel bakes the default in)",
            key="jit_libs_base_url", rule="text", accepts="https://, http://, file:// or a folder"),
    _n("JA_FETCH_TIMEOUT_S", "runtime", "seconds without data before a fetch attempt is abandoned; also the window "
       "JA_FETCH_MIN_RATE is judged over", float, 0.1, 3600, 60.0, "seconds"),
    _n("JA_FETCH_MIN_RATE", "runtime", "bytes per second a download must average over each JA_FETCH_TIMEOUT_S "
       "seconds, or the attempt is abandoned and retried (a server trickling bytes; 0: no minimum)", int, 0, 1 << 40,
       10_000, "bytes per second"),
    _n("JA_FETCH_DEADLINE_S", "runtime", "seconds one fetch may take, its retries and their waits included (a wait "
       "for another fetch's lock not counted); then it stops, installing nothing", float, 1, 7 * 86400, 7200.0,
       "seconds"),
    _n("JA_FETCH_RETRIES", "runtime", "retries of a fetch after the first attempt", int, 0, 20, 4),
    _n("JA_FETCH_BACKOFF_S", "runtime", "first wait before a retry; doubles each retry, at most 60 s",
       float, 0, 600, 2.0, "seconds"),
    _n("JA_FETCH_LOCK_TIMEOUT_S", "runtime", "how long a fetch waits for another fetch into the same folder",
       float, 0, 7 * 86400, 3600.0, "seconds"),
    Setting("JA_POISON_OUTPUTS", "runtime", "1: fill each op output with NaN before the kernel writes it (read "
            "at trace time), so an unwritten output shows", choices=("1", "0"), accepts="one of"),
    _n("JA_NUM_THREADS", "runtime", "threads of the CPU kernels (default: the CPU's cores)", int, 1, 4096, None),
    _n("JA_KERNEL_MIN_BYTES", "runtime", "RMSNorm, fused-add RMSNorm and SiLU-and-mul call their kernel for an x "
       "of at least this many bytes (one call: per device, a vmapped batch folded in); smaller ones are written "
       "in jax.numpy, which XLA fuses with the ops around them (0: always the kernel; read at trace time)",
       int, 0, 1 << 40, 1 << 20, "bytes"),
    Setting("JA_CPU_ISA", "runtime", "baseline: the portable CPU attention build even where AVX2+FMA runs",
            choices=("baseline",), accepts="one of"),
    Setting("JA_GPU_PDL", "runtime", "0: no programmatic dependent launch on CUDA (for A/B benchmarks)",
            choices=("0", "1"), accepts="one of"),
    Setting("JA_MHA_IMPLEMENTATION", "runtime", "the attention kernel family of every call that does not pass "
            "implementation= (read at trace time; docs/attention.md, \"Kernel families\"): auto chooses, a family "
            "runs the call or refuses it naming why", default="auto", choices=MHA_IMPLEMENTATIONS, accepts="one of"),
    Setting("JA_MHA_FWD_DECODE_TMA", "runtime", "0: the split-KV decode forward loads K and V with cp.async "
            "instead of TMA on sm_90 (read on every call, so a test can compare both paths)", choices=("0", "1"),
            accepts="one of"),
    Setting("JA_MHA_FWD_DECODE_CLUSTER", "runtime", "0: the split-KV decode forward merges its splits with a "
            "second kernel instead of in a thread-block cluster on sm_90 (read on every call, so a test can "
            "compare both paths)", choices=("0", "1"), accepts="one of"),
    # --- tests --------------------------------------------------------------------------------
    Setting("JA_TEST_TIER", "tests", "the tier `bash ci/test.sh` and `nox -s tests` run", default="pr",
            choices=("pr", "nightly", "multigpu"), accepts="one of"),
    _n("JA_TEST_WORKERS", "tests", "xdist workers of a tier's single-device run (default: one per GPU slot on a "
       "GPU host, none on the CPU)", int, 0, 1024, None),
    _n("JA_TEST_RERUNS", "tests", "retries of a failing test (default: 2 on a GPU host, 0 on the CPU)",
       int, 0, 10, None),
    _n("JA_GPU_COUNT", "tests", "the number of GPUs, instead of asking rocminfo and nvidia-smi", int, 0, 1024, None),
    # 0.9 / n must stay >= 0.01 as XLA_PYTHON_CLIENT_MEM_FRACTION with two decimals
    _n("JA_TESTS_PER_GPU", "tests", "GPU slots per GPU: tests that may share one GPU", int, 1, 64, 1),
    _n("JA_GPU_SLOT_TIMEOUT", "tests", "how long to wait for a free GPU slot", float, 0, 7 * 86400, 900.0, "seconds"),
    Setting("JA_KFD_PATH", "tests", "the AMD GPU driver's device the GPU count and the arch detection look for "
            "before asking rocminfo (no such device: no AMD GPU); a test points it at a stand-in",
            default="/dev/kfd", accepts="a path", internal=True),
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
    Setting("", "wheels and validation", "the Python packages every wheel ships", key="packages", rule="list"),
    Setting("", "wheels and validation", "what the sdist holds", key="sdist_include", rule="list"),
    Setting("", "wheels and validation", "fnmatch patterns (paths or file names) the sdist leaves out",
            key="sdist_exclude", rule="list"),
    Setting("JA_WHEEL_ARCH", "wheels and validation", "the GPU arch a wheel is for, recorded in its build "
            "identity (the JIT libraries must have been built for it)", rule="archs", accepts="one GPU arch"),
    Setting("JA_WHEEL_PLAT_NAME", "wheels and validation", "the wheel's platform tag (every front-end refuses one "
            "older than the measured symbol floor)", default="the measured symbol floor", accepts="a manylinux tag"),
    _n("SOURCE_DATE_EPOCH", "wheels and validation", "the timestamp of every wheel member", int, 0, 2**32 - 1,
       None, "seconds since 1970"),
    _n("", "wheels and validation", "libdeflate level of wheel members (--compress-level overrides)", int, 0, 12,
       None, key="wheel_compress_level"),
    Setting("", "wheels and validation", "where `invoke jit.publish` uploads (--to overrides): gh[:OWNER/REPO], "
            "http(s)://, file:// or a folder", key="jit_libs_publish_to", rule="text"),
    _n("", "wheels and validation", "zstd level of published JIT-library blobs", int, 1, 22, None,
       key="jit_libs_zstd_level"),
    _n("", "wheels and validation", "zstd window log of published blobs", int, 10, 31, None,
       key="jit_libs_zstd_window_log"),
    _n("", "wheels and validation", "bytes per uploaded asset; larger blobs are split", int, 1, 2**31 - 1, None,
       "bytes", key="jit_libs_asset_limit"),
    Setting("JA_WHEELHOUSE", "wheels and validation", "the offline wheels the clean room installs from "
            f"(`{remedies.door('wheelhouse')}` fills it)", key="wheelhouse", rule="inside"),
    Setting("JA_VALIDATE_PYTHON", "wheels and validation", "the clean room's interpreter",
            default="the Python of requires-python's floor found on this host", accepts="a path"),
    Setting("", "wheels and validation", "packages the clean room installs at the lowest version the wheel "
            "declares", key="validation_floor", rule="list"),
    Setting("", "wheels and validation", "the JAX CUDA plugin (clean room and GPU test sessions)",
            key="validation_plugins_cuda", rule="list"),
    Setting("", "wheels and validation", "the JAX ROCm plugin (clean room and GPU test sessions)",
            key="validation_plugins_rocm", rule="list"),
    Setting("", "wheels and validation", "the clean room's report", key="validation_report", rule="inside"),
    Setting("JA_VALIDATION_IMAGE", "wheels and validation", "the validation image's repository (its tag: "
            "ci/validation_image_id.sh)", key="validation_image", rule="text", accepts="an image repository"),
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
NUMERIC: dict[str, Setting] = {s.name: s for s in SETTINGS if s.kind is not None and s.name}
ENVIRONMENT = "from the environment"


class SettingError(ValueError):
    """A setting's value is not usable; the message names it, the value, what is allowed and where it came from."""


def load_toml(path: Path) -> dict:
    """A TOML file (pyproject.toml) parsed; SettingError naming the file and tomllib's own line and column when it is
    not valid TOML (the tooling and the runtime's version read it through here: a raw traceback named neither)."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:  # a duplicate key is one too: "Cannot overwrite a value (at line ...)"
        raise SettingError(f"{path} is not valid TOML: {e} (a syntax error, or a key or table given twice); fix the "
                           "file (https://toml.io)") from None


def _kind(value: object) -> str:
    """What a value from TOML is, in words (a string, an integer, true or false, ...)."""
    return {bool: "true or false", str: "a string", int: "an integer", float: "a fraction", list: "a list",
            dict: "a table"}.get(type(value), f"a {type(value).__name__}")


def _fail(shown: str, value: object, accepted: str, where: str, why: str = "") -> SettingError:
    at = f" ({where})" if where else ""
    return SettingError(f"{shown}={value!r} is not valid: {why + '; ' if why else ''}give {accepted}{at}")


def _number(spec: Setting, value: object, shown: str, where: str, typed: bool = False) -> int | float:
    """`value` parsed and range-checked; `typed` (a pyproject value): it must be a TOML number already, an integer
    for an integer setting, as a flag must be true or false (a string "1000" is not 1000)."""
    wrong = (f"{_kind(value)}, not {'an integer' if spec.kind is int else 'a number'}"
             if typed and (isinstance(value, bool) or not isinstance(value, int if spec.kind is int else (int, float)))
             else "")
    if wrong or isinstance(value, bool) or not isinstance(value, (str, int, float)):
        parsed = None
    else:
        try:
            parsed = spec.kind(str(value).strip())
        except ValueError:
            parsed = None
    if parsed is None or not math.isfinite(parsed) or not spec.lo <= parsed <= spec.hi:
        default = f" (default {spec.show(spec.default)})" if spec.default is not None else ""
        raise _fail(shown, value, spec.range_text() + default, where, wrong)
    return parsed


def number(name: str, text: str, flag: str | None = None) -> int | float:
    """Parse `text` as the setting `name` (its table entry decides type and range)."""
    return _number(NUMERIC[name], text, flag or name, "" if flag else ENVIRONMENT)


def _symlink(base: Path, text: str) -> Path | None:
    """The first symlink on the way from the checkout `base` to `text` inside it (None: no symlink)."""
    here = base
    for part in Path(os.path.normpath(text)).parts:
        here = here / part
        if here.is_symlink():
            return here
    return None


def _inside(text: str, root: Path | None) -> str:
    """Why the relative path `text` is not inside the checkout `root` ("" when it is), as written: a symlink inside
    the checkout (build/ -> a bigger disk) is the checkout's own, not a way out of it."""
    if Path(text).is_absolute():
        return "it is absolute"
    if Path(os.path.normpath(text)).parts[:1] == ("..",):
        return f"it leads outside the checkout {(root or Path.cwd()).resolve()}"
    return ""


def _foreign(folder: Path) -> str:
    """Why `folder` cannot take a build tree ("" when it can): it must be absent, empty or a build tree already, so a
    build never mixes its files with others (and `make clean` never deletes them)."""
    try:
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        return ""
    except OSError as e:
        return f"{folder} cannot be read ({e.strerror or e})"
    names = [n for n in names if not n.startswith(folder_lock.NOTE)]  # the build tree's lock note: a build's own
    if not names or {*LIBRARY_DIRS.values(), CONFIG_MK} & set(names):
        return ""
    shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    return (f"{folder} holds files that are not a build ({shown}), which a build would mix with its own and "
            "`make clean` would delete")


def _build_tree(text: str, root: Path | None, from_env: bool) -> str:
    """Why `text` cannot be the build tree ("" when it can): inside the checkout, as pyproject's build_dir must be, or
    anywhere from the environment (a test's own build). Where it ends up outside the checkout (from the environment,
    or through a symlink: build/ -> a bigger disk) the folder must be empty or a build tree."""
    why = _inside(text, root)
    if why and not from_env:
        return why
    base = (root or Path.cwd()).resolve()
    target = (base / text).resolve()
    if target == base or base in target.parents:
        return ""
    link = None if why else _symlink(base, text)
    where = (f"{link.relative_to(base)} is a symlink to {os.readlink(link)}, so the path leads to {target}, outside "
             f"the checkout {base}" if link else f"it is outside the checkout {base}")
    foreign = _foreign(target)
    return f"{where}; {foreign}" if foreign else ""


def _why(spec: Setting, value: object, from_env: bool, root: Path | None) -> str | None:
    """None when `value` is acceptable for `spec`, else why not ("" when the accepted text says it all)."""
    rule = spec.rule
    if rule == "list":
        return None if isinstance(value, list) and all(isinstance(v, str) for v in value) else ""
    if not isinstance(value, str):
        return None if rule == "flag" and isinstance(value, bool) else f"{_kind(value)}, not a string"
    text = value.strip()
    if rule in ("inside", "build", "folder", "absolute") and text != value:  # a path: its spaces would be part of it
        return f"it has spaces around it (did you mean {text!r}?)"
    if rule == "comma":
        bad = [v for v in text.replace(";", ",").split(",") if v.strip() not in spec.choices]
        return f"{', '.join(map(repr, bad))} not one of them" if bad else None
    if spec.choices:
        return None if text in spec.choices else ""
    if rule == "flag":
        return None if text.lower() in FLAG_VALUES else ""
    if rule == "archs":
        entries = [e.strip() for e in text.replace(";", ",").split(",")]
        bad = [e for e in entries if not ARCH_NAME.fullmatch(e)]
        if spec.accepts == "one GPU arch" and len(entries) > 1:
            return "more than one arch"
        return (f"{', '.join(repr(e) if e else 'an empty entry' for e in bad)} "
                f"{'is' if len(bad) == 1 else 'are'} not a GPU arch name") if bad else None
    if rule == "folder":
        return None if Path(text).is_dir() else ("it is not a folder" if Path(text).exists() else "it does not exist")
    if rule == "absolute":  # relative to what? every process that reads it runs in another folder
        return None if Path(text).is_absolute() else "it is relative, so each build would make a cache where it runs"
    if rule == "inside" and not from_env:
        return _inside(text, root) or None
    if rule == "build":
        return _build_tree(text, root, from_env) or None
    return None if text or rule != "text" else "it is empty"


def check(spec: Setting, value: object, where: str = ENVIRONMENT, root: Path | None = None) -> object:
    """`value` of setting `spec` from `where` (ENVIRONMENT, or the pyproject.toml it is in; `root`: its checkout),
    checked against the table; the value, a number parsed. SettingError names the variable or key, the value,
    what is allowed and where the value came from."""
    from_env = where == ENVIRONMENT
    shown = spec.name if from_env else f"[tool.jax-aiter] {spec.key}"
    if spec.kind is not None:
        return _number(spec, value, shown, where, typed=not from_env)
    why = _why(spec, value, from_env, root)
    if why is not None:
        raise _fail(shown, value, spec.accepted(), where, why)
    return value


def check_environment(env: Mapping[str, str] | None = None, group: str | None = None,
                      root: Path | None = None) -> None:
    """Check every variable of the table (of `group`) set, not blank, in `env` (paths relative to the checkout
    `root`); the first bad one raises."""
    env = os.environ if env is None else env
    for spec in SETTINGS:
        checked = spec.kind or spec.choices or spec.rule
        if checked and spec.name and (group is None or spec.group == group) and (env.get(spec.name) or "").strip():
            check(spec, env[spec.name], root=root)


def check_pyproject(table: Mapping[str, object], path: Path) -> None:
    """Check a pyproject ``[tool.jax-aiter]`` table: every key known, every value as the table says."""
    unknown = sorted(set(table) - set(BY_KEY))
    if unknown:
        raise SettingError(f"unknown key(s) {', '.join(unknown)} under [tool.jax-aiter] in {path}: the known keys "
                           f"are {', '.join(sorted(BY_KEY))} (docs/settings.md)")
    for key, value in table.items():
        check(BY_KEY[key], value, f"in {path}", path.parent)


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
