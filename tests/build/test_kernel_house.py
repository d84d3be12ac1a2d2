"""The attention kernels' house (csrc/kernels/mha/): one folder per kernel family, shared headers by concern in
common/, the dispatch at the top; read from the sources' #include lines, no compiler needed.

- Every file lives in a family folder (cpu, simt, mma, decode, sm90), in common/, or at the top (the entry points,
  the portable GPU dispatch and its instance templates).
- No family includes another family's kernel file (a .cuh): reading the Hopper backward must not pull in the
  forward, nor the forward the decode kernel. A family may include another's plain C++ header (.h: call counters,
  the decode-shape predicate, the Hopper head dims), which holds no kernel.
- common/ includes nothing of a family: it is what the families share.
- Every quoted include names a file that exists.
- docs/attention.md's map names every file of the house, and no file that is not there.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HOUSE = ROOT / "csrc" / "kernels" / "mha"
FAMILIES = ("cpu", "simt", "mma", "decode", "sm90")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)
INCLUDE_DIRS = (ROOT / "csrc" / "kernels", ROOT / "csrc" / "include")
MAP = ROOT / "docs" / "attention.md"


def _house_files() -> list[Path]:
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "--cached", "--others", "--exclude-standard", "--",
                          str(HOUSE.relative_to(ROOT))], capture_output=True, text=True, check=True).stdout.split()
    return sorted(ROOT / p for p in out if (ROOT / p).is_file())


def _folder(path: Path) -> str:
    """The file's place in the house: a family, "common", or "top"."""
    rel = path.relative_to(HOUSE)
    return rel.parts[0] if len(rel.parts) > 1 else "top"


def _includes(path: Path) -> list[Path]:
    """The house's files that `path` includes (quoted includes under csrc/kernels/mha)."""
    out = []
    for name in INCLUDE.findall(path.read_text(errors="replace")):
        if name.startswith("mha/"):
            out.append(HOUSE / name[len("mha/"):])
    return out


def test_every_file_has_a_place():
    places = {_folder(p) for p in _house_files()}
    assert places <= {"top", "common", *FAMILIES}, f"files outside the house's folders: {places}"
    assert {"common", *FAMILIES} <= places, f"a family folder is missing: {places}"


def test_no_family_includes_another_familys_kernel_file():
    crossings = []
    for path in _house_files():
        here = _folder(path)
        for inc in _includes(path):
            there = _folder(inc)
            if here == "top" or there == here:
                continue
            if here == "common" and there != "common":
                crossings.append(f"{path.relative_to(HOUSE)} (common) includes {inc.relative_to(HOUSE)}")
            elif here in FAMILIES and there != "common" and inc.suffix != ".h":
                crossings.append(f"{path.relative_to(HOUSE)} ({here}) includes {inc.relative_to(HOUSE)} ({there}'s "
                                 f"kernel file)")
    assert not crossings, "\n".join(crossings)


def test_the_rule_catches_a_crossing(tmp_path, monkeypatch):
    """The test above on a planted house: the Hopper backward including the Hopper forward is fine, including the
    decode kernel is not; common including a family is not."""
    house = tmp_path / "mha"
    for rel, text in {"sm90/bwd.cuh": '#include "mha/sm90/fwd.cuh"\n#include "mha/decode/fwd.cuh"\n',
                      "sm90/fwd.cuh": '#include "mha/decode/sizes.h"\n', "decode/fwd.cuh": "",
                      "decode/sizes.h": "", "common/gpu.cuh": '#include "mha/simt/fwd.cuh"\n', "simt/fwd.cuh": "",
                      "cpu/a.h": "", "mma/a.cuh": ""}.items():
        (house / rel).parent.mkdir(parents=True, exist_ok=True)
        (house / rel).write_text(text)
    me = sys.modules[__name__]
    monkeypatch.setattr(me, "HOUSE", house)
    monkeypatch.setattr(me, "_house_files", lambda: sorted(p for p in house.rglob("*") if p.is_file()))
    try:
        test_no_family_includes_another_familys_kernel_file()
    except AssertionError as e:
        lines = str(e).splitlines()
    else:
        raise AssertionError("a planted crossing passed")
    assert any("sm90/bwd.cuh (sm90) includes decode/fwd.cuh" in ln for ln in lines), lines
    assert any("common/gpu.cuh (common) includes simt/fwd.cuh" in ln for ln in lines), lines
    assert not any("sm90/fwd.cuh" in ln.split(" includes ")[1] for ln in lines), lines
    assert not any("applies.h" in ln for ln in lines), lines


def test_every_include_names_a_file_that_exists():
    missing = []
    for path in [*_house_files(), *sorted((ROOT / "benchmarks" / "gpu").glob("*.cu"))]:
        for name in INCLUDE.findall(path.read_text(errors="replace")):
            if name.startswith(("mha/", "ja/")) and not any((d / name).is_file() for d in INCLUDE_DIRS):
                missing.append(f"{path.relative_to(ROOT)}: {name}")
    assert not missing, missing


def _mapped() -> set[str]:
    """The files docs/attention.md's map names: its table's rows (folder | files | what), a blank folder cell
    continuing the row above's, "top" the house's own folder."""
    text = MAP.read_text()
    start = text.index("## Where the kernels live")
    section = text[start:text.index("\n## ", start + 1)]
    named, folder = set(), None
    for row in section.splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if len(cells) < 3 or cells[0] in ("folder", "---"):
            continue
        folder = cells[0] or folder
        for name in re.findall(r"`([\w.]+)`", cells[1]):
            named.add(name if folder == "top" else f"{folder}/{name}")
    return named


def test_the_map_in_docs_names_every_file_of_the_house():
    named, files = _mapped(), {str(p.relative_to(HOUSE)) for p in _house_files()}
    assert files - named == set(), f"files docs/attention.md's map does not name: {sorted(files - named)}"
    assert named - files == set(), f"files docs/attention.md's map names that do not exist: {sorted(named - files)}"
