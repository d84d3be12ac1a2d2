"""Kernel comments give design reasons; measured figures live in benchmark output.

A time, bandwidth or speed-up quoted in a csrc/ comment was true of one machine, driver and build on one day, and
nothing re-checks it: it goes stale while reading like a fact. A comment says what was chosen, what lost and why,
and names the benchmark that measures it; the numbers come from running that benchmark.
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = (".h", ".cuh", ".cpp", ".cu", ".inc", ".in")
# Comments, and the string and character literals that may hold "//" or "/*" without starting one.
TOKEN = re.compile(r'(?P<comment>//[^\n]*|/\*.*?\*/)|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.DOTALL)
# A number with a time, bandwidth or throughput unit ("4.2 ms", "36 us", "3.8 TB/s", "1.5 s"), or a decimal
# ratio ("1.3x"). Structural numbers (tile sizes, head dims, shapes like b4 s2048) carry no such unit.
MEASUREMENT = re.compile(r"\d+(?:\.\d+)?\s?(?:ms|us|µs|ns|[TGM]B/s|[TG]FLOP/?s?)(?![\w/])"
                         r"|\d+\.\d+\s?s\b|\d+\.\d+x\b")


def measurements(text: str) -> list[tuple[int, str]]:
    """(line, quoted figure) of every raw measurement in the C/C++/CUDA source text's comments."""
    hits = []
    for token in TOKEN.finditer(text):
        if token.group("comment") is None:
            continue
        first_line = text.count("\n", 0, token.start()) + 1
        for offset, line in enumerate(token.group("comment").splitlines()):
            hits += [(first_line + offset, m.group(0)) for m in MEASUREMENT.finditer(line)]
    return hits


def test_the_scanner_finds_figures_in_comments_only() -> None:
    text = ('int a = 3; // took 4.68 ms against 3.4ms\n'
            'const char* s = "// 9 ms is a string";  /* 3.8 TB/s of\n reductions, 1.3x the plain one */\n'
            '// tile 128x64, head dim 256, b4 s2048, 90% of slots, 8 kv heads\n'
            'float x = 1.5f; // 5-6 us a call, 2.3 GB/s, 1.5 s, 165 TFLOP/s\n')
    assert measurements(text) == [(1, "4.68 ms"), (1, "3.4ms"), (2, "3.8 TB/s"), (3, "1.3x"),
                                  (5, "6 us"), (5, "2.3 GB/s"), (5, "1.5 s"), (5, "165 TFLOP/s")]


def test_kernel_comments_quote_no_raw_measurements() -> None:
    hits = [f"{path.relative_to(ROOT)}:{line}: {figure}"
            for path in sorted((ROOT / "csrc").rglob("*")) if path.suffix in SOURCES and path.is_file()
            for line, figure in measurements(path.read_text(encoding="utf-8"))]
    assert not hits, ("csrc/ comments quote raw measurements (say the design reason qualitatively and name the "
                      "benchmark that measures it; the figures belong in its output):\n  " + "\n  ".join(hits))
