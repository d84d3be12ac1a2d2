"""Backend and toolchain detection: which compiler builds the GPU code, for which archs.

ROCm follows the reference recipe: a legacy image has ROCM_PATH or /opt/rocm;
TheRock has no /opt/rocm, so the root comes from ``rocm-sdk path --root`` and
``hipcc`` from PATH. CUDA is nvcc from CUDA_HOME or PATH. ``auto`` picks the first
of ROCm and CUDA whose compiler builds for the archs it would target (GPU_ARCHS, the
GPUs present, else the default: Debian's hipcc 5.2 refuses gfx950), else the CPU; a
host without /dev/kfd has no AMD GPU, so rocminfo is not asked there. One run resolves
``auto`` once (jatools.native.build.resolved_backend; make's config.mk for `make jit`).
Every decision is recorded in ``Toolchain.how`` so the build can print why it chose
what it chose.
"""
from __future__ import annotations

import argparse
import dataclasses
import errno
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from jatools import atomic_write, config
from jax_aiter import host_gpus, op_table
from jax_aiter import settings as registry


class ToolchainError(RuntimeError):
    """A toolchain problem the user can fix; the message says how."""


@dataclass(frozen=True)
class Toolchain:
    backend: str  # cpu | cuda | rocm
    cxx: str
    cxx_version: str
    gpu_compiler: str | None = None
    gpu_compiler_version: str | None = None
    platform_version: str | None = None  # CUDA or ROCm release
    rocm_root: str | None = None
    cuda_home: str | None = None
    archs: tuple[str, ...] = ()
    how: tuple[str, ...] = ()

    def identity(self) -> dict:
        """The toolchain part of a build identity (paths left out: they are machine-specific)."""
        return {"backend": self.backend, "cxx_version": self.cxx_version,
                "gpu_compiler": Path(self.gpu_compiler).name if self.gpu_compiler else None,
                "gpu_compiler_version": self.gpu_compiler_version, "platform_version": self.platform_version}


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=60)


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0].strip() if text.strip() else ""


def cxx_version(cxx: str) -> str:
    try:
        out = _run([cxx, "-dumpfullversion", "-dumpversion"])
    except FileNotFoundError as e:
        raise ToolchainError(f"C++ compiler {cxx!r} not found; install g++ (apt-get install g++) or set CXX") from e
    return f"{Path(cxx).name} {out.stdout.strip()}"


def _version(tool: str, pattern: str) -> str:
    """What `tool --version` prints that `pattern` captures, else its first line."""
    text = _run([tool, "--version"]).stdout
    m = re.search(pattern, text)
    return m.group(1) if m else _first_line(text)


def nvcc_version(nvcc: str) -> str:
    return _version(nvcc, r"release (\d+\.\d+)")


def hipcc_version(hipcc: str) -> str:
    return _version(hipcc, r"HIP version:\s*([\w.\-]+)")


def rocm_sdk_version(env: dict[str, str], which=shutil.which) -> str | None:
    """TheRock's release (`rocm-sdk version`), or None where rocm-sdk is absent or fails."""
    rocm_sdk = which("rocm-sdk", path=env.get("PATH"))
    if not rocm_sdk:
        return None
    out = _run([rocm_sdk, "version"])
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


def find_rocm(env: dict[str, str], legacy_root: str, which=shutil.which) -> tuple[str | None, str | None, list[str]]:
    """Return (rocm_root, hipcc, notes). rocm_root may be None for a bare hipcc on PATH."""
    rocm_path = env.get("ROCM_PATH")
    if rocm_path and Path(rocm_path, "bin", "hipcc").exists():
        return rocm_path, str(Path(rocm_path, "bin", "hipcc")), [f"ROCm from ROCM_PATH={rocm_path}"]
    notes = [f"ROCM_PATH={rocm_path} has no bin/hipcc; looking further"] if rocm_path else []
    legacy_hipcc = Path(legacy_root, "bin", "hipcc")
    if legacy_hipcc.exists():
        return legacy_root, str(legacy_hipcc), [*notes, f"ROCm from legacy image root {legacy_root}"]
    rocm_sdk, hipcc = (which(tool, path=env.get("PATH")) for tool in ("rocm-sdk", "hipcc"))
    if rocm_sdk:
        out = _run([rocm_sdk, "path", "--root"])
        root = out.stdout.strip()
        if out.returncode != 0 or not root:
            raise ToolchainError(f"`rocm-sdk path --root` failed (exit {out.returncode}): {out.stderr.strip()}; "
                                 "repair the TheRock install (pip install rocm[devel]) or set ROCM_PATH")
        if not hipcc:
            raise ToolchainError(f"TheRock root {root} found by rocm-sdk, but hipcc is not on PATH; "
                                 "activate the TheRock environment or add its bin folder to PATH")
        return root, hipcc, [*notes, f"ROCm from TheRock: `rocm-sdk path --root` = {root}, hipcc from PATH ({hipcc})"]
    return None, hipcc, [*notes, f"ROCm from hipcc on PATH ({hipcc}), no ROCm root"] if hipcc else notes


def find_nvcc(env: dict[str, str], which=shutil.which) -> tuple[str | None, list[str]]:
    cuda_home = env.get("CUDA_HOME") or env.get("CUDA_PATH")
    if cuda_home and Path(cuda_home, "bin", "nvcc").exists():
        return str(Path(cuda_home, "bin", "nvcc")), [f"CUDA from CUDA_HOME={cuda_home}"]
    nvcc = which("nvcc", path=env.get("PATH"))
    return nvcc, ([f"CUDA from nvcc on PATH ({nvcc})"] if nvcc else [])


def normalise_cuda_arch(arch: str) -> str:
    """sm_<number>[a|f] from a GPU_ARCHS entry (90, 90a, sm_100f): the spelling jax_aiter/settings.py accepts."""
    a = arch.strip()
    if not re.fullmatch(registry.CUDA_ARCH, a):
        raise ToolchainError(f"GPU arch {arch!r} is not a CUDA arch; CUDA archs look like sm_90, sm_90a or sm_100f")
    return a if a.startswith("sm_") else f"sm_{a}"


def cuda_arch_flag(arch: str) -> str:
    """nvcc's code-generation flag for one arch: sm_90a -> arch=compute_90a,code=sm_90a (PTX and SASS alike)."""
    return f"--generate-code=arch=compute_{arch[3:]},code={arch}"


def check_cuda_archs(nvcc: str, archs: list[str]) -> None:
    """Ask nvcc whether it generates code for each arch: a --dryrun, which checks the flags without compiling
    (milliseconds). --list-gpu-code alone would not do: it lists sm_90 and sm_100 but not the a/f variants nvcc 13
    takes (sm_90a, sm_100f); it only names the choices when an arch is refused."""
    for a in archs:
        out = _run([nvcc, "--dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull, cuda_arch_flag(a)])
        if out.returncode != 0:
            reason = _first_line(out.stderr) or f"exit {out.returncode}"
            listed = " ".join(_run([nvcc, "--list-gpu-code"]).stdout.split())
            raise ToolchainError(f"GPU arch {a} is refused by {nvcc}: {reason}; set GPU_ARCHS to an arch it "
                                 f"supports ({listed or 'see nvcc --list-gpu-code'}, with an a or f suffix where "
                                 "the CUDA docs give one)")


def rocm_arch_refusal(hipcc: str, arch: str, env: dict[str, str]) -> str | None:
    """Why `hipcc` refuses to compile an empty kernel for `arch` (its first error line), or None when it compiles
    it: the one probe of a ROCm arch (check_rocm_archs, and compile-only's choice of arch in native/build.py)."""
    with tempfile.TemporaryDirectory(prefix="ja-arch-probe-") as tmp:
        src = Path(tmp, "probe.hip")
        src.write_text("__global__ void ja_probe() {}\n")
        out = subprocess.run([hipcc, "-x", "hip", f"--offload-arch={arch}", "--cuda-device-only", "-c", str(src),
                              "-o", str(Path(tmp, "p.o"))], check=False, capture_output=True, text=True,
                             timeout=300, env={**os.environ, **env, "HIP_PLATFORM": "amd"})
    return None if out.returncode == 0 else (_first_line(out.stderr) or f"exit {out.returncode}")


def check_rocm_archs(hipcc: str, archs: list[str], env: dict[str, str]) -> None:
    """Ask the HIP compiler to compile an empty file for each arch; a rejection names the arch."""
    for a in archs:
        if not re.fullmatch(registry.ROCM_ARCH, a):
            raise ToolchainError(f"GPU arch {a!r} is not a ROCm arch; ROCm archs look like gfx950")
        if (reason := rocm_arch_refusal(hipcc, a, env)) is not None:
            raise ToolchainError(f"GPU arch {a} is rejected by {hipcc}: {reason}; "
                                 "use an arch this ROCm release supports (e.g. gfx90a, gfx942) or a newer ROCm")


def present_archs(backend: str, env: dict[str, str]) -> tuple[tuple[str, ...], str]:
    """The archs of the GPUs on this host for `backend` (none when its tool is absent or fails) and a note saying
    where they came from, or why none did."""
    tool = host_gpus.ARCH_PROBES[backend][0][0]
    if backend == "rocm" and (none := host_gpus.no_amd_gpu(env)):
        return (), f"GPU_ARCHS unset and {none}: the default archs"
    archs = host_gpus.gpu_archs(backend, env)
    if not isinstance(archs, tuple):
        return (), f"GPU_ARCHS unset and {archs or f'no {tool} on PATH'}: the default archs"
    return archs, (f"GPU_ARCHS unset: {';'.join(archs)}, the GPUs present ({tool})" if archs
                   else f"GPU_ARCHS unset and {tool} lists no GPU: the default archs")


def detect(settings: config.Settings, env: dict[str, str] | None = None, which=shutil.which,
           check_archs: bool = True) -> Toolchain:
    """The toolchain of settings.backend; for `auto`, the first of ROCm, CUDA that can build for the archs it would
    target (asked of its compiler, whatever `check_archs` says), else the CPU, with why in `how`."""
    env = dict(os.environ if env is None else env)
    cxx = env.get("CXX", "g++")
    if settings.backend != "auto":
        return _detect(settings.backend, settings, env, which, cxx, check_archs, [])
    passed: list[str] = []  # why each earlier backend was not taken
    notes: list[str] = []   # what each attempt found (where its archs came from)
    for backend in ("rocm", "cuda"):
        attempt: list[str] = []
        try:
            tc = _detect(backend, settings, env, which, cxx, True, attempt)
        except _Absent as e:
            passed.append(e.note)
            continue
        except ToolchainError as e:
            passed.append(f"{backend}: {e}")
            notes += attempt
            continue
        return dataclasses.replace(tc, how=(*notes, *tc.how, f"JA_BACKEND=auto resolved to {backend}, the first "
                                            f"backend that builds for {';'.join(tc.archs)}"
                                            + (f" ({'; '.join(passed)})" if passed else "")))
    return Toolchain("cpu", cxx, cxx_version(cxx),
                     how=(*notes, f"JA_BACKEND=auto resolved to cpu ({'; '.join(passed)})"))


class _Absent(ToolchainError):
    """The backend's compiler is not installed (for auto: try the next backend; `note` says so in a few words)."""

    def __init__(self, message: str, note: str):
        super().__init__(message)
        self.note = note


def _detect(backend: str, settings: config.Settings, env: dict[str, str], which, cxx: str, check_archs: bool,
            how: list[str]) -> Toolchain:
    """The toolchain of one backend (cpu, cuda or rocm): its compiler, archs (GPU_ARCHS, else the GPUs present, else
    the default) and versions; _Absent when its compiler is not installed, ToolchainError when it refuses an arch.
    What it finds is appended to `how` as it goes (so a caller has it when it fails too)."""
    if backend == "cpu":
        return Toolchain("cpu", cxx, cxx_version(cxx), how=tuple(how))
    if backend == "rocm":
        rocm_root, compiler, notes = find_rocm(env, settings.raw.get("rocm_legacy_root", "/opt/rocm"), which)
        if not compiler:
            raise _Absent("JA_BACKEND=rocm but no ROCm toolchain was found (no ROCM_PATH, no /opt/rocm, no rocm-sdk, "
                          "no hipcc on PATH); install ROCm or TheRock (pip install rocm[devel]), or use JA_BACKEND=cpu",
                          "rocm: no ROCm toolchain")
    else:
        compiler, notes = find_nvcc(env, which)
        rocm_root = None
        if not compiler:
            raise _Absent("JA_BACKEND=cuda but nvcc was not found on PATH or in CUDA_HOME; install the CUDA toolkit "
                          "or set CUDA_HOME, or use JA_BACKEND=cpu", "cuda: no nvcc")
    how += notes
    archs = list(settings.gpu_archs or ())
    if not archs:
        present, note = present_archs(backend, env)
        archs = list(present or settings.default_archs(backend))
        how.append(note)
    cxxv = cxx_version(cxx)
    if backend == "cuda":
        archs = [normalise_cuda_arch(a) for a in archs]
    archs = list(config.canonical_archs(archs))  # the order written (GPU_ARCHS, the GPUs seen) changes nothing
    if backend == "cuda":
        if check_archs:
            check_cuda_archs(compiler, archs)
        ver = nvcc_version(compiler)
        return Toolchain("cuda", cxx, cxxv, compiler, ver, ver, cuda_home=str(Path(compiler).parent.parent),
                         archs=tuple(archs), how=tuple(how))
    if check_archs:
        check_rocm_archs(compiler, archs, env)
    ver = hipcc_version(compiler)
    platform_version = rocm_sdk_version(env, which) or ver
    return Toolchain("rocm", cxx, cxxv, compiler, ver, platform_version, rocm_root=rocm_root,
                     archs=tuple(archs), how=tuple(how))


def arch_flags(tc: Toolchain) -> list[str]:
    """One code-generation flag per arch, as the reference recipe does."""
    if tc.backend == "cuda":  # sm_90a -> arch=compute_90a,code=sm_90a
        return [cuda_arch_flag(a) for a in tc.archs]
    if tc.backend == "rocm":
        return [f"--offload-arch={a}" for a in tc.archs]
    return []


def compile_flags(tc: Toolchain, settings: config.Settings) -> dict[str, list[str]]:
    """Compiler and linker flags for every native target (umbrella, shims, JIT libraries): one definition for the
    Makefile (through build/config.mk) and build_jit.py, relative to the repository root where both compile."""
    vis = [] if settings.symbol_visible else ["-fvisibility=hidden"]
    ffi_inc = os.path.relpath(settings.ffi_include_dir, settings.root)
    inc = ["-Icsrc/include", "-Icsrc/kernels", "-isystem", ffi_inc]
    gpu_defs = [] if tc.backend == "cpu" else ["-DJA_HAS_GPU=1", f"-DJA_BACKEND_{tc.backend.upper()}=1"]
    prefix_map = [f"-ffile-prefix-map={settings.root}/="]
    cxx = ["-std=c++17", "-O3", "-fPIC", *vis, "-Wall", "-Wextra", "-Wno-unused-parameter", *prefix_map,
           *inc, *gpu_defs]
    if tc.backend == "cuda":
        host = ",".join(["-fPIC", *vis, *prefix_map])
        gpu = ["-std=c++17", "-O3", f"-Xcompiler={host}", "--expt-relaxed-constexpr", *arch_flags(tc), *inc, *gpu_defs]
        link, link_pass = [tc.gpu_compiler, "-shared", "-cudart=static"], "-Xlinker="
    elif tc.backend == "rocm":
        gpu = ["-x", "hip", "-std=c++17", "-O3", "-fPIC", *vis, *prefix_map, *arch_flags(tc), *inc, *gpu_defs]
        link, link_pass = [tc.gpu_compiler, "-shared"], "-Wl,"
    else:
        gpu, link, link_pass = [], [tc.cxx, "-shared"], "-Wl,"
    if settings.sanitize:
        if tc.backend != "cpu":
            raise ToolchainError(f"JA_SANITIZE={','.join(settings.sanitize)} instruments host code built by {tc.cxx} "
                                 f"and needs JA_BACKEND=cpu (resolved: {tc.backend}); for GPU code use "
                                 "compute-sanitizer or ROCm's ASan build")
        san = "-fsanitize=" + ",".join(settings.sanitize)
        cxx += [san, "-fno-omit-frame-pointer", "-fno-sanitize-recover=all", "-g"]
        link += [san]
    return {"cxx": cxx, "gpu": gpu, "link": link, "link_pass": [link_pass], "libs": ["-lpthread"]}


def make_words(args: list[str]) -> str:
    """`args` as one make variable a recipe passes to the shell: each word shell-quoted (a checkout path with a
    space or a quote stays one argument), `$` and `#` escaped for make."""
    return " ".join(shlex.quote(str(a)).replace("$", "$$").replace("#", "\\#") for a in args)


def make_config(tc: Toolchain, settings: config.Settings, key: str) -> str:
    """The build/config.mk text the Makefile includes (regenerated only when `key` changes)."""
    ffi_major, ffi_minor = ffi_api_version(settings.ffi_include_dir)
    flags = compile_flags(tc, settings)
    ops = op_table.load(settings.root)
    values = {
        "CFG_KEY": key, "JA_BACKEND_RESOLVED": tc.backend, "CXX": make_words([tc.cxx]),
        "GPUCC": make_words([tc.gpu_compiler]) if tc.gpu_compiler else "",
        "GPU_ARCH_FLAGS": " ".join(arch_flags(tc)), "GPU_ARCHS_RESOLVED": ";".join(tc.archs),
        "ROCM_ROOT": make_words([tc.rocm_root]) if tc.rocm_root else "",
        "FFI_INCLUDE": make_words([settings.ffi_include_dir]),
        "FFI_API_VERSION": f"{ffi_major}.{ffi_minor}", "SYMBOL_VISIBLE": 1 if settings.symbol_visible else 0,
        "TOOLCHAIN_CXX_VERSION": tc.cxx_version, "TOOLCHAIN_GPU_VERSION": tc.gpu_compiler_version or "",
        "CXXFLAGS_BASE": make_words(flags["cxx"]), "GPUFLAGS_BASE": make_words(flags["gpu"]),
        "LINK_DRIVER": make_words(flags["link"]), "LINK_PASS": flags["link_pass"][0],
        "LINK_LIBS": " ".join(flags["libs"]),
    }
    lines = ["# Generated by `python3 -m jatools.native.toolchain --emit-make`; do not edit.",
             *(f"{k} := {v}" for k, v in values.items()),
             f"# The op table ({op_table.path(settings.root).relative_to(settings.root)}): the shims make builds.",
             f"SHIMS_CORE := {' '.join(name for name, op in ops.items() if not op.mha)}",
             f"SHIMS_MHA := {' '.join(name for name, op in ops.items() if op.mha)}"]
    for name, op in ops.items():
        lines += [f"SHIM_{name} := {op.shim}", f"JIT_{name} := {' '.join(op.modules)}"]
    return "\n".join([*lines, *(f"# {note}" for note in tc.how)]) + "\n"


def build_tree_unwritable(path: Path, e: OSError) -> str:
    """What to say when the build cannot write `path` (its first write to the build tree): the path, why, the fix."""
    where = Path(e.filename) if e.filename else path
    why = e.strerror or str(e)
    fix = ("free some space there, or set JA_BUILD_DIR to a folder on another disk" if e.errno == errno.ENOSPC
           else "the build writes its tree inside the checkout: make the checkout writable, or set JA_BUILD_DIR to "
                "a writable folder (an empty one, or a build tree)")
    return f"cannot write {where.resolve() if not where.is_absolute() else where}: {why}; {fix}"


def ffi_api_version(include_dir: Path) -> tuple[int, int]:
    """XLA_FFI_API_MAJOR/MINOR from an XLA FFI c_api.h (ours or the installed jaxlib's)."""
    text = (Path(include_dir) / "xla/ffi/api/c_api.h").read_text()
    major, minor = (re.search(rf"#define XLA_FFI_API_{part} (\d+)", text) for part in ("MAJOR", "MINOR"))
    if not (major and minor):
        raise ToolchainError(f"{include_dir}/xla/ffi/api/c_api.h has no XLA_FFI_API_MAJOR/MINOR")
    return int(major.group(1)), int(minor.group(1))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--emit-make", metavar="FILE", help="write the Makefile configuration")
    p.add_argument("--key", default="", help="the environment key the Makefile compares")
    p.add_argument("--json", action="store_true", help="print the detected toolchain as JSON")
    p.add_argument("--record", nargs="+", metavar="LIB", help="record the size and sha256 of libraries just linked "
                   "in their folder's build_record.json (what make runs after each link)")
    args = p.parse_args(argv)
    if args.record:
        from jax_aiter.integrity import IntegrityError, record_files
        try:
            record_files(args.record)
        except (IntegrityError, OSError, ValueError) as e:
            print(f"error: cannot record {' '.join(args.record)}: {e}", file=sys.stderr)
            return 2
        return 0
    try:
        settings = config.load()
        tc = detect(settings)
    except (ToolchainError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.emit_make:
        text = make_config(tc, settings, args.key)
        try:  # surrogateescape: a checkout path's bytes that are not UTF-8 reach make (and the compilers) unchanged
            atomic_write.write_text(Path(args.emit_make), text, errors="surrogateescape")
        except OSError as e:  # a read-only checkout, a full disk: one line naming the path (a traceback was)
            print(f"error: {build_tree_unwritable(Path(args.emit_make), e)}", file=sys.stderr)
            return 2
        print(f"jax-aiter: backend {tc.backend}" + (f", archs {';'.join(tc.archs)}" if tc.archs else "")
              + f" ({'; '.join(tc.how) or 'no GPU toolchain found'})", file=sys.stderr)
    if args.json or not args.emit_make:
        import json
        print(json.dumps(asdict(tc), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
