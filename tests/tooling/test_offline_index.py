"""ci/gpu/offline_index.py: an installed distribution repacked as a wheel installs offline and works."""
from __future__ import annotations

import subprocess
import venv
import zipfile
from pathlib import Path

from ci.gpu import offline_index

ROOT = Path(__file__).resolve().parents[2]


def test_a_repacked_distribution_installs_offline_and_imports(tmp_path):
    dists = offline_index.closure(("pytest",))  # pytest and what it needs, as installed here
    names = {offline_index.canonical_name(d.metadata["Name"]) for d in dists}
    assert {"pytest", "pluggy", "iniconfig", "packaging"} <= names
    wheels = [offline_index.repack(d, tmp_path) for d in dists]
    for whl in wheels:
        with zipfile.ZipFile(whl) as z:
            record = next(n for n in z.namelist() if n.endswith(".dist-info/RECORD"))
            listed = {line.split(",")[0] for line in z.read(record).decode().splitlines()}
            assert set(z.namelist()) == listed, whl.name
    target = tmp_path / "venv"
    venv.create(target, with_pip=True)
    py = target / "bin" / "python"
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-index", "--find-links", str(tmp_path),
                        "--isolated", "pytest"], check=False, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    r = subprocess.run([str(py), "-m", "pytest", "--version"], check=False, capture_output=True, text=True)
    assert r.returncode == 0 and "pytest" in r.stdout + r.stderr


def test_a_missing_seed_is_named_not_fatal(capsys):
    assert offline_index.closure(("no-such-distribution-ja",)) == []
    assert "no-such-distribution-ja is not installed here" in capsys.readouterr().out


def test_index_fills_the_gaps_from_the_host_and_names_what_nothing_satisfies(tmp_path, monkeypatch, capsys):
    """A package left out of the carried wheels (--on-host) is repacked from the host when something needs it;
    a group requirement nothing satisfies (absent, or too old) fails the index and is named."""
    carried = tmp_path / "carried"
    carried.mkdir()
    pytest_dist = next(d for d in offline_index.closure(("pytest",))
                       if offline_index.canonical_name(d.metadata["Name"]) == "pytest")
    offline_index.repack(pytest_dist, carried)  # pytest carried; pluggy, iniconfig ... left to the host
    monkeypatch.setattr(offline_index, "SEEDS", ())
    monkeypatch.setattr(offline_index, "group_requirements", lambda names=offline_index.GROUPS: ["pytest>=8"])
    assert offline_index.index(tmp_path / "idx", carried) == 0
    names = {offline_index.canonical_name(p.name.split("-")[0]) for p in (tmp_path / "idx").glob("*.whl")}
    assert {"pytest", "pluggy", "iniconfig"} <= names
    assert len([p for p in (tmp_path / "idx").glob("*.whl") if p.name.startswith("pytest-")]) == 1  # not repacked twice
    monkeypatch.setattr(offline_index, "group_requirements",
                        lambda names=offline_index.GROUPS: ["pytest>=999", "no-such-distribution-ja>=1"])
    assert offline_index.index(tmp_path / "idx2", carried) == 1
    assert "satisfies pytest>=999, no-such-distribution-ja>=1: carry a wheel" in capsys.readouterr().out


def test_a_repacked_wheel_keeps_every_tag_of_its_wheel_file(tmp_path):
    """An installed py2.py3 wheel (flatbuffers ships one) is repacked as py2.py3-none-any, not py2-none-any,
    which a cp312 installer would refuse."""
    import importlib.metadata as md

    info = tmp_path / "site" / "twotags-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: twotags\nVersion: 1.0\n")
    (info / "WHEEL").write_text("Wheel-Version: 1.0\nTag: py2-none-any\nTag: py3-none-any\n")
    (info / "RECORD").write_text("twotags-1.0.dist-info/METADATA,,\ntwotags-1.0.dist-info/WHEEL,,\n"
                                 "twotags-1.0.dist-info/RECORD,,\n")
    out = offline_index.repack(md.PathDistribution(info), tmp_path)
    assert out.name == "twotags-1.0-py2.py3-none-any.whl"
