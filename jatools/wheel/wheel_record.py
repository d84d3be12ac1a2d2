"""Check a wheel against its own RECORD before it is installed.

Installers (pip, uv) do not compare a wheel's files with the sha256 in its
RECORD, so a file changed after the wheel was built would install silently. The
clean room refuses such a wheel before making an environment. The reading and
the comparison are the wheel checks' own (jatools.wheel.wheel_members reads and hashes
every member in parallel; jatools.wheel.wheel_contents compares them with RECORD);
this module only runs that one part of the content policy and words the result.
"""
from __future__ import annotations

import zipfile
from pathlib import Path

from jatools.wheel import wheel_contents, wheel_members


class RecordError(RuntimeError):
    """The wheel's bytes differ from its RECORD; the message names the files."""


def record_text(wheel: Path) -> str:
    """The RECORD file of `wheel`, as text (shipped to the clean room to check the installed bytes)."""
    with zipfile.ZipFile(wheel) as zf:
        return zf.read(f"{wheel_members.dist_info_dir(wheel)}/RECORD").decode()


def verify(wheel: Path, workers: int | None = None) -> int:
    """Raise RecordError unless every member matches RECORD and RECORD lists only members; return the count."""
    report = wheel_contents.ContentsReport(wheel.name)
    try:
        record = wheel_members.read_record(wheel)
        scanned = wheel_members.scan(wheel, workers=workers)
    except wheel_members.WheelReadError as e:
        raise RecordError(f"{e}; rebuild the wheel (`bash scripts/build_wheel.sh --variant lite|full`)") from None
    names = sorted(scanned)
    wheel_contents._check_record(report, names, record, scanned, f"{wheel_members.dist_info_dir(wheel)}/RECORD")
    if report.problems:
        raise RecordError(f"{wheel.name} does not match its RECORD: {'; '.join(report.problems[:6])}. Rebuild the "
                          "wheel (`bash scripts/build_wheel.sh --variant lite|full`) instead of editing it")
    return len(names)
