"""The facts ci/build.py owns, written into the workflows: `python3 ci/build.py --workflows`.

The workflows (.github/workflows/*.yml) are written by hand: their jobs, steps, conditions and comments. What
ci/build.py holds as data is written into them from there, never by hand:

- a job's `runs-on`: the runner of the build it runs (`ci/build.py --build NAME`), or the plan runner for a job
  that runs none (it prints matrices); a job that takes it from a matrix (`${{ matrix.runner }}`) keeps that;
- the `timeout-minutes` of a job that runs one named build, and of that build's step: the build's;
- every `python-version:`: the Python of the builds (jatools.config.python_version());
- the self-hosted runner labels actionlint checks `runs-on` against (.github/actionlint.yaml).

Container images are never written here: the jobs take them from ci/build.py's matrices. Line-based on purpose: the
files keep their comments and layout, and only these values change. Standard library only (ci/build.py runs it
before any virtual environment exists).
"""
from __future__ import annotations

import re
from collections.abc import Callable

JOBS = re.compile(r"(?m)^jobs:\n")
JOB_START = re.compile(r"(?m)^(?=  [\w-]+:\s*$)")
STEP_START = re.compile(r"(?m)^(?=      - )")
NAMED_BUILD = re.compile(r'(?m)ci/build\.py --build "?(\w+)"?\s*$')
RUNS_ON = re.compile(r"(?m)^(    runs-on: )(?!\$\{\{).*$")
JOB_TIMEOUT = re.compile(r"(?m)^(    timeout-minutes: )\d+$")
STEP_TIMEOUT = re.compile(r"(?m)^(        timeout-minutes: )\d+$")
PYTHON = re.compile(r'(?m)^(\s+python-version: )"[^"]*"$')
LABELS = re.compile(r"(?m)^(  labels:\n)(?:    - .*\n)*")

# (runner label, timeout in minutes) of a build by name
BuildFacts = Callable[[str], tuple[str, int]]


def _job(chunk: str, facts: BuildFacts, plan_label: str) -> str:
    named = set(NAMED_BUILD.findall(chunk))
    if len(named) != 1:  # a plan job (it prints matrices) or a matrix job: its runner is the plan runner, if literal
        return RUNS_ON.sub(lambda m: m.group(1) + plan_label, chunk)
    label, timeout = facts(named.pop())
    chunk = RUNS_ON.sub(lambda m: m.group(1) + label, chunk)
    chunk = JOB_TIMEOUT.sub(lambda m: f"{m.group(1)}{timeout}", chunk)
    steps = STEP_START.split(chunk)
    return "".join(STEP_TIMEOUT.sub(lambda m: f"{m.group(1)}{timeout}", s) if NAMED_BUILD.search(s) else s
                   for s in steps)


def workflow(text: str, facts: BuildFacts, plan_label: str, python: str) -> str:
    """The workflow `text` with ci/build.py's facts written in (text that already has them comes back unchanged)."""
    text = PYTHON.sub(lambda m: f'{m.group(1)}"{python}"', text)
    head, jobs = JOBS.split(text, maxsplit=1)
    return head + "jobs:\n" + "".join(_job(c, facts, plan_label) for c in JOB_START.split(jobs))


def actionlint_config(text: str, self_hosted: list[str]) -> str:
    """actionlint's configuration with the self-hosted labels (every runner label GitHub does not host)."""
    if not LABELS.search(text):
        raise ValueError("the actionlint configuration has no `self-hosted-runner: labels:` list to write")
    return LABELS.sub(lambda m: m.group(1) + "".join(f"    - {label}\n" for label in self_hosted), text, count=1)
