"""Project defaults from pyproject.toml ``[tool.jax-aiter]``, overridden by the environment.

Precedence: command-line flags > environment > pyproject defaults. Callers pass
flags explicitly; this module resolves the other two layers in one place. Which
variable and which pyproject key make each setting is jax_aiter/settings.py's
table; docs/settings.md is generated from it:

    python3 -m jatools.config --settings-doc > docs/settings.md
"""
from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from jax_aiter import settings as registry

REPO_ROOT = Path(__file__).resolve().parent.parent

VALID_BACKENDS = registry.BY_NAME["JA_BACKEND"].choices
VALID_SANITIZERS = registry.BY_NAME["JA_SANITIZE"].choices
JIT_MODES = registry.BY_NAME["JA_JIT_LIBS"].choices


def repo_root() -> Path:
    """The checkout root: JA_ROOT_DIR when set (an existing folder), else the folder holding this package."""
    env = os.environ.get("JA_ROOT_DIR")
    if not (env or "").strip():
        return REPO_ROOT
    registry.check(registry.BY_NAME["JA_ROOT_DIR"], env)
    return Path(env).resolve()


SettingError = registry.SettingError

# The build tree: what the build and the tooling write under the build dir (JA_BUILD_DIR, pyproject build_dir),
# one name each (`Settings.path`, `build_path`). The library folders are jax_aiter/settings.py's (the runtime's
# loader searches them); the Makefile spells the ones make writes, and tests/tooling/test_build_tree.py holds it
# (and every other copy outside Python) to this table.
BUILD_TREE = {
    **registry.LIBRARY_DIRS,            # umbrella: libjax_aiter.so and the FFI shims; jit: the JIT libraries
    "config_mk": registry.CONFIG_MK,    # make's toolchain and flags (jatools/native/toolchain.py writes it)
    "obj": "obj",                       # make's objects, a folder per backend
    "pkg_include": "pkg-include",       # pinned header packages, copied once per pin (jatools/native/jit_packages.py)
    "compile_only": "compile_only",     # a build tree per GPU backend (nox -s compile_only)
    "sanitize": "sanitize",             # the sanitizer builds' trees (nox -s sanitize, nox -s tsan)
    "sanitize_thread": "sanitize-thread",
    "wheel_stage": "wheel_stage",       # the staged wheel trees (make clean-stage removes them)
    "reports": "reports",               # the wheel builds' JSON reports
    "jit_publish": "jit-libs-publish",  # a JIT-library release staged for publishing
    "jit_shards": "jit-shards",         # the JIT producer's per-module shards, before the merge
    "jit_store": "jit-store",           # a run's own JIT-library store (a kernel PR's producer publishes there)
    "release": "release",               # the release's log per stage
    "test_results": "test-results",     # the tiers' JSON results
    "ci_records": "ci-records",         # ci/build.py's record of each build's commands, the environment report
    "ci_local": "ci-local",             # nox -s ci_local's logs, one per act run
    "bench": "bench",                   # the benchmarks' JSON results and the GPU timer (nox -s bench, benchmarks/)
    "compiler_cache": "compiler-cache", # ccache's stats log and make's launcher settings (native/compiler_cache.py)
    "cache_mk": "cache.mk",             # make's compiler-cache launcher (jatools/native/compiler_cache.py writes it)
}


TABLE = "jax-aiter"  # [tool.jax-aiter]


def _read_pyproject(root: str) -> dict:
    path = Path(root) / "pyproject.toml"
    try:
        return registry.load_toml(path)
    except OSError as e:
        raise SettingError(f"cannot read {path}: {e.strerror}; set JA_ROOT_DIR to a jax-aiter checkout") from None


def read_pyproject(root: Path | None = None) -> dict:
    """The checkout's pyproject.toml, parsed; SettingError naming the file when it cannot be read
    or is not valid TOML. Every reader of pyproject.toml in the tooling goes through it."""
    return _read_pyproject(str(root or repo_root()))


def dependency_group(name: str, root: Path | None = None) -> list[str]:
    """A [dependency-groups] group's requirements, its {include-group = ...} entries expanded (PEP 735)."""
    groups = read_pyproject(root)["dependency-groups"]

    def expand(group: str) -> list[str]:
        return [x for r in groups[group] for x in (expand(r["include-group"]) if isinstance(r, dict) else [r])]
    return expand(name)


def _near_miss(tool: dict, path: Path) -> None:
    """A table that looks like [tool.jax-aiter] and is not ([tool.jax_aiter], [tool.jaxaiter], [tool.jax-aitr]) would
    be ignored whole, its settings with it: refused instead."""
    for name in tool:
        if name != TABLE and (name.lower().replace("_", "-").replace(".", "-") == TABLE
                              or name.lower().replace("_", "").replace("-", "") == TABLE.replace("-", "")
                              or difflib.get_close_matches(name.lower(), [TABLE], n=1, cutoff=0.8)):
            raise SettingError(f"[tool.{name}] in {path} is not read by jax-aiter: its table is [tool.{TABLE}] (a "
                               f"hyphen); rename the table to [tool.{TABLE}]" + (
                                   f" and merge it with the [tool.{TABLE}] table there" if TABLE in tool else ""))


@cache
def _pyproject_defaults(root: str) -> dict:
    """The checked ``[tool.jax-aiter]`` table of the checkout `root` (jax_aiter/settings.py's table checks it)."""
    path = Path(root) / "pyproject.toml"
    tool = _read_pyproject(root).get("tool", {})
    _near_miss(tool, path)
    table = tool.get(TABLE)
    if not isinstance(table, dict):
        raise SettingError(f"{path} has no [tool.{TABLE}] table; is {root} a jax-aiter checkout?")
    registry.check_pyproject(table, path)
    return dict(table)


def defaults(root: Path | None = None) -> dict:
    """The raw ``[tool.jax-aiter]`` table."""
    return dict(_pyproject_defaults(str(root or repo_root())))


def setting(name: str, env: dict[str, str] | None = None, root: Path | None = None) -> object:
    """A setting by its variable: the environment when set and not blank, else its default (the pyproject key
    jax_aiter/settings.py names for it, else the default that table holds)."""
    env = os.environ if env is None else env
    if (env.get(name) or "").strip():
        return env[name]
    spec = registry.BY_NAME[name]
    return defaults(root)[spec.key] if spec.key else spec.default


def project_version(root: Path | None = None) -> str:
    return read_pyproject(root)["project"]["version"]


def python_version(root: Path | None = None) -> str:
    """The Python every build, session and CI job uses: the floor of pyproject's ``requires-python`` (its one
    home; JAX 0.11 needs 3.12), e.g. ``>=3.12`` gives ``3.12``."""
    spec = read_pyproject(root)["project"]["requires-python"]
    floor = re.fullmatch(r"\s*>=\s*(\d+\.\d+)\s*", spec)
    if not floor:
        raise SettingError(f"pyproject.toml: requires-python {spec!r} is not of the form '>=X.Y'; "
                           "write the Python floor the builds use, e.g. '>=3.12'")
    return floor.group(1)


def build_path(name: str, env: dict[str, str] | None = None) -> Path:
    """BUILD_TREE[name] under the build dir, relative to the checkout as JA_BUILD_DIR gives it (build/sanitize),
    without loading every setting: for a build tree of its own (a sanitizer's) or a run that reads no other."""
    return Path(str(setting("JA_BUILD_DIR", env))) / BUILD_TREE[name]


def split_archs(value: str) -> list[str]:
    """GPU_ARCHS accepts ';' or ',' separated lists; blanks are dropped, order kept, no repeats."""
    return list(dict.fromkeys(filter(None, (part.strip() for part in value.replace(";", ",").split(",")))))


def canonical_archs(archs) -> tuple[str, ...]:
    """GPU archs in one order whatever order they were written in (sm_80, sm_90, sm_90a, sm_100, sm_120; gfx90a,
    gfx942, gfx950): the compile flags, and so the recipe hash and the cache id, name them in this order, so
    `GPU_ARCHS=sm_100;sm_80` and `sm_80;sm_100` are one build (the identity lists them sorted as text, which put
    sm_100 before sm_80, and a build from that list hashed differently)."""
    key = lambda a: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", a)]
    return tuple(sorted(dict.fromkeys(archs), key=key))


def truthy(value: object) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class Settings:
    root: Path
    backend: str  # requested: auto|cpu|cuda|rocm
    gpu_archs: tuple[str, ...] | None  # None: use the backend's default
    symbol_visible: bool
    umbrella_dir: Path
    jit_dir: Path
    build_dir: Path
    kernel_source_dir: Path
    jit_config: Path
    ffi_include_dir: Path
    toolchain_strict: bool
    raw: dict
    sanitize: tuple[str, ...] = ()  # JA_SANITIZE, e.g. address,undefined (CPU backend only)

    def path(self, name: str) -> Path:
        """Where BUILD_TREE's `name` is in this build tree."""
        return self.build_dir / BUILD_TREE[name]

    def default_archs(self, backend: str) -> tuple[str, ...]:
        key = {"rocm": "gpu_archs_rocm", "cuda": "gpu_archs_cuda"}.get(backend)
        return tuple(split_archs(self.raw[key])) if key else ()


def load(backend: str | None = None, gpu_archs: str | None = None, root: Path | None = None,
         env: dict[str, str] | None = None) -> Settings:
    """Resolve settings: explicit arguments (flags) > environment > pyproject."""
    env = os.environ if env is None else env
    root = root or repo_root()
    raw = defaults(root)
    for group in ("build", "wheels and validation"):  # every variable these settings read, checked by the table
        registry.check_environment(env, group, root)
    chosen_backend = str(backend or setting("JA_BACKEND", env, root)).strip().lower()
    if chosen_backend not in VALID_BACKENDS:  # a caller's argument: the environment and pyproject are checked
        raise SettingError(f"backend {chosen_backend!r} is not valid: give one of {', '.join(VALID_BACKENDS)}")
    archs_text = gpu_archs if gpu_archs is not None else env.get("GPU_ARCHS")
    sanitize = tuple(split_archs(env.get("JA_SANITIZE", "")))
    if {"address", "thread"} <= set(sanitize):
        raise ValueError(f"JA_SANITIZE={env.get('JA_SANITIZE')!r}: use a comma list of {', '.join(VALID_SANITIZERS)} "
                         "(address and thread exclude each other), e.g. JA_SANITIZE=address,undefined")
    build_dir = root / setting("JA_BUILD_DIR", env, root)
    return Settings(root=root, backend=chosen_backend,
                    gpu_archs=tuple(split_archs(archs_text or "")) or None,
                    symbol_visible=truthy(setting("AITER_SYMBOL_VISIBLE", env, root)),
                    umbrella_dir=build_dir / BUILD_TREE["umbrella"], jit_dir=build_dir / BUILD_TREE["jit"],
                    build_dir=build_dir,
                    kernel_source_dir=root / raw["kernel_source_dir"], jit_config=root / raw["jit_config"],
                    ffi_include_dir=root / setting("JA_FFI_INCLUDE_DIR", env, root),
                    toolchain_strict=truthy(setting("JA_TOOLCHAIN_STRICT", env, root)), raw=raw, sanitize=sanitize)


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|")


def _default_cell(spec: registry.Setting, raw: dict) -> str:
    """A literal default as code; a default described in words (it has spaces) as it is."""
    value = raw[spec.key] if spec.key else spec.default
    if value is None:
        return ""
    if spec.kind is not None and not spec.key:
        value = spec.show(value)
    text = json.dumps(value) if isinstance(value, (list, bool)) else str(value)
    return _cell(text if " " in text and not spec.key else f"`{text}`")


def settings_doc(root: Path | None = None) -> str:
    """docs/settings.md: every setting of jax_aiter/settings.py by group, each default from pyproject or the table."""
    raw = defaults(root)
    lines = ["# Settings", "",
             ("<!-- Generated from jax_aiter/settings.py by "
              "`python3 -m jatools.config --settings-doc > docs/settings.md`;"),
             "     tests/tooling/test_layout.py fails when it is stale. -->", "",
             "Each setting has one home. Its default is in `pyproject.toml` under `[tool.jax-aiter]` (the key",
             "column), or, for the settings the installed runtime reads, in `jax_aiter/settings.py`; the",
             "environment variable overrides the default and a command-line flag overrides both. A blank",
             "variable counts as unset. Every value is checked when it is read, from the environment and from",
             "pyproject alike (numbers against their range, choices, flags, GPU arch lists, existing folders,",
             "paths inside the checkout; an unknown `[tool.jax-aiter]` key is refused): a bad one stops the",
             "command with the variable or key, the value, what is allowed and where it came from. Settings",
             "marked *internal* are set by our own processes or by CI; nobody sets them by hand.", ""]
    for group in registry.GROUPS:
        lines += [f"## {group[0].upper()}{group[1:]}", "", "| variable | pyproject key | default | accepts | meaning |",
                  "|---|---|---|---|---|"]
        for s in (s for s in registry.SETTINGS if s.group == group):
            meaning = f"*internal*: {s.meaning}" if s.internal else s.meaning
            lines.append(f"| {f'`{s.name}`' if s.name else ''} | {f'`{s.key}`' if s.key else ''} | "
                         f"{_default_cell(s, raw)} | {_cell(s.accepted())} | {_cell(meaning)} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m jatools.config", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--settings-doc", action="store_true", required=True,
                   help="print docs/settings.md, generated from jax_aiter/settings.py and pyproject.toml")
    p.parse_args(argv)
    sys.stdout.write(settings_doc())
    return 0


if __name__ == "__main__":
    sys.exit(main())
