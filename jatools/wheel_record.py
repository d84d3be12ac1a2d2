"""Check a wheel against its own RECORD before it is installed.

Installers (pip, uv) do not compare a wheel's files with the sha256 in its
RECORD, so a file changed after the wheel was built would install silently.
`wheel.wheelfile.WheelFile` does the comparison on read; this module reads
every member through it (several members at once: zlib releases the GIL) and
adds the one check it leaves out, files that RECORD lists but the archive lacks.
"""
from __future__ import annotations

import csv
import io
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from wheel.wheelfile import WheelError, WheelFile

CHUNK = 8 << 20


class RecordError(RuntimeError):
    """The wheel's bytes differ from its RECORD; the message names the files."""


def record_text(wheel: Path) -> str:
    """The RECORD file of `wheel`, as text."""
    with WheelFile(wheel) as wf:
        return wf.read(wf.record_path).decode()


def _read_all(wheel: Path, names: list[str]) -> list[str]:
    problems = []
    with WheelFile(wheel) as wf:
        for name in names:
            try:
                with wf.open(name) as f:
                    while f.read(CHUNK):
                        pass
            except WheelError as e:
                problems.append(str(e))
    return problems


def verify(wheel: Path, workers: int | None = None) -> int:
    """Raise RecordError unless every member matches RECORD and RECORD lists only members; return the count."""
    try:
        with WheelFile(wheel) as wf:
            members = [i.filename for i in wf.infolist() if not i.is_dir()]
            record = wf.read(wf.record_path).decode()
    except (WheelError, OSError, KeyError) as e:
        raise RecordError(f"{wheel.name}: cannot read its RECORD: {e}; rebuild the wheel "
                          "(`bash scripts/build_wheel.sh --variant lite|full`)") from None
    listed = {row[0] for row in csv.reader(io.StringIO(record)) if row}
    absent = sorted(listed - set(members))
    problems = [f"RECORD lists {name}, which the wheel lacks" for name in absent]
    workers = max(1, min(workers or os.cpu_count() or 1, len(members)))
    groups = [members[i::workers] for i in range(workers)]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for found in pool.map(lambda g: _read_all(wheel, g), groups):
            problems += found
    if problems:
        raise RecordError(f"{wheel.name} does not match its RECORD: {'; '.join(sorted(problems)[:6])}. "
                          "A file was changed after the wheel was built; rebuild it "
                          "(`bash scripts/build_wheel.sh --variant lite|full`) instead of editing it")
    return len(members)
