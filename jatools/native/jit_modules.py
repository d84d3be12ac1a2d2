"""The JIT modules and their instance sources: which modules exist (the op table, jax_aiter/op_table.toml) and how
each compiles (jax_aiter/jit/optCompilerConfig.json), which must agree; the instance sources and tables generated
from each module's templates over its axes (rewritten only when their text changes); and the template kinds a
toolchain compiles (cpu, gpu, and arch kinds such as gpu_sm90a).
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import re
from pathlib import Path

from jatools import atomic_write, config
from jatools.native import toolchain
from jax_aiter import op_table

# A module may add a template kind gpu_<code> (gpu_sm90a: the wgmma/TMA attention kernels), compiled for that
# one code instead of GPU_ARCHS' codes and only by a CUDA build whose GPU_ARCHS holds the base arch; its
# instance table is written (empty) either way, so the dispatcher includes it on every build.
ARCH_KINDS = {"gpu_sm90a": ("sm_90", "sm_90a")}  # kind: (base arch in GPU_ARCHS, the code compiled)
# What every generated file's header names as its generator (a template's `{{generator}}`): this module.
GENERATOR = "jatools/native/jit_modules.py"


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


def kind_spec(module: dict, kind: str) -> dict:
    """The module's settings for one template kind: its `symbol` and `axes`, replaced by those the kind's entry of
    `kind_overrides` names (the CPU attention kernels take their features at run time and need fewer instances
    than the GPU ones)."""
    return {**module, **module.get("kind_overrides", {}).get(kind, {})}


def instances(module: dict, kind: str | None = None) -> list[dict[str, str]]:
    """Every combination of the module's axes (of `kind`, where given), as {axis: text value} (a bool as 0 or 1)."""
    axes = (kind_spec(module, kind) if kind else module).get("axes", {})
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
        for values in instances(module, kind):
            symbol = kind_spec(module, kind)["symbol"].format(backend=kind, **values)
            path = gen / f"{symbol}{'.cpp' if kind == 'cpu' else '.cu'}"
            texts[path] = render(tpl, {**values, "symbol": symbol, "template": tpl_rel, "backend": kind,
                                        "generator": GENERATOR})
            sources[kind].append(path)
            table.append(f"JA_INSTANCE({', '.join([symbol, *values.values()])})")
        texts[gen / f"{name}_{kind}_instances.inc"] = (
            f"// Generated by {GENERATOR} from {tpl_rel}; do not edit.\n" + "\n".join(table) + "\n")
    for kind in ARCH_KINDS:  # declared but not built here: an empty table, so the dispatcher's include holds
        if kind in module.get("templates", {}) and kind not in kinds:
            texts[gen / f"{name}_{kind}_instances.inc"] = (
                f"// Generated by {GENERATOR}: {kind} instances are not built for these GPU_ARCHS; do not edit.\n")
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
    """The template kinds of `module` that this toolchain compiles. A module without a `gpu` template (the paged
    attention kernels: CPU only so far) compiles its CPU kind on every backend; its shim registers no GPU handler."""
    kinds = ["cpu"] + (["gpu"] if tc.backend != "cpu" and "gpu" in module.get("templates", {}) else [])
    return kinds + [k for k, (base, _) in ARCH_KINDS.items()
                    if k in module.get("templates", {}) and tc.backend == "cuda" and base in tc.archs]


def arch_kind_flags(flags: dict[str, list[str]], tc: toolchain.Toolchain, kind: str) -> list[str]:
    """The GPU flags of an arch kind: GPU_ARCHS' code-generation flags replaced by the kind's code."""
    drop = set(toolchain.arch_flags(tc))
    return [f for f in flags["gpu"] if f not in drop] + toolchain.arch_flags(
        dataclasses.replace(tc, archs=(ARCH_KINDS[kind][1],)))
