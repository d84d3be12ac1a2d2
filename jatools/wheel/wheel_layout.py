"""The wheel layout and content policy (jatools/wheel/wheel_layout.toml plus the op table), read once and shared.

The builder decides what to stage from it and `invoke contents` what a built wheel must and may hold, so the
two cannot drift apart. The op libraries (each op's shim and JIT libraries), and which of them a variant that
fetches leaves out, come from the op table (jax_aiter/op_table.toml).
"""
from __future__ import annotations

import fnmatch
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path

from packaging.version import Version

from jatools import config
from jax_aiter import op_table, remedies

LAYOUT_FILE = Path(__file__).with_name("wheel_layout.toml")
SOURCE_VARIANT = "source"  # what an sdist without libraries builds by default (build_backend.py)
# The build folder (config.BUILD_TREE) each kind of library is made in.
KIND_TREE = {"umbrella": "umbrella", "shim": "umbrella", "jit": "jit"}


class LayoutError(RuntimeError):
    """The layout data is inconsistent, or a variant name is unknown."""


@dataclass(frozen=True)
class LibrarySpec:
    name: str
    dir: str  # build folder under the build dir (KIND_TREE)
    kind: str  # umbrella | shim | jit
    module: str | None = None  # JIT module (the op table's)
    op: str | None = None  # shim's op (csrc/ffi/<op>)

    def fix_command(self) -> str:
        """The command that produces this library, for error messages."""
        if self.kind == "jit":
            return remedies.build_or_fetch([self.module])
        return "make ja_mods (or nox -s ja_mods)" if self.kind == "shim" else "make (or nox -s umbrella)"


@dataclass(frozen=True)
class Lane:
    """A backend's release lane: `name` is the local label of its wheels' versions (cuda13, rocm7, cpu)."""

    backend: str
    name: str
    toolkit: int | None = None  # the GPU toolkit's major version the lane is named for


@dataclass(frozen=True)
class Variant:
    name: str
    local_version: str
    libraries: tuple[str, ...]
    fetched: tuple[str, ...]

    def version(self, public: str, lane: Lane | None = None) -> str:
        """The distribution version: the public one plus the local label, the lane's name then the variant's
        (0.1.0+cuda13, 0.1.0+cuda13.full); the source variant keeps the sdist's public version."""
        if Version(public).local:
            raise LayoutError(f"the project version {public!r} already has a local label")
        label = ".".join(p for p in (lane.name if lane and self.name != SOURCE_VARIANT else "", self.local_version)
                         if p)
        return str(Version(f"{public}+{label}" if label else public))


@dataclass(frozen=True)
class Layout:
    lib_dir: str
    identity_file: str
    libraries: dict[str, LibrarySpec]
    variants: dict[str, Variant]
    required_files: tuple[str, ...]  # every file every wheel holds besides libraries and identity (data files too)
    data_files: tuple[str, ...]  # the package's non-Python files, copied from the checkout
    dist_info_files: tuple[str, ...]
    external: dict[str, tuple[str, ...]]
    runpath_forbidden: tuple[str, ...]
    lanes: dict[str, Lane] = field(default_factory=dict)  # {backend: its lane}
    dropped: tuple[str, ...] = ()  # libraries removed with without(); reported, never silent

    @classmethod
    def load(cls, root: Path | None = None) -> Layout:
        """The layout, its op libraries from the op table of the checkout at `root` (default: the table of the
        jax_aiter package imported here)."""
        data = tomllib.loads(LAYOUT_FILE.read_text())
        ops = op_table.load(root)
        files, folder = data["files"], lambda kind: config.BUILD_TREE[KIND_TREE[kind]]
        libs = {name: LibrarySpec(name, folder(spec["kind"]), **spec) for name, spec in data["libraries"].items()}
        libs |= {lib: LibrarySpec(lib, folder("jit"), "jit", module=m)
                 for m, lib in op_table.jit_libraries(ops).items()}
        libs |= {op.shim: LibrarySpec(op.shim, folder("shim"), "shim", op=name) for name, op in ops.items()}
        fetched = tuple(op_table.fetched_libraries(ops).values())
        variants = {}
        for name, v in data["variants"].items():
            out = fetched if v["fetches"] else ()
            variants[name] = Variant(name, v["local_version"], tuple(n for n in libs if n not in out), out)
        lanes = {backend: Lane(backend, **spec) for backend, spec in data["lanes"].items()}
        return cls(data["lib_dir"], data["identity_file"], libs, variants, (*files["required"], *files["data"]),
                   tuple(files["data"]), tuple(files["dist_info"]), {k: tuple(v) for k, v in data["external"].items()},
                   tuple(data["runpath"]["forbidden_substrings"]), lanes)

    def variant(self, name: str) -> Variant:
        try:
            return self.variants[name]
        except KeyError:
            raise LayoutError(f"unknown wheel variant {name!r}; known: {', '.join(self.variants)}") from None

    def lane(self, backend: str) -> Lane:
        try:
            return self.lanes[backend]
        except KeyError:
            raise LayoutError(f"no lane for backend {backend!r} in {LAYOUT_FILE.name}; lanes: "
                              f"{', '.join(f'{b}: {lane.name}' for b, lane in self.lanes.items())}") from None

    def lane_for_version(self, version: str) -> Lane | None:
        """The lane a wheel version names (its local label's first part), None for a public version."""
        first = (Version(version).local or "").split(".")[0]
        return next((lane for lane in self.lanes.values() if lane.name == first), None)

    def variant_for_version(self, version: str, named: str | None = None) -> Variant:
        """The variant a wheel version belongs to (its local label after the lane's name); where several share the
        label (lite and source: none), the one `named` (the identity's variant), else the first declared."""
        local = Version(version).local or ""
        lane = self.lane_for_version(version)
        rest = local.split(".", 1)[1] if lane and "." in local else "" if lane else local
        matching = [v for v in self.variants.values() if v.local_version == rest]
        if matching:  # the named one, else the one the label implies (no lane: the source build), else the first
            return next((v for v in matching if v.name == named), next(
                (v for v in matching if (lane is None) == (v.name == SOURCE_VARIANT)), matching[0]))
        raise LayoutError(f"version {version} has local label {local!r}, which names no lane and wheel variant "
                          f"(lanes: {', '.join(lane.name for lane in self.lanes.values())}; variants: "
                          f"{', '.join(f'{v.name}: {v.local_version!r}' for v in self.variants.values())})")

    def without(self, names: list[str] | tuple[str, ...]) -> Layout:
        """A copy with `names` removed from every variant (for checkouts that cannot build them yet)."""
        drop = set(names)
        variants = {k: replace(v, libraries=tuple(n for n in v.libraries if n not in drop))
                    for k, v in self.variants.items()}
        return replace(self, variants=variants, dropped=tuple(sorted(set(self.dropped) | drop)))

    def lib_member(self, name: str) -> str:
        return f"{self.lib_dir}/{name}"

    def external_allowed(self, soname: str, backend: str) -> bool:
        patterns = self.external.get("common", ()) + self.external.get(backend, ())
        return any(fnmatch.fnmatchcase(soname, p) for p in patterns)


def python_packages(root: Path | None = None) -> list[str]:
    """The packages pyproject's [tool.jax-aiter] `packages` lists: the Python part of every wheel."""
    return list(config.defaults(root or config.repo_root())["packages"])


def python_files(root: Path | None = None) -> list[str]:
    """Every *.py file of those packages, as wheel member paths, sorted."""
    root = root or config.repo_root()
    return sorted(p.relative_to(root).as_posix() for pkg in python_packages(root)
                  for p in (root / pkg.replace(".", "/")).glob("*.py") if p.is_file())
