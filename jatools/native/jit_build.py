#!/usr/bin/env python3
"""Build the JIT libraries (librmsnorm_fwd.so, libmha_fwd.so, libmha_bwd.so) into build/aiter_build/.

Owns the JIT build and its identity. The op table (jax_aiter/op_table.toml) says which modules exist,
jax_aiter/jit/optCompilerConfig.json how each compiles (jit_modules.py): instance sources generated from kernel
templates over its axes, compiled by ninja (jit_ninja.py: it tracks headers, so touching one template recompiles
only its instances), linked into one library. A build record (identity, toolchain, archs, output sha256) is
written atomically next to the outputs, last. The identity is derived here, never typed by hand; its recipe hash
covers the compile and link lines and every repository file they read, found by following #include lines and
checked after a build against ninja's depfiles (docs/jit-libs.md).

    python3 jax_aiter/jit/build_jit.py [--module a,b] [--verbose] [--log FILE] [-j N]
    make jit / nox -s jit              (the same build)
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from jatools import atomic_write, config
from jatools.native import (
    compiler_cache,
    jit_modules,
    jit_ninja,
    jit_packages,
    toolchain,
)
from jatools.native.jit_modules import ARCH_KINDS, BuildError
from jatools.private_dir import PrivateDirError
from jax_aiter import remedies
from jax_aiter.download import folder_lock
from jax_aiter.download.reuse_gate import cache_id, compare
from jax_aiter.integrity import RECORD_NAME, RECORD_SCHEMA, file_entry, sha256_files


def libraries(settings: config.Settings) -> dict[str, str]:
    """{module: its library} of every JIT module, in order: what a build, a merge or a publication holds."""
    return {name: spec["library"] for name, spec in jit_modules.module_table(settings).items()}


_INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.MULTILINE)


def scan_includes(src: str, args, root: Path, texts: dict[str, str], outputs: str) -> set[str]:
    """Repository files (relative paths) that compiling `src` with `args` reads, by following #include.

    Conditional blocks are not evaluated, so the set can only be larger than what one compiler reads;
    headers outside the repository (the compiler's and the CUDA/ROCm SDK's) are left to the toolchain
    identity. `texts` holds the generated files; nothing under `outputs` (the build folder) is read from disk.
    """
    dirs, it = [], iter(args)
    for a in it:
        if a in ("-I", "-isystem"):
            dirs.append(next(it, ""))
        elif a.startswith("-I"):
            dirs.append(a[2:])
    seen: set[str] = set()
    todo = [src]
    while todo:
        rel = todo.pop()
        if rel in seen:
            continue
        seen.add(rel)
        text = texts[rel] if rel in texts else (root / rel).read_text(errors="replace")
        for quote, name in _INCLUDE.findall(text):
            cands = ([os.path.join(os.path.dirname(rel), name)] if quote == '"' else []) + [
                os.path.join(d, name) for d in dirs]
            for cand in map(os.path.normpath, cands):
                if cand in texts or ((root / cand).is_file() and not cand.startswith(("..", outputs))):
                    todo.append(cand)
                    break
    return seen


def recipe(settings: config.Settings, tc: toolchain.Toolchain) -> tuple[str, dict[str, str]]:
    """(recipe hash, {input path: sha256}) of a build of every module with this toolchain: a hash of every
    compile and link line, every generated source and every repository file the compilations read."""
    root = settings.root
    modules = jit_modules.module_table(settings)
    flags = toolchain.compile_flags(tc, settings)
    texts: dict[str, str] = {}
    sources: dict[str, dict[str, list[Path]]] = {}
    kinds_of = {name: jit_modules.build_kinds(module, tc) for name, module in modules.items()}
    for name, module in modules.items():
        t, sources[name] = jit_modules.generated(name, module, kinds_of[name], settings.jit_dir, root)
        texts.update({os.path.relpath(p, root): v for p, v in t.items()})
    pinned = jit_packages.package_includes(root, modules, kinds_of, resolve=False)
    steps = jit_ninja.plan(modules, sources, tc, settings, pinned)
    flags.update({k: jit_modules.arch_kind_flags(flags, tc, k) for k in {s.rule for s in steps} & ARCH_KINDS.keys()})
    # Left out: where the checkout and its build folders are, and where the link driver is (link[0]):
    # they differ between machines, not between outputs.
    places = ((str(root), "$ROOT"), (os.path.relpath(settings.jit_dir, root), "$JIT"),
              (os.path.relpath(settings.umbrella_dir, root), "$UMBRELLA"))
    norm = lambda arg: functools.reduce(lambda a, place: a.replace(*place), places, arg)
    strip = lambda args: [norm(a) for a in args]
    lines = {"cxx": strip(flags["cxx"]), "gpu": strip(flags["gpu"]),
             **{k: strip(flags[k]) for k in ARCH_KINDS if k in flags},
             "link": strip([*flags["link"][1:], *jit_ninja.link_args(flags, settings)]),
             "compiles": [[s.module, s.rule, norm(s.src), *strip(s.extra)] for s in steps],
             "libraries": {n: m["library"] for n, m in modules.items()}}
    inputs: set[str] = {os.path.relpath(settings.ffi_include_dir / "xla/ffi/api/c_api.h", root)}
    for s in steps:
        inputs |= scan_includes(s.src, [*flags[s.rule], *s.extra], root, texts,
                                os.path.relpath(settings.build_dir, root) + os.sep)
    digests = {p: hashlib.sha256(texts[p].encode() if p in texts else (root / p).read_bytes()).hexdigest()
               for p in sorted(inputs)}
    named = {norm(p): d for p, d in digests.items()}
    h = hashlib.sha256(json.dumps({"commands": lines, "inputs": named}, sort_keys=True).encode())
    return h.hexdigest(), {p: d for p, d in digests.items() if p not in texts}


def kernel_source_revision(root: Path, kernel_dir: Path) -> tuple[str, bool]:
    """(revision, dirty): `git rev-parse HEAD:<dir>` (a tree id or a submodule commit).

    Outside a git checkout with that folder committed (a source tarball, a copied tree) the revision is a
    content hash, "content-sha256:<hex>", and the build counts as dirty: it builds and runs, but cannot be
    published.
    """
    rel = kernel_dir.resolve().relative_to(root.resolve()).as_posix()
    git = lambda *args: subprocess.run(["git", "-C", str(root), *args], check=False, capture_output=True, text=True)
    out = git("rev-parse", f"HEAD:{rel}")
    if out.returncode == 0:
        return out.stdout.strip(), bool(git("status", "--porcelain", "--", rel).stdout.strip())
    print(f"identity: `git rev-parse HEAD:{rel}` failed ({out.stderr.strip() or 'not a git checkout'}); "
          f"using a content hash of {rel} (such a build cannot be published)", file=sys.stderr)
    h = hashlib.sha256()
    for p in sorted(q for q in kernel_dir.rglob("*") if q.is_file()):
        h.update(p.relative_to(kernel_dir).as_posix().encode() + b"\0" + hashlib.sha256(p.read_bytes()).digest())
    return "content-sha256:" + h.hexdigest(), True


def derive_identity(settings: config.Settings, tc: toolchain.Toolchain, recipe_hash: str) -> dict:
    """The build identity. The hard gate for reuse is (kernel-source revision, GPU arch set, recipe hash,
    backend, FFI API version: jax_aiter.download.reuse_gate); the toolchain is recorded as advisory provenance."""
    rev, dirty = kernel_source_revision(settings.root, settings.kernel_source_dir)
    major, minor = toolchain.ffi_api_version(settings.ffi_include_dir)
    ident = {"kernel_source_revision": rev, "kernel_source_dirty": dirty, "gpu_archs": sorted(tc.archs),
             "recipe_hash": recipe_hash, "backend": tc.backend, "ffi_api_version": f"{major}.{minor}",
             "toolchain": tc.identity()}
    ident["cache_id"] = cache_id(ident)
    return ident


def checkout_identity(settings: config.Settings) -> tuple[dict, list[str]]:
    """Identity of this checkout for a consumer (decide, fetch), plus notes on how it was found. Without a
    detectable toolchain (a test runner has the runtime only) the gated fields come from JA_BACKEND, GPU_ARCHS
    and the sources, and the identity records no toolchain: the advisory comparison is skipped, never guessed."""
    try:
        tc = toolchain.detect(settings, check_archs=False)
        return derive_identity(settings, tc, recipe(settings, tc)[0]), list(tc.how)
    except toolchain.ToolchainError as e:
        if settings.backend == "auto":
            raise
        archs = settings.gpu_archs or settings.default_archs(settings.backend)
        if settings.backend == "cuda":
            archs = tuple(toolchain.normalise_cuda_arch(a) for a in archs)
        archs = config.canonical_archs(archs)  # as toolchain.detect orders them: one recipe whatever the order
        bare = toolchain.Toolchain(settings.backend, cxx="", cxx_version="", archs=tuple(archs),
                                   gpu_compiler="" if settings.backend != "cpu" else None)
        ident = {**derive_identity(settings, bare, recipe(settings, bare)[0]), "toolchain": None}
        return ident, [(f"toolchain not detected ({e}); identity from JA_BACKEND={settings.backend} and "
                        f"GPU_ARCHS={';'.join(archs) or '(none)'}, toolchain not compared")]


def stale(settings: config.Settings, recorded: dict) -> str | None:
    """Why JIT libraries of identity `recorded` (a build record's, a wheel's) are not what this checkout builds, or
    None when they are. The checkout's identity is derived for the recorded backend and archs (a CPU build packed
    under JA_BACKEND=auto is not stale for it), so what differs is the sources or the recipe: libraries built at
    another commit. `wheel_build --check` refuses a wheel of such libraries; jit.decide says the same as a miss."""
    backend = recorded.get("backend") or settings.backend
    pinned = dataclasses.replace(settings, backend=backend, gpu_archs=tuple(recorded.get("gpu_archs") or ()) or None)
    want, _ = checkout_identity(pinned)
    mismatches = compare(want, recorded).mismatches
    if not mismatches:
        return None
    return (f"the JIT libraries (cache id {recorded.get('cache_id')}) are not this checkout's (cache id "
            f"{want['cache_id']}): {'; '.join(mismatches)}. They were built from other sources: "
            f"{remedies.build_or_fetch()}")


def write_record(settings: config.Settings, tc: toolchain.Toolchain, ident: dict, modules: dict[str, dict],
                 counts: dict[str, int], seconds: float) -> Path:
    path = settings.jit_dir / RECORD_NAME
    record = json.loads(path.read_text()) if path.exists() else {}
    if record.get("schema") != RECORD_SCHEMA:
        record = {"schema": RECORD_SCHEMA, "modules": {}}
    digests = sha256_files([settings.jit_dir / m["library"] for m in modules.values()])
    for name, m in modules.items():
        lib = settings.jit_dir / m["library"]
        record["modules"][name] = {"identity": ident, "instances": counts[name],
                                   "file": file_entry(lib, digests[str(lib)])}
    idents = [m["identity"] for m in record["modules"].values()]
    record["identity"] = ident if all(i == ident for i in idents) else None
    record["files"] = sorted((m["file"] for m in record["modules"].values()), key=lambda e: e["name"])
    record["last_build"] = {"modules": sorted(modules), "seconds": round(seconds, 2), "toolchain_how": list(tc.how)}
    return atomic_write.write_text(path, json.dumps(record, indent=2, sort_keys=True) + "\n")


def require_utf8_root(root: Path) -> None:
    """The JIT build writes the checkout's path into its ninja file, build record and cache identity as UTF-8
    text (JSON); a path whose bytes are not UTF-8 cannot be written so. make alone copes (build/config.mk keeps
    the bytes), so say it here, naming the path, before anything is compiled."""
    try:
        str(root).encode("utf-8")
    except UnicodeEncodeError:
        raise BuildError(f"the checkout path {os.fsencode(str(root))!r} is not valid UTF-8; the JIT build records "
                         "paths as UTF-8 text (ninja file, build record, cache identity). Move or rename the "
                         "checkout to a UTF-8 path and run again") from None


def build(module_names: list[str] | None, jobs: int | None, verbose: bool, log_path: Path | None) -> None:
    settings = config.load()
    require_utf8_root(settings.root)
    tc = toolchain.detect(settings)
    all_modules = jit_modules.module_table(settings)
    names = module_names or list(all_modules)
    unknown = [n for n in names if n not in all_modules]
    if unknown:
        raise BuildError(f"unknown module(s) {', '.join(unknown)}; known: {', '.join(all_modules)}")
    umbrella = settings.umbrella_dir / "libjax_aiter.so"
    if not umbrella.exists():
        raise BuildError(f"{umbrella.relative_to(settings.root)} is missing; run `make` (or `nox -s umbrella`) first")
    # One JIT build (or fetch) at a time in a build tree: two `nox -s release` runs of one checkout ran two ninja
    # builds in one build/aiter_build at once. The later one waits, then finds its work done (ninja: no-op).
    settings.jit_dir.parent.mkdir(parents=True, exist_ok=True)
    with folder_lock.hold(settings.jit_dir.parent.resolve(), "build_jit", lambda m: print(m, flush=True)):
        _build_locked(settings, tc, all_modules, names, jobs, verbose, log_path)


@dataclasses.dataclass(frozen=True)
class Plan:
    build_file: Path                # build.ninja, written
    steps: list[jit_ninja.Compile]  # every compilation in it
    packages: dict[str, str]        # {placeholder: the installed header package's include dir}
    counts: dict[str, int]          # instances per module
    env: dict[str, str]             # what ninja runs under (the compiler cache's settings)


def write_plan(settings: config.Settings, tc: toolchain.Toolchain, modules: dict[str, dict]) -> Plan:
    """Generate the modules' instance sources and write build.ninja for them under the JIT dir; build nothing.
    The build runs it whole; tests/build/test_sass_check.py builds one object of it."""
    kinds_of = {n: jit_modules.build_kinds(m, tc) for n, m in modules.items()}
    packages = jit_packages.package_includes(settings.root, modules, kinds_of, resolve=True)
    sources = {n: jit_modules.generate(n, m, kinds_of[n], settings.jit_dir, settings.root)
               for n, m in modules.items()}
    build_file = settings.jit_dir / "build.ninja"
    steps = jit_ninja.plan(modules, sources, tc, settings, packages)
    flags = toolchain.compile_flags(tc, settings)
    cache = compiler_cache.launcher(settings, flags)
    jit_modules.write_if_changed(build_file, jit_ninja.ninja_text(modules, steps, tc, flags, settings, cache))
    return Plan(build_file, steps, packages, {n: sum(len(v) for v in s.values()) for n, s in sources.items()},
                cache.env if cache else {})


def _build_locked(settings: config.Settings, tc: toolchain.Toolchain, all_modules: dict, names: list[str],
                  jobs: int | None, verbose: bool, log_path: Path | None) -> None:
    modules = {n: all_modules[n] for n in names}
    print(f"build_jit: backend {tc.backend}" + (f", archs {';'.join(tc.archs)}" if tc.archs else "")
          + f", modules {', '.join(names)}", flush=True)
    for note in tc.how:
        print(f"  {note}")
    recipe_hash, inputs = recipe(settings, tc)  # over every module: one identity for the set
    ident = derive_identity(settings, tc, recipe_hash)
    if ident["kernel_source_dirty"]:
        print("  note: the kernel sources have uncommitted changes; this build cannot be published", flush=True)
    start = time.monotonic()
    since = compiler_cache.log_offset(settings)
    plan = write_plan(settings, tc, modules)
    for ph, inc in plan.packages.items():
        print(f"  {jit_packages.PACKAGE_INCLUDES[ph][0]} headers: {inc}")
    with open(log_path or os.devnull, "a") as log:
        done = jit_ninja.run_ninja(plan.build_file, jobs, verbose, log, settings.root, plan.env)
    try:  # the cache entries the objects came from (compiler_cache.check); a refused one leaves no library behind
        compiler_cache.check(settings)
    except compiler_cache.CacheEntryError as e:
        for m in modules.values():
            (settings.jit_dir / m["library"]).unlink(missing_ok=True)
        raise BuildError(str(e)) from None
    jit_ninja.check_depfiles(settings, plan.build_file, set(inputs), tuple(plan.packages.values()))
    seconds = time.monotonic() - start
    record = write_record(settings, tc, ident, modules, plan.counts, seconds)
    print(f"build_jit: {sum(plan.counts.values())} instances, {done} build steps run, {seconds:.1f} s; "
          f"record {record.relative_to(settings.root)}", flush=True)
    for n, m in modules.items():
        size = (settings.jit_dir / m["library"]).stat().st_size
        print(f"  {m['library']:<20} {size / 1e6:8.2f} MB  {plan.counts[n]} instances")
    print(compiler_cache.summary(settings, since, "build_jit"), flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m jatools.native.jit_build", description=__doc__.splitlines()[0])
    p.add_argument("--module", help="comma-separated modules (default: every one the op table needs)")
    p.add_argument("--verbose", action="store_true", help="print every compiler command")
    p.add_argument("--log", type=Path, help="append the full compiler output to this file")
    p.add_argument("-j", "--jobs", type=int, help="parallel compile jobs (default: ninja's)")
    args = p.parse_args(argv)
    modules = [m.strip() for m in args.module.split(",") if m.strip()] if args.module else None
    try:
        build(modules, args.jobs, args.verbose, args.log)
    except (BuildError, toolchain.ToolchainError, ValueError, folder_lock.FolderLockError, PrivateDirError) as e:
        print(f"build_jit: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a read-only checkout, a full disk: the path and the fix, not a traceback
        print(f"build_jit: error: {toolchain.build_tree_unwritable(Path(e.filename or '.'), e)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
