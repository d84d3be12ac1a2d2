"""The stage rules, in one table: which package may import which. Data flows one way, and so do imports.

A module belongs to the stage whose prefix names it most closely; it may import its own stage and the
stages before it, never a later one. `violations` and `cycles` read the imports (every `import`, at any
depth, with the standard library's ast; nothing is imported) of jax_aiter/ and jatools/, and
tests/tooling/test_stages.py fails on either. docs/architecture.md shows this table (`markdown`).
"""
from __future__ import annotations

import ast
import graphlib
from pathlib import Path

# (stage, module prefixes, what it is), in order: each stage may import only from itself and those above.
STAGES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("runtime", ("jax_aiter",), "the shipped package: JAX, numpy and itself, never the tooling"),
    ("base", ("jatools", "jatools.atomic_write", "jatools.config", "jatools.steps", "jatools.probe", "jatools.stages",
              "jatools.private_dir"),
     "settings, the one atomic write, the one step runner, the bounded tool probe, this table, private folders"),
    ("native-tools", ("jatools.native.toolchain", "jatools.native.compiler_cache", "jatools.native.jit_modules",
                      "jatools.native.jit_packages", "jatools.native.jit_ninja", "jatools.native.jit_build"),
     ("toolchain detection, the compiler cache; the JIT build: its modules and sources, pinned headers, ninja, "
     "its identity")),
    ("ci", ("jatools.ci",), "environment report, convergence-decision check"),
    ("jitlibs", ("jatools.jitlibs",), "the JIT libraries after the build: record, expect, decide, download, publish"),
    ("native", ("jatools.native",), "the one native-build sequence (its consumer check reads jitlibs), sanitizers"),
    ("wheel", ("jatools.wheel",), "libraries -> wheels, and every check on a wheel"),
    ("validate", ("jatools.validate",), "wheels -> clean room"),
    ("testing", ("jatools.testing",), "tiers, GPU slots, the pytest plugin"),
    ("release", ("jatools.release", "jatools.release_index", "jatools.bench"),
     "the main job, the artifact index and the tooling benchmarks"),
)
PACKAGES = ("jax_aiter", "jatools")


def stage_of(module: str) -> int:
    """The index in STAGES of the stage whose prefix names `module` most closely."""
    best = max(((len(p), i) for i, (_, prefixes, _) in enumerate(STAGES) for p in prefixes
                if module == p or module.startswith(p + ".")), default=None)
    if best is None:
        raise KeyError(f"{module} is in no stage of jatools/stages.py STAGES; add its prefix there")
    return best[1]


def modules(root: Path) -> dict[str, Path]:
    """{dotted module name: file} of every Python file under root's PACKAGES."""
    out = {}
    for top in PACKAGES:
        for path in sorted((root / top).rglob("*.py")):
            if "__pycache__" not in path.parts:
                name = ".".join(path.relative_to(root).with_suffix("").parts)
                out[name.removesuffix(".__init__")] = path
    return out


def _imported(name: str, path: Path, node: ast.Import | ast.ImportFrom, known: dict[str, Path]) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:  # relative: from the package holding `name`
        package = name.split(".")[: len(name.split(".")) - (path.name != "__init__.py")]
        base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]


def import_graph(root: Path) -> dict[str, set[str]]:
    """{module: the project modules it imports}, for every module of PACKAGES under root."""
    known = modules(root)
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                for target in _imported(name, path, node, known):
                    while target not in known and "." in target:  # `from pkg.mod import name` -> pkg.mod
                        target = target.rsplit(".", 1)[0]
                    if target in known and target != name:
                        deps.add(target)
        graph[name] = deps
    return graph


def violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a later stage, as `module (stage) imports target (stage)`."""
    out = []
    for name, deps in sorted(graph.items()):
        for dep in sorted(deps):
            if stage_of(dep) > stage_of(name):
                out.append(f"{name} ({STAGES[stage_of(name)][0]}) imports {dep} ({STAGES[stage_of(dep)][0]}), "
                           "a later stage")
    return out


def cycles(graph: dict[str, set[str]]) -> list[str]:
    """An import cycle, as `a -> b -> a`, or none."""
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as e:
        return [" -> ".join(reversed(e.args[1]))]
    return []


def markdown() -> str:
    """STAGES as the table docs/architecture.md shows."""
    rows = [f"| {i} | {stage} | {', '.join(f'`{p}`' for p in prefixes)} | {what} |"
            for i, (stage, prefixes, what) in enumerate(STAGES)]
    return "\n".join(["| # | stage | modules | what |", "|---|---|---|---|", *rows])
