"""Find the native libraries, check their FFI API version, and register the FFI targets.

Search order for each library (every step that is skipped is logged):

1. ``JAX_AITER_LIB_DIR`` when set (a folder of libraries, e.g. fetched MHA ones);
2. the libraries packaged in the wheel (``jax_aiter/_lib``);
3. a source checkout's build tree (``build/jax_aiter_build`` and ``build/aiter_build``);
4. for the MHA JIT libraries only, the fetch cache written by ``jax-aiter-fetch-mha``.

A library found nowhere raises ``LibraryNotFoundError`` naming the command that
produces it. Before a library is loaded its size is checked against what records
it (the pins in the wheel's build identity; in a checkout or a fetch folder, the
``build_record.json`` or ``jit-libs-manifest.json`` beside it) and its SONAME
against its file name, so a truncated or swapped file gives ``LibraryCheckError``
naming the file instead of a SIGBUS or a loader error about another name
(``python -m jax_aiter info --verify`` also checks the sha256).
Libraries are loaded by absolute path in dependency order
(umbrella, JIT library, shim); each shim names its JIT library in DT_NEEDED, and
the dynamic loader matches it by SONAME, so no RTLD_GLOBAL is involved.
"""
from __future__ import annotations

import ctypes
import json
import logging
import os
import re
import struct
import threading
import warnings
from pathlib import Path

from jax_aiter import integrity, lane, op_table, remedies, settings
from jax_aiter.download import trust
from jax_aiter.download.manifest import MANIFEST_NAME

log = logging.getLogger("jax_aiter")

PACKAGE_DIR = Path(__file__).resolve().parent
PACKAGED_LIB_DIR = PACKAGE_DIR / "_lib"
IDENTITY_FILE = PACKAGE_DIR / "_build_identity.json"
UMBRELLA = "libjax_aiter.so"
LIB_DIR_ENV = "JAX_AITER_LIB_DIR"  # a folder the lookup tries first (jax_aiter/settings.py)
# JA_BUILD_DIR's default, pyproject's build_dir (which a wheel has not; tests/tooling/test_build_tree.py keeps them
# equal)
DEFAULT_BUILD_DIR = "build"
OPS: dict[str, op_table.Op] = op_table.load()  # op name -> FFI targets, shim, JIT libraries (op_table.toml)
MHA_JIT_LIBS = tuple(op_table.fetched_libraries(OPS).values())  # a lite wheel's user fetches them (jax-aiter-fetch-mha)


class LibraryNotFoundError(ImportError):
    """A native library is missing; the message names the command that provides it."""


class LibraryCheckError(ImportError):
    """A library is there but its bytes are wrong (size, sha256, SONAME, symbols); the message names the file,
    what is wrong and the command that fixes it."""


class FfiVersionError(ImportError):
    """A shim was built against an XLA FFI API the installed jaxlib does not support."""


class CacheDirError(ValueError):
    """There is no folder of this user's to cache fetched libraries in (HOME empty, XDG_CACHE_HOME unset)."""


def _checkout_root() -> Path:
    return Path(os.environ.get("JA_ROOT_DIR") or PACKAGE_DIR.parent)


def _checkout_dirs() -> list[Path]:
    build = _checkout_root() / os.environ.get("JA_BUILD_DIR", DEFAULT_BUILD_DIR)
    return [build / settings.LIBRARY_DIRS["umbrella"], build / settings.LIBRARY_DIRS["jit"]]


class StaleLibraryWarning(UserWarning):
    """JIT libraries of a checkout's build tree were built from other kernel sources than the checkout has."""


_stale_checked: dict[Path, str | None] = {}


def stale_build(folder: Path) -> str | None:
    """Why the JIT libraries in the checkout's build folder `folder` are not built from the checkout's kernel sources
    (their build record names another revision, or the sources changed since), or None (they are, or git cannot
    tell: not a git checkout, a content-hash build). Asked once per folder: two git calls."""
    if folder in _stale_checked:
        return _stale_checked[folder]
    _stale_checked[folder] = why = _stale_build(folder)
    return why


def record_identity(folder: Path) -> dict | None:
    """The build identity (kernel source revision, dirty tree, toolchain, ...) that the JIT build wrote into the build
    record of `folder`; None when the folder has no readable record or its record names no build."""
    try:
        ident = json.loads((folder / integrity.RECORD_NAME).read_text()).get("identity")
    except (OSError, ValueError, AttributeError):
        return None
    return ident if isinstance(ident, dict) and ident else None


def _stale_build(folder: Path) -> str | None:
    import subprocess
    import tomllib

    root = _checkout_root()
    ident = record_identity(folder) or {}
    try:
        kernels = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["jax-aiter"]["kernel_source_dir"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    built = ident.get("kernel_source_revision") or ""
    if not built or built.startswith("content-sha256:"):
        return None
    git = lambda *a: subprocess.run(["git", "-C", str(root), *a], capture_output=True, text=True, check=False)
    try:
        head, status = git("rev-parse", f"HEAD:{kernels}"), git("status", "--porcelain", "--", kernels)
    except OSError:
        return None
    if head.returncode or status.returncode:
        return None
    fix = remedies.build_or_fetch()
    if head.stdout.strip() != built:
        return (f"the JIT libraries in {folder} were built from kernel sources {built} ({kernels}), but the checkout "
                f"{root} has {head.stdout.strip()}: they are another commit's; {fix}")
    if status.stdout.strip() and not ident.get("kernel_source_dirty"):
        return (f"the kernel sources in {root / kernels} changed since the JIT libraries in {folder} were built "
                f"(uncommitted edits: {', '.join(ln[3:] for ln in status.stdout.splitlines()[:3])}); {fix}")
    return None


def build_identity() -> dict | None:
    """The identity baked into an installed wheel, or None in a source checkout."""
    if IDENTITY_FILE.exists():
        return json.loads(IDENTITY_FILE.read_text())
    return None


def fetch_cache_dir(identity: dict | None = None, required: bool = False) -> Path | None:
    """Where jax-aiter-fetch-mha puts the MHA JIT libraries for this install (None: not an install, or no cache
    folder of this user's; `required`: CacheDirError saying why there is none instead)."""
    if os.environ.get(LIB_DIR_ENV):
        return Path(os.environ[LIB_DIR_ENV])
    identity = identity or build_identity()
    if not identity or not identity.get("cache_id"):
        return None
    try:
        return cache_home() / "jax-aiter" / identity["version"] / identity["cache_id"]
    except CacheDirError as e:
        if required:
            raise
        log.info("jax_aiter: %s; no fetch cache", e)
        return None


def cache_home() -> Path:
    """$XDG_CACHE_HOME when it is an absolute path (the XDG spec ignores a relative one), else ~/.cache of a home
    folder that is one: HOME='' made Path.home() the filesystem root, and the fetch installed into /.cache."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(xdg):
        return Path(xdg)
    home = os.environ.get("HOME")
    if home is None:  # unset: the password database's, as Path.home() does
        import pwd

        try:
            home = pwd.getpwuid(os.getuid()).pw_dir
        except KeyError:
            home = ""
    if not os.path.isabs(home) or Path(home) == Path("/"):
        raise CacheDirError(f"no cache folder for fetched libraries: HOME={home!r} is not a home folder and "
                            f"XDG_CACHE_HOME is {f'{xdg!r}, not an absolute path' if xdg else 'unset'}; set "
                            f"XDG_CACHE_HOME (or {LIB_DIR_ENV}) to a folder of your own, or pass --dest")
    return Path(home) / ".cache"


def search_dirs(name: str) -> list[tuple[str, Path]]:
    """Where library `name` is looked for, in order. JAX_AITER_LIB_DIR, the one setting the lookup reads, is checked
    (jax_aiter/settings.py): one that is not a folder stops here instead of falling back to other libraries silently."""
    dirs: list[tuple[str, Path]] = []
    if (lib_dir := os.environ.get(LIB_DIR_ENV, "")).strip():
        try:
            settings.check(settings.BY_NAME[LIB_DIR_ENV], lib_dir)
        except settings.SettingError as e:
            raise LibraryNotFoundError(f"jax_aiter: {e}") from None
        dirs.append((LIB_DIR_ENV, Path(lib_dir)))
    dirs.append(("wheel", PACKAGED_LIB_DIR))
    dirs += [("checkout", d) for d in _checkout_dirs()]
    if name in MHA_JIT_LIBS:
        cache = fetch_cache_dir()
        if cache is not None:
            dirs.append(("fetch cache", cache))
    return dirs


def find_library(name: str) -> Path:
    tried = []
    for label, d in search_dirs(name):
        cand = d / name
        if cand.is_file():
            if tried:
                log.info("jax_aiter: %s not in %s; using %s (%s)", name, ", ".join(str(t) for t in tried), cand, label)
            return cand
        tried.append(d)
    raise LibraryNotFoundError(f"jax_aiter: {name} not found (looked in {', '.join(str(t) for t in tried)}); "
                               f"{_fix(name)}")


def _fix(name: str, path: Path | None = None) -> str:
    """The command that (re)produces library `name` (found at `path`, when it is there but wrong); for one this
    user cannot read, or others may change, the fix of its permissions (a fresh download would not help)."""
    if path is not None and (shared := _untrusted(path)):
        return f"take others' write access away ({trust.fix(shared[0])}), or use libraries in a folder of your own"
    if path is not None and not os.access(path, os.R_OK):
        return f"make it readable to you (chmod a+r {path}, or ask its owner); a new copy would not be"
    if path is not None and build_identity() is not None:
        cache = fetch_cache_dir()
        if name in MHA_JIT_LIBS and cache is not None and path.parent == cache:
            return "run `jax-aiter-fetch-mha --force` to download verified copies"
        if path.parent == PACKAGED_LIB_DIR:
            return "reinstall jax-aiter (`pip install --force-reinstall --no-deps jax-aiter`)"
        return f"replace it with the library this jax-aiter was built with, or remove {path}"
    if name in MHA_JIT_LIBS and build_identity() is not None:
        return ("run `jax-aiter-fetch-mha` to download the attention libraries for this install "
                "(or install the +full wheel)")
    if name == UMBRELLA:
        return "run `make` (or `nox -s umbrella`)"
    modules = {lib: m for m, lib in op_table.jit_libraries(OPS).items()}
    if name in modules:
        return remedies.build_or_fetch([modules[name]])
    return "run `make ja_mods` (or `nox -s ja_mods`)"  # a shim


_records: dict[Path, dict[str, dict] | str] = {}


def _folder_record(folder: Path) -> tuple[dict[str, dict] | str, Path] | None:
    """The entries of the record beside libraries in `folder` (or a str saying why it cannot be read)."""
    for name in (MANIFEST_NAME, integrity.RECORD_NAME):
        path = folder / name
        if path.is_file():
            if path not in _records:
                try:
                    _records[path] = integrity.read_record(path)
                except integrity.IntegrityError as e:
                    _records[path] = str(e)
            return _records[path], path
    return None


def expected_entry(path: Path) -> tuple[dict | None, str]:
    """The {name, size, sha256} the library at `path` must have and where that is written (None: not recorded).

    An installed wheel's pins decide (its build identity names every library it ships or fetches); a
    checkout or a fetch folder has the record written beside its libraries."""
    pins = (build_identity() or {}).get("pins")
    if pins:
        for e in pins:
            if e["name"] == path.name:
                return e, f"the pins in {IDENTITY_FILE}"
    found = _folder_record(path.parent)
    if found is None:
        return None, ""
    entries, source = found
    if isinstance(entries, str):
        raise LibraryCheckError(f"jax_aiter: cannot check {path}: {entries}; {_fix(path.name, path)}")
    return entries.get(path.name), str(source)


def elf_soname(path: Path) -> str | None:
    """DT_SONAME of a 64-bit little-endian ELF file (None when it has none); ValueError when it is not one, or
    when its headers, segments or section table run past the end of the file (a truncated file: dlopen would map
    pages that are not there, and the first touch kills the process with SIGBUS), with or without a record.

    A few small reads, so every library is checked before it is loaded."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(64)
            if head[:4] != b"\x7fELF" or head[4:6] != b"\x02\x01":
                raise ValueError("it is not a 64-bit little-endian ELF shared library")
            (phoff, shoff) = struct.unpack_from("<QQ", head, 32)
            phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", head, 54)
            f.seek(phoff)
            ph = f.read(phentsize * phnum)
            ends = [phoff + phentsize * phnum, shoff + shentsize * shnum]
            loads, dyn = [], None
            for i in range(phnum):
                p_type, _, p_offset, p_vaddr, _, p_filesz = struct.unpack_from("<IIQQQQ", ph, i * phentsize)
                ends.append(p_offset + p_filesz)
                if p_type == 1:
                    loads.append((p_vaddr, p_offset, p_filesz))
                elif p_type == 2:
                    dyn = (p_offset, p_filesz)
            if max(ends) > size:
                raise ValueError(f"it is {size} bytes but its ELF headers describe {max(ends)}: a truncated file "
                                 "(loading it would crash the process)")
            if dyn is None:
                return None
            f.seek(dyn[0])
            d = f.read(dyn[1])
            tags = {}
            for off in range(0, len(d) - 15, 16):
                tag, val = struct.unpack_from("<qQ", d, off)
                if tag == 0:
                    break
                tags.setdefault(tag, val)
            if 5 not in tags or 14 not in tags:  # DT_STRTAB, DT_SONAME
                return None
            for vaddr, offset, size in loads:
                if vaddr <= tags[5] < vaddr + size:
                    f.seek(offset + tags[5] - vaddr + tags[14])
                    return f.read(256).split(b"\0", 1)[0].decode(errors="replace")
    except struct.error:
        raise ValueError("its ELF headers are cut short (a truncated file)") from None
    return None


def _untrusted(path: Path) -> tuple[Path, str] | None:
    """(the folder or file, why) when a user other than this one or root could change library `path` or its folder."""
    real = path.resolve()
    for what in (real.parent, real):
        why = trust.others_can_write(what)
        if why:
            return what, why
    return None


def check_library(path: Path, verify: bool = False) -> list[str]:
    """What is wrong with the library at `path` (empty when nothing): who else may change it or its folder, its size
    (and with `verify` its sha256) against its record, its SONAME against its file name."""
    return _checked(path, verify)[0]


def _checked(path: Path, verify: bool) -> tuple[list[str], str | None]:
    """check_library's problems, and with `verify` the sha256 it hashed (None when it hashed nothing: a library in a
    folder others may write is not read)."""
    shared = _untrusted(path)
    if shared:
        what = f"{'its folder ' if shared[0] != path.resolve() else ''}{shared[0]}"
        return [(f"{what}: {shared[1]}, so another user could replace it with code that runs as you; it is not "
                 "loaded")], None
    problems = []
    entry, source = expected_entry(path)
    size = path.stat().st_size
    got = integrity.sha256_file(path) if verify else None
    if entry is not None and size != entry["size"]:
        problems.append(f"{size} bytes, but {source} records {entry['size']}: the file is truncated or was "
                        "replaced (loading it could crash the process)")
    elif entry is not None and got is not None and got != entry["sha256"]:
        problems.append(f"sha256 {got}, but {source} records {entry['sha256']}: the file was altered")
    if not problems:
        try:
            soname = elf_soname(path)
        except (OSError, ValueError) as e:
            problems.append(str(e))
        else:
            if soname is not None and soname != path.name:
                problems.append(f"its SONAME is {soname}, not {path.name}: it holds another library's bytes")
    return problems, got


def installed_ffi_api_version() -> tuple[int, int]:
    """XLA FFI API version of the installed jaxlib, from the headers it ships."""
    import jax

    header = Path(jax.ffi.include_dir()) / "xla" / "ffi" / "api" / "c_api.h"
    text = header.read_text()
    major = re.search(r"#define XLA_FFI_API_MAJOR (\d+)", text)
    minor = re.search(r"#define XLA_FFI_API_MINOR (\d+)", text)
    if not (major and minor):
        raise FfiVersionError(f"cannot read the XLA FFI API version from {header}")
    return int(major.group(1)), int(minor.group(1))


def check_ffi_version(shim: Path, lib: ctypes.CDLL, installed: tuple[int, int]) -> tuple[int, int]:
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.ja_ffi_api_version(ctypes.byref(major), ctypes.byref(minor))
    built = (major.value, minor.value)
    if built[0] != installed[0] or built[1] > installed[1]:
        import jaxlib

        raise FfiVersionError(
            f"jax_aiter: {shim.name} was built against XLA FFI API {built[0]}.{built[1]}, but the installed "
            f"jaxlib {jaxlib.__version__} supports API {installed[0]}.{installed[1]}; XLA would refuse its "
            f"handlers. Rebuild the shims against jaxlib 0.11.0's headers (`make ja_mods`, which uses "
            f"third_party/xla_ffi) or upgrade jaxlib to a release that supports API {built[0]}.{built[1]}."
        )
    return built


_lock = threading.Lock()
_loaded: dict[str, ctypes.CDLL] = {}
_registered: set[str] = set()


def _load(path: Path) -> ctypes.CDLL:
    key = path.name
    if key not in _loaded:
        if path.parent == _checkout_dirs()[1] and (why := stale_build(path.parent)):
            log.warning("jax_aiter: %s", why)
            warnings.warn(f"jax_aiter: {why}", StaleLibraryWarning, stacklevel=2)
        problems = check_library(path)
        if problems:
            raise LibraryCheckError(f"jax_aiter: {path}: {'; '.join(problems)}; {_fix(path.name, path)}")
        try:
            _loaded[key] = ctypes.CDLL(str(path))
        except OSError as e:
            raise LibraryNotFoundError(f"jax_aiter: cannot load {path}: {e}") from e
    return _loaded[key]


def gpu_platform() -> str | None:
    """'CUDA' or 'ROCM' for a GPU build of the libraries, None for a CPU build."""
    umbrella = _load(find_library(UMBRELLA))
    umbrella.ja_build_identity.restype = ctypes.c_char_p
    backend = json.loads(umbrella.ja_build_identity().decode())["backend"]
    return {"cuda": "CUDA", "rocm": "ROCM"}.get(backend)


def ensure_registered(op: str) -> None:
    """Load op's libraries (once per process) and register its FFI targets."""
    if op in _registered:
        return
    with _lock:
        if op in _registered:
            return
        # The kernels read the other runtime settings themselves (JA_NUM_THREADS, JA_GPU_PDL ...), where a bad
        # value would be ignored: checked once per op, before its libraries load.
        settings.check_environment(group="runtime")
        import jax

        lane.check(build_identity(), jax)  # a lane built for another GPU backend stops here, saying which to install
        spec = OPS[op]
        _load(find_library(UMBRELLA))
        for jit in spec.jit:
            _load(find_library(jit))
        shim_path = find_library(spec.shim)
        shim = _load(shim_path)
        wanted = ["ja_ffi_api_version"] + [prefix + "Cpu" for _, prefix in spec.targets]
        absent = [sym for sym in wanted if not hasattr(shim, sym)]
        if absent:
            raise LibraryCheckError(
                f"jax_aiter: {shim_path} does not export {', '.join(absent)}: it is not the {op} shim (another "
                f"library's bytes in its place?); {_fix(shim_path.name, shim_path)}")
        check_ffi_version(shim_path, shim, installed_ffi_api_version())
        platform = gpu_platform()
        for target, prefix in spec.targets:
            jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(shim, prefix + "Cpu")), platform="cpu")
            if platform and hasattr(shim, prefix + "Gpu"):
                jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(shim, prefix + "Gpu")),
                                            platform=platform)
        _registered.add(op)


def shipped(name: str) -> bool:
    """Whether the installed wheel ships library `name` (a lite wheel's attention libraries are fetched later; a
    source checkout ships nothing: what it lacks is not built yet)."""
    identity = build_identity()
    return identity is not None and (name not in MHA_JIT_LIBS or identity.get("variant") != "lite")


def library_report(verify: bool = False) -> list[dict]:
    """Where each library would load from and what is wrong with it (for `python -m jax_aiter info`);
    `verify` also hashes each one against its record, and its row keeps the sha256."""
    names = [UMBRELLA] + sorted({j for s in OPS.values() for j in s.jit}) + [s.shim for s in OPS.values()]
    out = []
    for name in names:
        try:
            path = find_library(name)
        except LibraryNotFoundError as e:
            out.append({"library": name, "path": None, "error": str(e), "required": shipped(name)})
            continue
        try:
            problems, digest = _checked(path, verify)
        except LibraryCheckError as e:
            problems, digest = [str(e)], None
        row = {"library": name, "path": str(path), **({"sha256": digest} if digest else {})}
        if problems:
            row["problems"] = problems
            row["fix"] = _fix(name, path)
        out.append(row)
    return out
