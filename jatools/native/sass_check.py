"""The sm_90a attention backward's main loops, read from the compiled code: no integer division in any.

    python -m jatools.native.sass_check LIBRARY_OR_OBJECT... [--json-out FILE]

A division (or remainder) by an integer known only at run time compiles to some twenty instructions, or a call
to a routine of them, that start by converting the divisor to a float reciprocal (I2F.U32.RP, I2F.RP,
I2F.U64.RP). The backward's main loop runs once per (key block, query tile) pair, and one such mapping from the
loop's iteration to its (query head, tile) (`it / n`, `it % n`, chosen at run time) made the deterministic backward
slower by a division at every use; ptxas said nothing and no test on the CPU could see it. The kernels now map
iterations with cutlass::FastDivmod (a multiply-high and a shift, csrc/kernels/mha/sm90/bwd_mainloop.cuh), and
this check keeps it so: it disassembles every backward kernel of the sm_90a instances (cuobjdump -sass, from the
pinned nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm wheels, or a CUDA toolkit's), finds its main loop (the
backward branch whose body holds the most warpgroup MMAs, HGMMA; the innermost such), and fails naming the kernel
and each division there, in the loop or in a routine it calls.

`nox -s compile_only -- --backend cuda` runs it on the library it compiled; tests/build/test_sass_check.py compiles
one instance through the build's own ninja plan and runs it, and holds the rule to a kernel with a division in its
MMA loop.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from jatools import atomic_write
from jatools.native.jit_modules import ARCH_KINDS

# The backward kernels, every ja::mha_sm90::mha_bwd_sm90*_kernel: mha_bwd_sm90_kernel<BwdTraits<T, D>, causal, feat>,
# and the split-head-dim one of head dims 192 and 256, mha_bwd_sm90_d256_kernel<BwdTraitsD256<T, D, Dv>, ...>.
KERNEL = re.compile(r"_ZN2ja8mha_sm90\d+mha_bwd_sm90\w*_kernel\w*")
# The template kind of the kernels (jit_modules.ARCH_KINDS) and the code it compiles: cuobjdump disassembles only
# that code's cubins.
KIND = "gpu_sm90a"
ARCH = ARCH_KINDS[KIND][1]
# The first instruction of a division by a run-time integer: its divisor's float reciprocal, rounded toward +inf.
DIVISION = re.compile(r"^I2F(\.[SU](8|16|32|64))*\.RP\b")
_FUNCTION = re.compile(r"^\s*Function\s*:\s*(\S+)")
_INSTRUCTION = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_TARGET = re.compile(r"\b0x([0-9a-f]+)\b")
# Where the tools come from when no CUDA toolkit is on PATH: the wheels pinned in pyproject's sass group.
WHEEL_BIN = ("nvidia", "cu13", "bin")
INSTALL = ("install the pinned nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm wheels (pyproject.toml's "
           "[dependency-groups] sass; `nox -s compile_only` does) or put a CUDA toolkit's bin on PATH")


class SassError(RuntimeError):
    pass


@dataclass(frozen=True)
class Loop:
    kernel: str
    instructions: int          # the main loop's length
    hgmma: int                 # warpgroup MMAs in it
    divisions: tuple[str, ...]  # "0x1370 I2F.U32.RP R7, UR21" for each, in the loop or a routine it calls


def find_tools(env: dict[str, str] | None = None) -> tuple[str, dict[str, str]]:
    """cuobjdump, and the environment that lets it find nvdisasm (which -sass runs): the pinned wheels' (in this
    interpreter's site-packages), else a toolkit's on PATH. A clear error naming the fix when neither is there."""
    env = dict(os.environ if env is None else env)
    for entry in sys.path:
        bin_dir = Path(entry, *WHEEL_BIN)
        if (bin_dir / "cuobjdump").is_file() and (bin_dir / "nvdisasm").is_file():
            return str(bin_dir / "cuobjdump"), {**env, "NVDISASM_PATH": str(bin_dir)}
    cuobjdump, nvdisasm = (shutil.which(tool, path=env.get("PATH")) for tool in ("cuobjdump", "nvdisasm"))
    if cuobjdump and nvdisasm:
        return cuobjdump, env
    raise SassError(f"sass_check: no cuobjdump with nvdisasm beside it; {INSTALL}")


def functions(sass: str) -> dict[str, list[tuple[int, str]]]:
    """{function: [(address, instruction)]} from cuobjdump -sass's text."""
    out: dict[str, list[tuple[int, str]]] = {}
    current = None
    for line in sass.splitlines():
        if m := _FUNCTION.match(line):
            current = out.setdefault(m.group(1), [])
        elif current is not None and (m := _INSTRUCTION.match(line)):
            current.append((int(m.group(1), 16), m.group(2)))
    return out


def _opcode(text: str) -> str:
    """An instruction without its predicate (@P0, @!UP1)."""
    return re.sub(r"^@!?U?P[T\d]+\s+", "", text)


def main_loop(name: str, code: list[tuple[int, str]]) -> Loop:
    """The kernel's main loop (the innermost backward branch around the most HGMMAs) and the divisions in it."""
    index = {addr: i for i, (addr, _) in enumerate(code)}
    mma = [i for i, (_, t) in enumerate(code) if _opcode(t).startswith("HGMMA")]
    loops = []
    for i, (addr, text) in enumerate(code):
        op = _opcode(text)
        if op.startswith("BRA") and not op.startswith("BRA.DIV") and (m := _TARGET.search(op)):
            target = int(m.group(1), 16)
            if target <= addr and target in index:
                loops.append((index[target], i))
    held = lambda loop: sum(loop[0] <= h <= loop[1] for h in mma)
    if not mma or not loops or held(best := max(loops, key=lambda l: (held(l), l[0] - l[1]))) == 0:
        raise SassError(f"sass_check: {name} has no loop around its HGMMAs ({len(mma)} HGMMAs, {len(loops)} "
                        "backward branches): not an sm_90a backward kernel, or cuobjdump's text changed")
    first, last = best
    body = list(range(first, last + 1))
    for i in range(first, last + 1):  # the routines the loop calls (the compiler's 64-bit division is one)
        op = _opcode(code[i][1])
        if op.startswith("CALL.REL") and (m := _TARGET.search(op)) and int(m.group(1), 16) in index:
            j = index[int(m.group(1), 16)]
            while j < len(code) and not _opcode(code[j][1]).startswith("RET"):
                body.append(j)
                j += 1
    divisions = tuple(f"{code[i][0]:#06x} {_opcode(code[i][1])}" for i in dict.fromkeys(body)  # a routine called twice
                      if DIVISION.match(_opcode(code[i][1])))                                     # counts once
    return Loop(name, last - first + 1, held(best), divisions)


def check(paths: list[Path], env: dict[str, str] | None = None) -> list[Loop]:
    """The main loop of every backward kernel in `paths` (libraries or objects); an error when none holds one."""
    cuobjdump, tool_env = find_tools(env)
    loops = []
    for path in paths:
        if not path.is_file():
            raise SassError(f"sass_check: {path} does not exist; build it first "
                            "(nox -s compile_only -- --backend cuda)")
        run = subprocess.run([cuobjdump, "-sass", "-arch", ARCH, str(path)], capture_output=True, text=True,
                             env=tool_env, check=False)
        if run.returncode != 0:
            raise SassError(f"sass_check: {cuobjdump} -sass -arch {ARCH} {path} failed (exit {run.returncode}): "
                            f"{run.stderr.strip()[-500:]}")
        found = {n: c for n, c in functions(run.stdout).items() if KERNEL.fullmatch(n)}
        if not found:
            raise SassError(f"sass_check: {path} holds no sm_90a backward kernel (mha_bwd_sm90_kernel); it needs a "
                            "CUDA build whose GPU_ARCHS holds sm_90")
        loops += [main_loop(n, c) for n, c in sorted(found.items())]
    return loops


def demangled(names: list[str]) -> dict[str, str]:
    """Readable kernel names (c++filt where it is; the mangled name otherwise)."""
    tool = shutil.which("c++filt")
    if not tool or not names:
        return {n: n for n in names}
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True,
                         check=False).stdout.splitlines()
    return dict(zip(names, out)) if len(out) == len(names) else {n: n for n in names}


def report(loops: list[Loop]) -> tuple[str, bool]:
    """A line per kernel, and whether every main loop is free of divisions."""
    names = demangled([l.kernel for l in loops])
    lines = [f"  {'ok' if not l.divisions else 'DIVISION':<8} loop {l.instructions:5d} instructions, "
             f"{l.hgmma:3d} HGMMA  {names[l.kernel].replace('ja::mha_sm90::', '')}" for l in loops]
    for l in loops:
        lines += [f"    {names[l.kernel]}: {d}" for d in l.divisions]
    bad = [l for l in loops if l.divisions]
    lines.append(f"sass_check: {len(loops)} backward kernels, " + (
        "no integer division in any main loop" if not bad else
        f"{len(bad)} with an integer division in the main loop: map the loop's iteration with cutlass::FastDivmod "
        "(set up once, before the loop), never `/` or `%` by a run-time value"))
    return "\n".join(lines), not bad


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m jatools.native.sass_check", description=__doc__.splitlines()[0])
    p.add_argument("paths", nargs="+", type=Path, help="libraries or objects holding sm_90a backward kernels")
    p.add_argument("--json-out", type=Path, help="write each kernel's main loop as JSON here")
    a = p.parse_args(argv)
    try:
        loops = check(a.paths)
    except SassError as e:
        print(e, file=sys.stderr)
        return 2
    text, ok = report(loops)
    print(text)
    if a.json_out:
        atomic_write.write_text(a.json_out, json.dumps([asdict(l) for l in loops], indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
