"""Whether two builds hold the same device code: a refactoring of kernel code proves it changed nothing.

    python -m jatools.native.same_device_code BASE [NEW] [--json-out FILE]

BASE and NEW are folders of built libraries or objects (every *.so and *.o in them, matched by name) or single
files; NEW defaults to the build tree's JIT folder (build/aiter_build). Each file's device code is unpacked with
`cuobjdump -xelf all` (a CUDA toolkit's, or the pinned nvidia-cuda-cuobjdump wheel's: pyproject's sass group) into
its cubins, and every cubin's code (.text.<kernel>), constant-bank (.nv.constant<N>[.<kernel>]) and kernel-info
(.nv.info[.<kernel>]) sections are compared byte for byte, keyed by the cubin's arch and the section's name (the
mangled kernel), not by where a cubin sits in the fat binary, which follows the link order. Debug and line
sections, symbol tables and the host code are not compared: a move of a source file changes those and nothing
the GPU runs.

Exit 0: every such section is identical and no kernel is missing or new. Exit 1: names each library, arch and
kernel whose sections differ, appear or disappear. Exit 2: an input that cannot be compared (a missing file, no
cuobjdump, a file with no device code). Compiling BASE: `git worktree add /tmp/base BASE`, then the same build
commands there (docs/build.md, "Proving a refactoring").
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from jatools import atomic_write, config
from jatools.native.sass_check import INSTALL, SassError, demangled, find_tools

# The sections that are the device code: the kernels' code, their constant banks and their kernel info.
COMPARED = re.compile(r"^\.(text|nv\.constant\d+|nv\.info)(\.|$)")
EXIT_SAME, EXIT_DIFFERENT, EXIT_INPUT = 0, 1, 2


class InputError(RuntimeError):
    """A file cannot be compared; exit 2."""


@dataclass
class LibraryDiff:
    name: str
    sections: int = 0  # compared sections present in both
    changed: list[str] = field(default_factory=list)  # "sm_90a .text.<kernel>"
    removed: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)

    @property
    def same(self) -> bool:
        return not (self.changed or self.removed or self.added)


def cubin_sections(data: bytes) -> dict[str, bytes]:
    """{section name: contents} of one cubin's compared sections."""
    from io import BytesIO

    from elftools.elf.elffile import ELFFile

    return {sec.name: sec.data() for sec in ELFFile(BytesIO(data)).iter_sections()
            if COMPARED.match(sec.name) and sec["sh_type"] != "SHT_NOBITS"}


def device_sections(path: Path, cuobjdump: str, env: dict[str, str]) -> dict[str, str]:
    """{"<arch> <section>": sha256 of its contents} over every cubin of a library or object."""
    with tempfile.TemporaryDirectory(prefix="ja-devcode-") as tmp:
        run = subprocess.run([cuobjdump, "-xelf", "all", str(path.resolve())], cwd=tmp, capture_output=True,
                             text=True, env=env, check=False)
        cubins = sorted(Path(tmp).glob("*.cubin"))
        if run.returncode != 0 and not cubins and "does not contain device code" not in run.stderr + run.stdout:
            raise InputError(f"same_device_code: {cuobjdump} -xelf all {path} failed (exit {run.returncode}): "
                             f"{(run.stderr or run.stdout).strip()[-300:]}")
        if not cubins:
            raise InputError(f"same_device_code: {path} holds no device code (no cubin); compare GPU builds "
                             f"(JA_BACKEND=cuda), or leave CPU-only files out")
        out: dict[str, str] = {}
        for cubin in cubins:
            # cuobjdump names each cubin <file>.<n>.<arch>.cubin: its arch (sm_90a), which the ELF header's flags
            # do not tell apart from its family's (sm_90)
            arch = cubin.name.split(".")[-2]
            sections = cubin_sections(cubin.read_bytes())
            for name, data in sections.items():
                key = f"{arch} {name}"
                digest = hashlib.sha256(data).hexdigest()
                if out.get(key, digest) != digest:  # one kernel twice in a file, with different code: keep both
                    key = f"{key} #{sum(k.startswith(key) for k in out)}"
                out[key] = digest
        return out


def files(path: Path) -> dict[str, Path]:
    """{name: file}: a folder's libraries and objects (recursively, by path below it), or one file."""
    if path.is_file():
        return {path.name: path}
    if not path.is_dir():
        raise InputError(f"same_device_code: {path} does not exist; give a folder of built libraries or objects")
    found = {str(p.relative_to(path)): p for p in sorted(path.rglob("*")) if p.suffix in (".so", ".o") and p.is_file()}
    if not found:
        raise InputError(f"same_device_code: {path} holds no *.so or *.o")
    return found


def compare(base: Path, new: Path, env: dict[str, str] | None = None) -> list[LibraryDiff]:
    """One LibraryDiff per file name found in both (files(base), files(new)) with device code; a name in only one
    of them is an input error (the builds are not of the same targets)."""
    try:
        cuobjdump, tool_env = find_tools(env)
    except SassError:
        raise InputError(f"same_device_code: no cuobjdump; {INSTALL}") from None
    a, b = files(base), files(new)
    if base.is_file() and new.is_file():
        a, b = {"file": base}, {"file": new}
    only = sorted(set(a) ^ set(b))
    if only:
        raise InputError(f"same_device_code: the builds hold different files ({', '.join(only[:6])}): compare builds "
                         f"of the same targets and archs")
    out = []
    for name in sorted(a):
        x, y = device_sections(a[name], cuobjdump, tool_env), device_sections(b[name], cuobjdump, tool_env)
        d = LibraryDiff(name, sections=len(set(x) & set(y)))
        d.changed = sorted(k for k in set(x) & set(y) if x[k] != y[k])
        d.removed, d.added = sorted(set(x) - set(y)), sorted(set(y) - set(x))
        out.append(d)
    return out


def _kernel(key: str) -> str:
    """The mangled kernel of a key "<arch> .<kind>.<kernel>" ("" for a file-wide section such as .nv.info)."""
    section = key.split(" ", 1)[1]
    kind = COMPARED.match(section)
    return section[kind.end():] if kind else ""


def _named(keys: list[str]) -> list[str]:
    """Keys with their kernels demangled (c++filt where it is installed)."""
    names = demangled([k for k in map(_kernel, keys) if k])
    return [f"{k}  ({names[_kernel(k)]})" if names.get(_kernel(k), _kernel(k)) != _kernel(k) else k for k in keys]


def report(diffs: list[LibraryDiff]) -> str:
    lines = []
    for d in diffs:
        if d.same:
            lines.append(f"{d.name}: same device code ({d.sections} sections: code, constant banks, kernel info)")
            continue
        lines.append(f"{d.name}: DIFFERENT device code ({len(d.changed)} changed, {len(d.removed)} only in BASE, "
                     f"{len(d.added)} only in NEW, of {d.sections} compared)")
        for what, keys in (("changed", d.changed), ("only in BASE", d.removed), ("only in NEW", d.added)):
            for k in _named(keys)[:20]:
                lines.append(f"  {what}: {k}")
            if len(keys) > 20:
                lines.append(f"  {what}: ... {len(keys) - 20} more")
    same = all(d.same for d in diffs)
    lines.append("same device code: yes" if same else
                 "same device code: NO; run the GPU tests and the perf gate on the H200 before this lands "
                 "(docs/build.md, \"Proving a refactoring\")")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m jatools.native.same_device_code", description=__doc__.splitlines()[0])
    p.add_argument("base", type=Path, help="the build before the change: a folder of libraries/objects, or a file")
    p.add_argument("new", type=Path, nargs="?", help="the build after it (default: the build tree's JIT folder)")
    p.add_argument("--json-out", type=Path, help="write each file's comparison as JSON")
    args = p.parse_args(argv)
    new = args.new or config.load().jit_dir
    try:
        diffs = compare(args.base, new)
    except InputError as e:
        print(e, file=sys.stderr)
        return EXIT_INPUT
    print(report(diffs))
    if args.json_out:
        atomic_write.write_text(args.json_out, json.dumps([{**asdict(d), "same": d.same} for d in diffs], indent=2)
                                + "\n")
    return EXIT_SAME if all(d.same for d in diffs) else EXIT_DIFFERENT


if __name__ == "__main__":
    sys.exit(main())
