#!/usr/bin/env python3
"""Build the JIT libraries (librmsnorm_fwd.so, libmha_fwd.so, libmha_bwd.so) into build/aiter_build/.

Owns the JIT build and its identity. The op table (jax_aiter/op_table.toml) says which modules exist,
jax_aiter/jit/optCompilerConfig.json how each compiles: instance sources generated from kernel templates
over its axes (rewritten only when their text changes), compiled by ninja (which tracks headers, so
touching one template recompiles only its instances), linked into one library. A build record (identity,
toolchain, archs, output sha256) is written atomically next to the outputs, last. The identity is
derived here, never typed by hand; its recipe hash covers the compile and link lines and every repository
file they read, found by following #include lines and checked after a build against ninja's depfiles
(docs/jit-libs.md).

    python3 jax_aiter/jit/build_jit.py [--module a,b] [--verbose] [--log FILE] [-j N]
    make jit / nox -s jit              (the same build)
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import importlib.metadata
import itertools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from jatools import atomic_write, config
from jatools.native import toolchain
from jax_aiter import op_table
from jax_aiter.integrity import RECORD_NAME, RECORD_SCHEMA, file_entry, sha256_files
from jax_aiter.reuse_gate import cache_id

# A module may add a template kind gpu_<code> (gpu_sm90a: the wgmma/TMA attention kernels), compiled for that
# one code instead of GPU_ARCHS' codes and only by a CUDA build whose GPU_ARCHS holds the base arch; its
# instance table is written (empty) either way, so the dispatcher includes it on every build.
ARCH_KINDS = {"gpu_sm90a": ("sm_90", "sm_90a")}  # kind: (base arch in GPU_ARCHS, the code compiled)
# Header-only packages an extra flag names as {placeholder}: (distribution, include dir inside it). The build
# takes the installed one, which must be the version pinned in pyproject's [dependency-groups] build; the
# recipe hash names that pin, never the install path.
PACKAGE_INCLUDES = {"cutlass_include": ("nvidia-cutlass", "cutlass_library/source/include")}


class BuildError(RuntimeError):
    pass


def module_table(settings: config.Settings) -> dict[str, dict]:
    """{module: its compile settings plus `library`}, in the JIT config's order.

    A module that the op table names (it says which exist) and the JIT config (how each compiles) does not,
    or the reverse, is an error naming both files.
    """
    libraries = op_table.jit_libraries(op_table.load(settings.root))
    configured: dict[str, dict] = json.loads(settings.jit_config.read_text())["modules"]
    table, cfg = op_table.path(settings.root), settings.jit_config
    problems = [f"module {m} is needed by the op table {table} but has no compile settings in {cfg}"
                for m in libraries if m not in configured]
    problems += [f"module {m} has compile settings in {cfg} but no op in {table} needs it"
                 for m in configured if m not in libraries]
    problems += [f"module {m} names `library` in {cfg}, which is derived ({libraries[m]}) and not read"
                 for m in configured if "library" in configured[m] and m in libraries]
    if problems:
        raise op_table.OpTableError("the op table and the JIT config disagree: " + "; ".join(problems)
                                    + "; add the missing entry or remove the stale one")
    return {name: {**spec, "library": libraries[name]} for name, spec in configured.items()}


def libraries(settings: config.Settings) -> dict[str, str]:
    """{module: its library} of every JIT module, in order: what a build, a merge or a publication holds."""
    return {name: spec["library"] for name, spec in module_table(settings).items()}


def instances(module: dict) -> list[dict[str, str]]:
    """Every combination of the module's axes, as {axis: text value} (a bool as 0 or 1)."""
    axes = module.get("axes", {})
    return [{n: str(int(v)) if isinstance(v, bool) else str(v) for n, v in zip(axes, combo)}
            for combo in itertools.product(*axes.values())]


def render(template: str, values: dict[str, str]) -> str:
    def sub(m: re.Match) -> str:
        if m.group(1) not in values:
            raise BuildError(f"template placeholder {{{{{m.group(1)}}}}} has no value "
                             f"(known: {', '.join(sorted(values))})")
        return values[m.group(1)]
    return re.sub(r"\{\{(\w+)\}\}", sub, template)


def write_if_changed(path: Path, text: str) -> None:
    """Atomic write that leaves the file (and its mtime) alone when the text is unchanged."""
    if not (path.exists() and path.read_text() == text):
        atomic_write.write_text(path, text)


def generated(name: str, module: dict, kinds: list[str], out_dir: Path, root: Path
              ) -> tuple[dict[Path, str], dict[str, list[Path]]]:
    """The module's instance sources and instance tables as {path: text}, and the sources per kind."""
    gen = out_dir / name / "gen"
    texts: dict[Path, str] = {}
    sources: dict[str, list[Path]] = {}
    for kind in kinds:
        tpl_rel = module["templates"][kind]
        tpl = (root / tpl_rel).read_text()
        sources[kind], table = [], []
        for values in instances(module):
            symbol = module["symbol"].format(backend=kind, **values)
            path = gen / f"{symbol}{'.cpp' if kind == 'cpu' else '.cu'}"
            texts[path] = render(tpl, {**values, "symbol": symbol, "template": tpl_rel, "backend": kind})
            sources[kind].append(path)
            table.append(f"JA_INSTANCE({', '.join([symbol, *values.values()])})")
        texts[gen / f"{name}_{kind}_instances.inc"] = (
            f"// Generated by build_jit.py from {tpl_rel}; do not edit.\n" + "\n".join(table) + "\n")
    for kind in ARCH_KINDS:  # declared but not built here: an empty table, so the dispatcher's include holds
        if kind in module.get("templates", {}) and kind not in kinds:
            texts[gen / f"{name}_{kind}_instances.inc"] = (
                f"// Generated by build_jit.py: {kind} instances are not built for these GPU_ARCHS; do not edit.\n")
    return texts, sources


def generate(name: str, module: dict, kinds: list[str], out_dir: Path, root: Path) -> dict[str, list[Path]]:
    """Write the module's instance sources and tables, remove the files no longer generated (they must not
    leak into the link); return the sources per kind."""
    texts, sources = generated(name, module, kinds, out_dir, root)
    for path, text in texts.items():
        write_if_changed(path, text)
    for stale in (out_dir / name / "gen").glob("*"):
        if stale not in texts and stale.is_file():
            stale.unlink()
    return sources


def build_kinds(module: dict, tc: toolchain.Toolchain) -> list[str]:
    """The template kinds of `module` that this toolchain compiles."""
    kinds = ["cpu"] + (["gpu"] if tc.backend != "cpu" else [])
    return kinds + [k for k, (base, _) in ARCH_KINDS.items()
                    if k in module.get("templates", {}) and tc.backend == "cuda" and base in tc.archs]


def arch_kind_flags(flags: dict[str, list[str]], tc: toolchain.Toolchain, kind: str) -> list[str]:
    """The GPU flags of an arch kind: GPU_ARCHS' code-generation flags replaced by the kind's code."""
    drop = set(toolchain.arch_flags(tc))
    return [f for f in flags["gpu"] if f not in drop] + toolchain.arch_flags(
        dataclasses.replace(tc, archs=(ARCH_KINDS[kind][1],)))


def package_pin(root: Path, dist: str) -> str:
    """The exact version of `dist` pinned in pyproject's [dependency-groups] build (dist==X)."""
    with open(root / "pyproject.toml", "rb") as f:
        group = tomllib.load(f).get("dependency-groups", {}).get("build", [])
    for req in group:
        m = re.fullmatch(rf"\s*{re.escape(dist)}\s*==\s*([\w.]+)\s*", req) if isinstance(req, str) else None
        if m:
            return m.group(1)
    raise BuildError(f"pyproject.toml's [dependency-groups] build pins no {dist}==VERSION (the JIT build needs an "
                     "exact pin: it names the version in the cache identity)")


def _release(version: str) -> tuple[int, ...]:
    parts = [int(p) for p in re.findall(r"\d+", version.split("+")[0])]
    while parts and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def package_include(root: Path, placeholder: str) -> str:
    """The include dir of an installed header-only package, checked against its pin; a clear error if absent."""
    dist, sub = PACKAGE_INCLUDES[placeholder]
    pin = package_pin(root, dist)
    fix = f"install it with `python3 -m pip install {dist}=={pin}` (or `pip install --group build`)"
    try:
        found = importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        raise BuildError(f"{dist} is not installed in {sys.executable}'s environment; the sm_90a instances of the "
                         f"JIT build compile against its CUTLASS/CuTe headers: {fix}") from None
    if _release(found.version) != _release(pin):
        raise BuildError(f"{dist} {found.version} is installed but pyproject.toml pins {dist}=={pin}: {fix}")
    inc = Path(str(found.locate_file(sub)))
    if not inc.is_dir():
        raise BuildError(f"{dist} {found.version} has no {sub} (looked in {inc}): reinstall it ({fix})")
    return str(stable_copy(inc.resolve(), config.load(root=root).build_dir / "pkg-include" / f"{dist}-{pin}"))


def stable_copy(src: Path, dest: Path) -> Path:
    """`src` copied once to `dest`, one path per checkout and pin: every session's venv installs its own copy of
    the headers, so naming the venv's path would change ninja's command lines (and rebuild every instance) per
    session. An existing `dest` is kept (its files' times too, so ninja sees no newer header); the copy is
    made beside it and renamed into place, so an interrupted copy is never taken for a finished one."""
    if dest.is_dir():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp, symlinks=True)
    try:
        os.rename(tmp, dest)
    except OSError:  # another build renamed its copy first: keep that one
        shutil.rmtree(tmp, ignore_errors=True)
        if not dest.is_dir():
            raise
    return dest


def package_includes(root: Path, modules: dict[str, dict], kinds: dict[str, list[str]], resolve: bool
                     ) -> dict[str, str]:
    """{placeholder: value} for the placeholders the compiled kinds' flags name.

    resolve=True: the installed package's include dir (the build); False: a token naming the pinned
    version (the recipe, so the cache id changes with the pin and never with where it is installed).
    """
    used = {ph for name, m in modules.items() for kind in kinds[name]
            for f in m.get("extra_flags", {}).get(kind, []) for ph in re.findall(r"\{(\w+)\}", f)}
    unknown = used - PACKAGE_INCLUDES.keys()
    if unknown:
        raise BuildError(f"unknown placeholder(s) {', '.join(sorted(unknown))} in extra_flags; known: "
                         f"{', '.join(PACKAGE_INCLUDES)}")
    pinned = lambda ph: f"$PKG({PACKAGE_INCLUDES[ph][0]}=={package_pin(root, PACKAGE_INCLUDES[ph][0])})"
    return {ph: package_include(root, ph) if resolve else pinned(ph) for ph in sorted(used)}


@dataclass(frozen=True)
class Compile:
    module: str
    rule: str          # cxx | gpu | an ARCH_KINDS kind (also the key of its extra_flags)
    src: str           # path relative to the root
    obj: str
    extra: tuple[str, ...]


def plan(modules: dict[str, dict], sources: dict[str, dict[str, list[Path]]], tc: toolchain.Toolchain,
         settings: config.Settings, packages: dict[str, str] | None = None) -> list[Compile]:
    """Every compilation of the build, in order (ninja_text writes them; recipe() hashes them).

    `packages` fills the {placeholder}s of arch kinds' extra flags (package_includes)."""
    root = settings.root
    jit_dir = os.path.relpath(settings.jit_dir, root)
    steps = []
    for name, module in modules.items():
        extra, gen = module.get("extra_flags", {}), sources[name]
        srcs = [(p, "cxx") for p in gen.get("cpu", [])] + [(p, "gpu") for p in gen.get("gpu", [])]
        srcs += [(root / s, "gpu" if s.endswith(".cu") else "cxx") for s in module.get("sources", [])
                 if tc.backend != "cpu" or not s.endswith(".cu")]
        srcs += [(p, k) for k in ARCH_KINDS for p in gen.get(k, [])]
        for src, rule in srcs:
            flags = [f.format(**(packages or {})) if rule in ARCH_KINDS else f for f in extra.get(rule, [])]
            steps.append(Compile(name, rule, os.path.relpath(src, root), f"{jit_dir}/{name}/obj/{Path(src).name}.o",
                                 (f"-I{jit_dir}/{name}/gen", *flags)))
    return steps


def link_args(flags: dict[str, list[str]], settings: config.Settings) -> list[str]:
    """The link line after the objects (the same for every library; $soname is ninja's, per library)."""
    lp = flags["link_pass"][0]
    umb_dir = os.path.relpath(settings.umbrella_dir, settings.root)
    return [f"{lp}--no-as-needed", f"-L{umb_dir}", "-ljax_aiter", f"{lp}-soname=$soname",
            f"{lp}--enable-new-dtags", f"{lp}-rpath=$ORIGIN:$ORIGIN/../jax_aiter_build", *flags["libs"]]


def _q(args) -> str:
    return " ".join(shlex.quote(a).replace("$", "$$") for a in args)


def _compile_rule(name: str, command: str, description: str) -> list[str]:
    return [f"rule {name}", f"  command = {command} $extra -MMD -MP -MF $out.d -c $in -o $out",
            "  depfile = $out.d", "  deps = gcc", f"  description = {description}"]


def ninja_text(modules: dict[str, dict], steps: list[Compile], tc: toolchain.Toolchain,
               flags: dict[str, list[str]], settings: config.Settings, ccache: str | None) -> str:
    jit_dir = os.path.relpath(settings.jit_dir, settings.root)
    umb_dir = os.path.relpath(settings.umbrella_dir, settings.root)
    launcher = f"{ccache} " if ccache else ""
    lines = ["# Generated by jatools/native/jit_build.py; do not edit.", "ninja_required_version = 1.10",
             f"builddir = {jit_dir}", f"cxx = {launcher}{shlex.quote(tc.cxx)}", f"cxxflags = {_q(flags['cxx'])}",
             *_compile_rule("cxx", "$cxx $cxxflags", "CXX $in")]
    if tc.backend != "cpu":
        gpu = tc.backend.upper()
        lines += [f"gpucc = {launcher}{shlex.quote(tc.gpu_compiler)}", f"gpuflags = {_q(flags['gpu'])}",
                  *_compile_rule("gpu", "$gpucc $gpuflags", f"{gpu} $in")]
        for kind in sorted({s.rule for s in steps} & ARCH_KINDS.keys()):
            lines += [f"gpuflags_{kind} = {_q(arch_kind_flags(flags, tc, kind))}",
                      *_compile_rule(kind, f"$gpucc $gpuflags_{kind}", f"{gpu} {ARCH_KINDS[kind][1]} $in")]
    post = _q(link_args(flags, settings)).replace("$$soname", "$soname")
    lines += ["rule link", f"  command = {_q(flags['link'])} -o $out.tmp $in {post} && mv -f $out.tmp $out",
              "  description = LINK $out"]
    for step in steps:
        lines += [f"build {step.obj}: {step.rule} {step.src}", f"  extra = {_q(step.extra)}"]
    for name, module in modules.items():
        objs = " ".join(s.obj for s in steps if s.module == name)
        lines += [f"build {jit_dir}/{module['library']}: link {objs} | {umb_dir}/libjax_aiter.so",
                  f"  soname = {module['library']}"]
    return "\n".join(lines) + "\n"


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
    modules = module_table(settings)
    flags = toolchain.compile_flags(tc, settings)
    texts: dict[str, str] = {}
    sources: dict[str, dict[str, list[Path]]] = {}
    kinds_of = {name: build_kinds(module, tc) for name, module in modules.items()}
    for name, module in modules.items():
        t, sources[name] = generated(name, module, kinds_of[name], settings.jit_dir, root)
        texts.update({os.path.relpath(p, root): v for p, v in t.items()})
    steps = plan(modules, sources, tc, settings, package_includes(root, modules, kinds_of, resolve=False))
    flags.update({k: arch_kind_flags(flags, tc, k) for k in {s.rule for s in steps} & ARCH_KINDS.keys()})
    # Left out: where the checkout and its build folders are, and where the link driver is (link[0]):
    # they differ between machines, not between outputs.
    places = ((str(root), "$ROOT"), (os.path.relpath(settings.jit_dir, root), "$JIT"),
              (os.path.relpath(settings.umbrella_dir, root), "$UMBRELLA"))
    norm = lambda arg: functools.reduce(lambda a, place: a.replace(*place), places, arg)
    strip = lambda args: [norm(a) for a in args]
    lines = {"cxx": strip(flags["cxx"]), "gpu": strip(flags["gpu"]),
             **{k: strip(flags[k]) for k in ARCH_KINDS if k in flags},
             "link": strip([*flags["link"][1:], *link_args(flags, settings)]),
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
    backend, FFI API version: jax_aiter.reuse_gate); the toolchain is recorded as advisory provenance."""
    rev, dirty = kernel_source_revision(settings.root, settings.kernel_source_dir)
    major, minor = toolchain.ffi_api_version(settings.ffi_include_dir)
    ident = {"kernel_source_revision": rev, "kernel_source_dirty": dirty, "gpu_archs": sorted(tc.archs),
             "recipe_hash": recipe_hash, "backend": tc.backend, "ffi_api_version": f"{major}.{minor}",
             "toolchain": tc.identity()}
    ident["cache_id"] = cache_id(ident)
    return ident


def path_filter(settings: config.Settings) -> list[str]:
    """The paths whose change can change a cache id (ci/build.py --jit-inputs-changed: ci.yml then calls the
    producer, jit-libs.yml): the
    folders of every file a build of any backend reads (two levels deep), the code and settings its command
    lines come from, and the workflow; not the op table's data (docs/jit-libs.md says why)."""
    root = settings.root
    found: set[str] = set()
    for backend in ("cpu", "cuda", "rocm"):
        tc = toolchain.Toolchain(backend, cxx="", cxx_version="", gpu_compiler=None if backend == "cpu" else "",
                                 archs=settings.default_archs(backend))
        found |= {"/".join(Path(p).parts[:2]) + "/**" for p in recipe(settings, tc)[1]}
    code = {Path(m.__file__).resolve().relative_to(root).as_posix() for m in (config, toolchain, op_table)}
    code.add(Path(__file__).resolve().relative_to(root).as_posix())
    return sorted(found | code | {"pyproject.toml", os.path.relpath(settings.jit_config, root),
                                  ".github/workflows/jit-libs.yml"})


def check_depfiles(settings: config.Settings, build_file: Path, covered: set[str], packages: tuple[str, ...] = ()
                   ) -> None:
    """Fail when a compiler read a repository file that the recipe's include scan did not cover.

    Headers under `packages` (pinned header-only packages, possibly installed inside the checkout,
    e.g. in a .venv) are covered by their pin in the recipe."""
    out = subprocess.run([find_ninja(), "-f", str(build_file), "-t", "deps"], cwd=settings.root,
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise BuildError(f"`ninja -t deps` failed: {out.stderr.strip()}")
    root = str(settings.root)
    jit_dir = os.path.relpath(settings.jit_dir, root)
    missed = set()
    for dep in (line.strip() for line in out.stdout.splitlines() if line.startswith("    ")):
        rel = os.path.normpath(os.path.relpath(dep, root) if os.path.isabs(dep) else dep)
        if not (rel in covered or rel.startswith(("..", jit_dir + os.sep)) or any(
                os.path.abspath(os.path.join(root, dep)).startswith(p + os.sep) for p in packages)):
            missed.add(rel)
    if missed:
        raise BuildError("the compilers read repository files that the recipe hash does not cover: "
                         f"{', '.join(sorted(missed))}; the include scan in jatools/native/jit_build.py missed them "
                         "(a computed #include?), so the cache id would not change when they do. Fix the scan.")


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
        bare = toolchain.Toolchain(settings.backend, cxx="", cxx_version="", archs=tuple(archs),
                                   gpu_compiler="" if settings.backend != "cpu" else None)
        ident = {**derive_identity(settings, bare, recipe(settings, bare)[0]), "toolchain": None}
        return ident, [(f"toolchain not detected ({e}); identity from JA_BACKEND={settings.backend} and "
                        f"GPU_ARCHS={';'.join(archs) or '(none)'}, toolchain not compared")]


def find_ninja() -> str:
    for cand in (shutil.which("ninja"), str(Path(sys.executable).parent / "ninja")):
        if cand and Path(cand).exists():
            return cand
    try:  # the PyPI package ships the binary inside the module
        import ninja  # type: ignore

        return str(Path(ninja.BIN_DIR) / "ninja")
    except ImportError:
        raise BuildError("ninja not found; install it with `pip install ninja` (or apt-get install ninja-build)")


def run_ninja(build_file: Path, jobs: int | None, verbose: bool, log, cwd: Path) -> int:
    """Run ninja, showing instances done/total (a live line on a terminal, plain lines in CI); the steps run."""
    cmd = [find_ninja(), "-f", str(build_file)] + (["-j", str(jobs)] if jobs else []) + (["-v"] if verbose else [])
    tty = sys.stdout.isatty() and not os.environ.get("CI")
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "NINJA_STATUS": "[%f/%t] "})
    done = 0
    failed: list[str] = []
    for line in proc.stdout:  # type: ignore[union-attr]
        log.write(line)
        m = re.match(r"\[(\d+)/(\d+)\] (.*)", line)
        if m and tty and not verbose:
            done = int(m.group(1))
            sys.stdout.write(f"\r  [{done}/{m.group(2)}] {m.group(3)[:100]:<100}")
            sys.stdout.flush()
        elif m:
            done = int(m.group(1))
            print(f"  [{done}/{m.group(2)}] {m.group(3)}", flush=True)
        elif line.strip() and not line.startswith("ninja: no work"):
            failed.append(line)
            if verbose or not tty:
                print(line, end="")
    rc = proc.wait()
    if tty and not verbose and done:
        print()
    if rc != 0:
        sys.stderr.write("".join(failed[-60:]))
        raise BuildError(f"compilation failed (ninja exit {rc}); full log above"
                         + (f" and in {log.name}" if getattr(log, "name", "").endswith(".log") else ""))
    return done


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
    all_modules = module_table(settings)
    names = module_names or list(all_modules)
    unknown = [n for n in names if n not in all_modules]
    if unknown:
        raise BuildError(f"unknown module(s) {', '.join(unknown)}; known: {', '.join(all_modules)}")
    umbrella = settings.umbrella_dir / "libjax_aiter.so"
    if not umbrella.exists():
        raise BuildError(f"{umbrella.relative_to(settings.root)} is missing; run `make` (or `nox -s umbrella`) first")
    modules = {n: all_modules[n] for n in names}
    kinds_of = {n: build_kinds(m, tc) for n, m in modules.items()}
    packages = package_includes(settings.root, modules, kinds_of, resolve=True)
    print(f"build_jit: backend {tc.backend}" + (f", archs {';'.join(tc.archs)}" if tc.archs else "")
          + f", modules {', '.join(names)}", flush=True)
    for note in tc.how:
        print(f"  {note}")
    for ph, inc in packages.items():
        print(f"  {PACKAGE_INCLUDES[ph][0]} headers: {inc}")
    recipe_hash, inputs = recipe(settings, tc)  # over every module: one identity for the set
    ident = derive_identity(settings, tc, recipe_hash)
    if ident["kernel_source_dirty"]:
        print("  note: the kernel sources have uncommitted changes; this build cannot be published", flush=True)
    start = time.monotonic()
    sources = {n: generate(n, m, kinds_of[n], settings.jit_dir, settings.root) for n, m in modules.items()}
    counts = {n: sum(len(v) for v in s.values()) for n, s in sources.items()}
    ccache = shutil.which("ccache")
    if ccache:
        print(f"  compiler cache: {ccache}")
    build_file = settings.jit_dir / "build.ninja"
    write_if_changed(build_file, ninja_text(modules, plan(modules, sources, tc, settings, packages), tc,
                                            toolchain.compile_flags(tc, settings), settings, ccache))
    with open(log_path or os.devnull, "a") as log:
        done = run_ninja(build_file, jobs, verbose, log, settings.root)
    check_depfiles(settings, build_file, set(inputs), tuple(packages.values()))
    seconds = time.monotonic() - start
    record = write_record(settings, tc, ident, modules, counts, seconds)
    print(f"build_jit: {sum(counts.values())} instances, {done} build steps run, {seconds:.1f} s; "
          f"record {record.relative_to(settings.root)}", flush=True)
    for n, m in modules.items():
        size = (settings.jit_dir / m["library"]).stat().st_size
        print(f"  {m['library']:<20} {size / 1e6:8.2f} MB  {counts[n]} instances")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="build_jit.py", description=__doc__.splitlines()[0])
    p.add_argument("--module", help="comma-separated modules (default: every one the op table needs)")
    p.add_argument("--verbose", action="store_true", help="print every compiler command")
    p.add_argument("--log", type=Path, help="append the full compiler output to this file")
    p.add_argument("-j", "--jobs", type=int, help="parallel compile jobs (default: ninja's)")
    args = p.parse_args(argv)
    modules = [m.strip() for m in args.module.split(",") if m.strip()] if args.module else None
    try:
        build(modules, args.jobs, args.verbose, args.log)
    except (BuildError, toolchain.ToolchainError, ValueError) as e:
        print(f"build_jit: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
