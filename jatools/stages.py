"""The stage rules, in one table: which package may import which. Data flows one way, and so do imports.

A module belongs to the stage whose prefix names it most closely; it may import its own stage and the
stages before it, never a later one. `violations` and `cycles` read the imports (every `import`, at any
depth, with the standard library's ast; nothing is imported) of every package of PACKAGES: the runtime, the
tooling, and the programs of benchmarks/ and ci/, which are packages of the checkout run as modules from its root
(`python3 -m ci.perf.bench_gate`), so none of them edits `sys.path` to find another (`path_edits`).
tests/tooling/test_stages.py fails on any of the three. docs/architecture.md shows this table (`markdown`).
"""
from __future__ import annotations

import ast
import graphlib
from pathlib import Path

# (stage, module prefixes, what it is), in order: each stage may import only from itself and those above.
STAGES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("runtime", ("jax_aiter",), "the shipped package: JAX, numpy and itself, never the tooling"),
    ("base", ("jatools", "jatools.atomic_write", "jatools.config", "jatools.steps", "jatools.stages",
              "jatools.private_dir"),
     "settings, the one atomic write, the one step runner, this table, private folders"),
    ("native-tools", ("jatools.native.toolchain", "jatools.native.compiler_cache", "jatools.native.jit_modules",
                      "jatools.native.jit_packages", "jatools.native.jit_ninja", "jatools.native.jit_build",
                      "jatools.native.tree_lock"),
     ("toolchain detection, the compiler cache; the JIT build: its modules and sources, pinned headers, ninja, "
     "its identity")),
    ("ci", ("jatools.ci",), "environment report, convergence-decision check"),
    ("jitlibs", ("jatools.jitlibs",), "the JIT libraries after the build: record, expect, decide, download, publish"),
    ("native", ("jatools.native",), ("the one native-build sequence (its consumer check reads jitlibs), sanitizers, "
                                     "the sm_90a backward's SASS check")),
    ("wheel", ("jatools.wheel",), "libraries -> wheels, and every check on a wheel"),
    ("validate", ("jatools.validate",), "wheels -> clean room"),
    ("testing", ("jatools.testing",), "tiers, GPU slots, the pytest plugin"),
    ("release", ("jatools.release", "jatools.release_index", "jatools.lane_tier", "jatools.bench"),
     "the main job, the artifact index, a tier against a lane's validated wheel, the tooling benchmarks"),
    ("benchmarks", ("benchmarks",), "the kernel benchmarks (GPU, CPU attention) and the model they time"),
    ("ci-programs", ("ci",), "CI's programs: the driver of every build, perf gates, the convergence recipe, GPU hosts"),
)
PACKAGES = ("jax_aiter", "jatools", "benchmarks", "ci")
PATH_EDITS = frozenset({"insert", "append", "extend", "remove", "pop", "clear", "__setitem__", "__iadd__"})


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


def path_edits(root: Path) -> list[str]:
    """Every change to `sys.path` in a module of PACKAGES (an insert, append, extend, remove or assignment of it or
    of a slice), as `file:line: code`: a module finds the others by its package, never by editing the search path."""
    out = []
    for path in modules(root).values():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            target = None
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in PATH_EDITS:
                target = node.func.value  # sys.path.insert(...), sys.path.append(...), ...
            elif isinstance(node, ast.Assign | ast.AugAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                target = next((t.value if isinstance(t, ast.Subscript) else t for t in targets
                               if _is_sys_path(t.value if isinstance(t, ast.Subscript) else t)), None)
            if target is not None and _is_sys_path(target):
                out.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node).splitlines()[0]}")
    return sorted(out)


def _is_sys_path(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name) \
        and node.value.id == "sys"


def markdown() -> str:
    """STAGES as the table docs/architecture.md shows."""
    rows = [f"| {i} | {stage} | {', '.join(f'`{p}`' for p in prefixes)} | {what} |"
            for i, (stage, prefixes, what) in enumerate(STAGES)]
    return "\n".join(["| # | stage | modules | what |", "|---|---|---|---|", *rows])
