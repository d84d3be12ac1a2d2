"""The build folders have one home, jatools/config.py's BUILD_TREE (its library folders from jax_aiter/settings.py):
the Python code reads it; what cannot (make, the runtime's fallback, a setting's default) is held to it here."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from jatools import config
from jax_aiter import _loader, settings

ROOT = Path(__file__).resolve().parents[2]
MAKEFILE = (ROOT / "Makefile").read_text()
TREE = config.BUILD_TREE
# Python that may spell a folder: the table itself.
HOME = {ROOT / "jatools/config.py", ROOT / "jax_aiter/settings.py"}


def _make_var(name: str) -> str:
    return re.search(rf"^{name} *[:?]?= *(.*)$", MAKEFILE, re.MULTILINE).group(1).strip()


def test_the_makefile_names_the_tables_folders():
    assert _make_var("BUILD") == f"$(or $(JA_BUILD_DIR),{config.defaults(ROOT)['build_dir']})"
    for var, name in {"CFG": "config_mk", "UMBRELLA_DIR": "umbrella", "JIT_DIR": "jit",
                      "STAGE_DIR": "wheel_stage"}.items():
        assert _make_var(var) == f"$(BUILD)/{TREE[name]}", var
    assert _make_var("OBJ") == f"$(BUILD)/{TREE['obj']}/$(JA_BACKEND_RESOLVED)"
    spelled = set(re.findall(r"\$\(BUILD\)/([\w.-]+)", MAKEFILE)) | set(re.findall(r"ORIGIN/\.\./([\w.-]+)", MAKEFILE))
    assert spelled and spelled <= set(TREE.values()), \
        f"the Makefile names folders the table lacks: {spelled - set(TREE.values())}"


def test_the_runtime_and_the_settings_defaults_agree_with_the_table():
    assert _loader.DEFAULT_BUILD_DIR == config.defaults(ROOT)["build_dir"]
    assert (settings.BY_NAME["JA_FLAKY_JSON"].default
            == (config.build_path("test_results", env={}) / "flaky.json").as_posix())
    assert {k: TREE[k] for k in settings.LIBRARY_DIRS} == settings.LIBRARY_DIRS


def _shown(path: Path) -> Path:
    """A scanned file as a finding names it: relative to the checkout, or as given (a probe under tmp_path)."""
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def _spellings(path: Path) -> list[str]:
    """Where `path` spells a folder of the table as a path: a literal `build/<folder>...`, or `<folder>` joined on
    with `/` (Path's operator). Prose that names a folder (help text, messages) is left alone."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = "|".join(map(re.escape, TREE.values()))
    joined = {id(n.right) for n in ast.walk(tree) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div)}
    return [f"{_shown(path)}:{n.lineno}: {n.value!r}" for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and (re.match(rf"build/({names})(/|$)", n.value) or (id(n) in joined and n.value in TREE.values()))]


def test_no_python_spells_a_build_folder_but_the_table():
    files = [p for top in ("jax_aiter", "jatools", "ci", "benchmarks") for p in sorted((ROOT / top).rglob("*.py"))
             if "__pycache__" not in p.parts and p not in HOME]
    files += [ROOT / "noxfile.py", ROOT / "tasks.py"]
    found = [hit for p in files for hit in _spellings(p)]
    assert not found, "name these through jatools.config.BUILD_TREE (Settings.path, build_path):\n" + "\n".join(found)


def test_the_scan_finds_a_spelled_folder(tmp_path):
    # The probe lives under tmp_path: a probe in the checkout would be seen by the scans above when they run
    # beside this test (xdist).
    bad = tmp_path / "probe.py"
    bad.write_text('"""Docs may say build/aiter_build."""\nX = root / "wheel_stage"\nY = "build/reports/a.json"\n'
                   'Z = path("wheel_stage")\nW = "run make, then look in build/aiter_build"\n')
    assert sorted(h.split(":")[1] for h in _spellings(bad)) == ["2", "3"]


def _shell_spellings(path: Path) -> list[str]:
    """Where a shell script's commands (its comments left out) spell `build/<folder of the table>`."""
    names = "|".join(map(re.escape, TREE.values()))
    found = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        command = re.sub(r"(^|\s)#.*$", "", line)
        if re.search(rf"(?<![\w/$}}])build/({names})(?![\w-])", command):
            found.append(f"{_shown(path)}:{number}: {line.strip()}")
    return found


def test_no_shell_script_spells_a_build_folder_but_the_table():
    """The CI and helper scripts ask jatools.config for a folder (`config.build_path`), which honours
    JA_BUILD_DIR, instead of spelling build/<folder>."""
    scripts = sorted((ROOT / "ci").rglob("*.sh")) + sorted((ROOT / "scripts").rglob("*.sh"))
    found = [hit for p in scripts for hit in _shell_spellings(p)]
    assert scripts and not found, "ask jatools.config.build_path for these:\n" + "\n".join(found)


def test_the_shell_scan_finds_a_spelled_folder(tmp_path):
    probe = tmp_path / "probe.sh"  # under tmp_path, not the checkout the scan above reads
    probe.write_text('# a comment may say build/aiter_build\nrm -rf build/aiter_build  # build/jit-store\n'
                     'x="$store/build/jit-store"; tar -cf o.tar build/jit-store/\ncp build/ci/*.json .\n'
                     'cp build/ci-records/*.json .\n')
    assert [h.split(":")[1] for h in _shell_spellings(probe)] == ["2", "3", "5"]
