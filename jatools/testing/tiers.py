"""Test tiers: which tests a machine runs (one table of pytest marker expressions) and the runner of a tier.

    python3 -m jatools.testing.tiers --tier pr [--platform cuda] [--workers N] [--reruns N] [pytest args]
    JA_TEST_TIER=nightly bash ci/test.sh

Owns the tag filters (composed as XLA composes its ROCm ones: a platform's base list plus each CI
configuration's requirements; the tiers use the same ``Filter``, so this is the one source of every
``pytest -m`` expression CI uses, printed by ci/tag_filters.py), the tier runner (docs/testing.md:
xdist workers pinned to GPU slots, multi-device runs, each run's report, tier-<tier>.json, the GPU
checks, exit 7 when GPUs go unused) and the slot speed-up measurement (ci/measure_slot_speedup.py).

Stdlib only (plus jatools.validate.wheelhouse for --plugin-requirements): it runs under the system
``python3`` on any CI runner.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from jatools import atomic_write
from jatools.config import REPO_ROOT
from jatools.testing import gpu_slots
from jax_aiter import settings

MARKERS = ("gpu", "multigpu", "slow", "packaging", "cuda_only", "rocm_only")
PLATFORMS = ("cpu", "cuda", "rocm")
CONFIGS = ("cpu", "single_gpu", "multi_gpu")


class TagFilterError(ValueError):
    """An unknown platform, configuration or tier; the message lists the valid ones."""


@dataclass(frozen=True)
class Filter:
    """A marker selection: a test must carry every ``require`` marker and no ``exclude`` marker."""

    require: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        unknown = [m for m in (*self.require, *self.exclude) if m not in MARKERS]
        if unknown:
            raise TagFilterError(f"unknown marker(s) {', '.join(unknown)}; markers are {', '.join(MARKERS)} "
                                 "(registered in pyproject.toml [tool.pytest.ini_options])")

    def __add__(self, other: Filter) -> Filter:
        return Filter(tuple(dict.fromkeys((*self.require, *other.require))),
                      tuple(dict.fromkeys((*self.exclude, *other.exclude))))

    def contradiction(self) -> str | None:
        """Why this filter can select no test, or None when it can select some."""
        both = [m for m in self.require if m in self.exclude]
        return f"requires and excludes {', '.join(both)}" if both else None

    def expression(self) -> str:
        """The ``pytest -m`` expression ('' selects everything)."""
        return " and ".join([*self.require, *(f"not {m}" for m in self.exclude)])


# What each platform must never attempt (XLA: rocm_tag_filters.sh's base list).
PLATFORM_BASE: dict[str, Filter] = {
    "cpu": Filter(exclude=("gpu", "cuda_only", "rocm_only")),
    "cuda": Filter(exclude=("rocm_only",)),
    "rocm": Filter(exclude=("cuda_only",)),
}

# Per-configuration additions (XLA: ci_rocm_cpu / ci_single_gpu / ci_multi_gpu).
CONFIG_ADDS: dict[str, Filter] = {
    "cpu": Filter(exclude=("gpu", "multigpu")),
    "single_gpu": Filter(require=("gpu",), exclude=("multigpu",)),
    "multi_gpu": Filter(require=("multigpu",)),
}


# Run kinds and their configuration: "single", the platform's single-device tests (config cpu on the CPU
# platform); "host", the CPU-device tests on a GPU host (on a CPU host they are the single run, so it is
# dropped); "multi", the multi-device tests.
RUN_CONFIGS = {"single": "single_gpu", "host": "cpu", "multi": "multi_gpu"}
RUN_KINDS = tuple(RUN_CONFIGS)


@dataclass(frozen=True)
class Tier:
    """A test tier: one or more pytest runs, each a device kind plus the tier's own selection;
    ``timeout_s`` is pytest-timeout's limit per test (a hung test fails instead of holding the job)."""

    name: str
    doc: str
    runs: tuple[tuple[str, Filter], ...]  # (kind: one of RUN_KINDS, tier selection)
    timeout_s: int

    def __post_init__(self) -> None:
        bad = [kind for kind, _ in self.runs if kind not in RUN_KINDS]
        if bad or self.timeout_s <= 0:
            raise TagFilterError(f"tier {self.name}: run kinds must be {', '.join(RUN_KINDS)} (got {bad}) and "
                                 f"timeout_s positive (got {self.timeout_s})")


TIERS: dict[str, Tier] = {t.name: t for t in (
        Tier("pr", "every pull request: fast single-device tests",
             (("single", Filter(exclude=("slow", "packaging", "multigpu"))),),
             timeout_s=300),
        Tier("nightly", "the full suite: single-device run, the CPU-device tests on a GPU host, the multi-device run",
             (("single", Filter()), ("host", Filter()), ("multi", Filter(require=("multigpu",)))), timeout_s=1200),
        Tier("multigpu", "the sharded multi-device tests only", (("multi", Filter(require=("multigpu",))),),
             timeout_s=600))}
TIER_ENV = "JA_TEST_TIER"
DEFAULT_TIER = settings.BY_NAME[TIER_ENV].default


def _check(kind: str, value: str, valid) -> None:
    if value not in valid:
        raise TagFilterError(f"unknown {kind} {value!r}; valid {kind}s: {', '.join(valid)}")


def tag_filter(platform: str, config: str) -> Filter:
    """The platform's base list plus the configuration's additions."""
    _check("platform", platform, PLATFORMS)
    _check("config", config, CONFIGS)
    return PLATFORM_BASE[platform] + CONFIG_ADDS[config]


def tier_named(name: str) -> Tier:
    _check("tier", name, tuple(TIERS))
    return TIERS[name]


def tier_runs(name: str, platform: str) -> list[tuple[str, str, Filter]]:
    """[(kind, config, filter)] for a tier on a platform: tag filter plus the tier's selection (no "host" run
    on the CPU platform)."""
    configs = {**RUN_CONFIGS, "single": "cpu"} if platform == "cpu" else RUN_CONFIGS
    return [(kind, configs[kind], tag_filter(platform, configs[kind]) + sel)
            for kind, sel in tier_named(name).runs if not (kind == "host" and platform == "cpu")]


def render_table() -> str:
    """The whole table as text: the golden file's content."""
    lines = ["# pytest -m expressions by (platform, config): platform base + config additions.",
             "# Regenerate: python3 ci/tag_filters.py --update-golden", ""]
    for platform in PLATFORMS:
        for config in CONFIGS:
            f = tag_filter(platform, config)
            note = f"   # selects nothing: {f.contradiction()}" if f.contradiction() else ""
            lines.append(f"{platform:<5} {config:<10} {f.expression()!r}{note}")
    lines += ["", "# tiers: the tier's own selection, then each run as materialised per platform", ""]
    for t in TIERS.values():
        own = " | ".join(f"{kind}: {sel.expression() or '<all>'!r}" for kind, sel in t.runs)
        lines.append(f"tier {t.name:<9} {own}   # {t.doc}")
        lines.append(f"  timeout per test: {t.timeout_s} s")
        for platform in PLATFORMS:
            for kind, config, f in tier_runs(t.name, platform):
                lines.append(f"  {platform:<5} {kind:<6} {config:<10} {f.expression()!r}")
    return "\n".join(lines) + "\n"


# --- the runner ---------------------------------------------------------------------------------

WORKERS_ENV = "JA_TEST_WORKERS"
RERUNS_ENV = "JA_TEST_RERUNS"
REPORT_ENV = "JA_FLAKY_JSON"  # where a pytest process writes its run report (the plugin's RunReport)
AUTOLOAD_ENV = "PYTEST_DISABLE_PLUGIN_AUTOLOAD"  # pytest's own switch; set to empty, every installed plugin loads
RESULTS_DIR = Path("build") / "test-results"
PLUGIN = "jatools.testing.pytest_plugin"
CPU_MULTI_DEVICES = 4
DEFAULT_RERUNS = {"cpu": 0, "cuda": 2, "rocm": 2}  # XLA's single-GPU CI: 3 attempts
EXIT_GPU_UNUSED = 7  # GPUs were expected and JAX did not see them, or a GPU run ran no GPU test
OUTPUT_TAIL_LINES = 200  # of each pytest process, kept to classify a run that ended without test reports
# Asked of the interpreter that runs pytest (it may be another one: --deps-from): which plugins it
# has, and with argv[1] == "1" what JAX sees there, unpinned, as the tests will.
PROBE = """
import importlib.util, json, sys
out = {"python": sys.executable, "modules": {m: importlib.util.find_spec(m) is not None for m in sys.argv[2:]}}
if sys.argv[1] == "1":
    try:
        import jax
        out["jax"] = {"version": jax.__version__, "backend": jax.default_backend(),
                      "gpus": [str(d) for d in jax.devices() if d.platform != "cpu"]}
    except Exception as e:
        out["jax"] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", "gpus": []}
print(json.dumps(out))
"""
PROBE_MODULES = ("pytest", "pytest_rerunfailures", "pytest_timeout", "xdist", "jax", "jaxlib")


class TierError(RuntimeError):
    """A tier cannot run as asked; the message says why and what to do."""


@dataclass(frozen=True)
class PytestRun:
    kind: str  # single | multi
    config: str
    expression: str
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)  # overrides on top of os.environ
    exclusive: bool = False  # hold every GPU slot while it runs

    def command_line(self) -> str:
        return " ".join([*(f"{k}={shlex.quote(v)}" for k, v in self.env.items()), shlex.join(self.argv)])


def choose_platform(flag: str | None, env: dict[str, str], gpus: gpu_slots.Gpus) -> tuple[str, str]:
    """(platform, why): --platform > JA_BACKEND (cpu/cuda/rocm) > detected GPUs."""
    for value, why in ((flag, "--platform"), (env.get(gpu_slots.BACKEND_ENV), gpu_slots.BACKEND_ENV)):
        if value and value != "auto":
            if value not in PLATFORMS:
                raise TierError(f"{why}={value!r} is not a platform; use one of {', '.join(PLATFORMS)}")
            return value, f"{why}={value}"
    return gpus.platform, f"detected: {gpus.how}"


def plan(tier: str, platform: str, gpus: gpu_slots.Gpus, pytest_args: list[str], workers: int | None = None,
         reruns: int = 0, have_rerun_plugin: bool = True, env: dict[str, str] | None = None,
         python: str = sys.executable, results_dir: Path = RESULTS_DIR,
         have_timeout_plugin: bool = True) -> list[PytestRun]:
    """The pytest processes a tier runs on a platform, in order."""
    env = dict(os.environ if env is None else env)
    runs = []
    slots = gpus.count * gpu_slots.tests_per_gpu(env)
    timeout_s = tier_named(tier).timeout_s
    for kind, config, flt in tier_runs(tier, platform):
        if flt.contradiction():
            raise TierError(f"tier {tier} on {platform}: {config} selects nothing ({flt.contradiction()})")
        expr = flt.expression()
        argv = [python, "-m", "pytest", *(["-m", expr] if expr else [])]
        over: dict[str, str] = {REPORT_ENV: str(results_dir / f"flaky-{tier}-{kind}.json")}
        # Only the plugins a tier uses load (-p; ours from tests/conftest.py): an image's others cost each process
        # about a second and some import JAX before the slot is taken. A value the caller set is kept.
        autoload = AUTOLOAD_ENV in env and not env[AUTOLOAD_ENV]
        if AUTOLOAD_ENV not in env:
            over[AUTOLOAD_ENV] = "1"
        if reruns and have_rerun_plugin:
            argv += [*([] if autoload else ["-p", "pytest_rerunfailures"]), "--reruns", str(reruns)]
        if have_timeout_plugin:
            argv += [*([] if autoload else ["-p", "pytest_timeout"]), "--timeout", str(timeout_s)]
        pinned = gpu_slots.held(env)  # a process pinned already (ci/parallel_gpu_execute.py) keeps its slot
        if kind == "multi":
            if not pinned:
                over[gpu_slots.SLOT_ENV] = "0"
            if platform == "cpu":
                flags = env.get("XLA_FLAGS", "")
                over["XLA_FLAGS"] = (flags if "--xla_force_host_platform_device_count" in flags else
                                     f"{flags} --xla_force_host_platform_device_count={CPU_MULTI_DEVICES}".strip())
        else:
            n = workers if workers is not None else (slots if platform != "cpu" else 0)
            if platform != "cpu" and slots and n > slots:
                raise TierError(f"{n} workers but only {slots} GPU slots ({gpus.how}, "
                                f"{gpu_slots.PER_GPU_ENV}={gpu_slots.tests_per_gpu(env)}); the extra workers would "
                                f"wait for a slot until timeout. Use --workers {slots} or raise "
                                f"{gpu_slots.PER_GPU_ENV}")
            if n:  # our plugin is named too, so --longest-first is known whatever paths the run is given
                argv += [*([] if autoload else ["-p", "xdist.plugin"]), "-n", str(n), "--dist", "worksteal",
                         "-p", PLUGIN, "--longest-first"]
            elif platform != "cpu" and not pinned:
                over[gpu_slots.SLOT_ENV] = "1"  # no xdist: pin this one process
        runs.append(PytestRun(kind, config, expr, (*argv, *pytest_args), over,
                              exclusive=kind == "multi" and gpus.count > 0))
    return runs


def _tee(argv: list[str], root: Path, env: dict[str, str]) -> tuple[int, list[str]]:
    """Run a command with its output passed through line by line; (exit code, last lines)."""
    tail: collections.deque[str] = collections.deque(maxlen=OUTPUT_TAIL_LINES)
    with subprocess.Popen(argv, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          errors="replace", bufsize=1) as proc:
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            tail.append(line.rstrip("\n"))
    return proc.returncode, list(tail)


# (reason, pattern in the failure text), first match wins; no match: a test failure.
INFRA_PATTERNS = (
    ("timeout", re.compile(r"Timeout \(>[0-9.]+s\) from pytest-timeout|Failed: Timeout >[0-9.]+s")),
    ("lock wait exceeded", re.compile(r"no free GPU slot after|could not take every GPU slot")),
    ("worker crash", re.compile(r"worker '?gw\d+'? crashed|node down: Not properly terminated|"
                                r"Fatal Python error: (?:Segmentation fault|Aborted)")),
    ("device lost or out of memory", re.compile(
        r"RESOURCE_EXHAUSTED|[Oo]ut of memory|OUT_OF_MEMORY|hipErrorOutOfMemory|DEVICE_LOST|[Dd]evice (?:is )?lost|"
        r"fallen off the bus|hipErrorNoDevice|CUDA_ERROR_NO_DEVICE|no CUDA-capable device|"
        r"uncorrectable ECC|CUDA_ERROR_ECC_UNCORRECTABLE")),
)
COLLECTION = "collection/import error"


def classify(text: str, collecting: bool = False) -> tuple[str, str]:
    """(infrastructure | test, reason) for a failure's text; a collection error is infrastructure."""
    for reason, pattern in INFRA_PATTERNS:
        if pattern.search(text):
            return "infrastructure", reason
    return ("infrastructure", COLLECTION) if collecting else ("test", "test failure")


def run_failure(rc: int, tail: list[str], report: dict | None) -> dict | None:
    """The run-level failure of a pytest process whose test reports do not explain its exit code (not 0, 1 with
    a report, 5): infrastructure, with the reason read from its output (lock wait, worker crash, device)."""
    if rc in (0, 5) or (rc == 1 and report is not None):
        return None
    if rc == 2 and report and report.get("failure_counts", {}).get("infrastructure"):
        return None  # collection errors, already classified in the report
    kind, reason = classify("\n".join(tail))
    if kind == "test":
        reason = f"pytest exit {rc} without test reports (interrupted, internal or usage error, or killed)"
    return {"nodeid": "<run>", "when": "run", "class": "infrastructure", "reason": reason,
            "error": next((ln for ln in reversed(tail) if ln.strip()), "")[:300]}


def execute(runs: list[PytestRun], gpus: gpu_slots.Gpus, root: Path) -> list[dict]:
    """Run each pytest process (all of them, even after a failure) and return their results."""
    results = []
    for run in runs:
        print(f"tiers: {run.kind} run ({run.config}): {run.command_line()}", flush=True)
        Path(run.env[REPORT_ENV]).unlink(missing_ok=True)  # an earlier run's report never stands in for this one
        start = time.monotonic()
        held = []
        try:
            if run.exclusive:
                held = gpu_slots.acquire_all(gpus, gpu_slots.tests_per_gpu(), timeout=gpu_slots.timeout_from_env(),
                                             note=f"pid {os.getpid()}: multigpu tier (exclusive)")
            rc, tail = _tee(list(run.argv), root, {**os.environ, **run.env})
        except gpu_slots.SlotTimeout as e:
            print(f"tiers: {e}", file=sys.stderr)
            rc, tail = gpu_slots.EXIT_NO_SLOT, [str(e)]
        finally:
            for s in held:
                s.release()
        seconds = time.monotonic() - start
        try:
            report = json.loads(Path(run.env[REPORT_ENV]).read_text())
        except (OSError, ValueError):
            report = None
        results.append({**asdict(run), "rc": rc, "seconds": round(seconds, 2), "flaky": report,
                        "run_failure": run_failure(rc, tail, report)})
    return results


def failure_counts(results: list[dict]) -> dict[str, int]:
    """Infrastructure and test failures over every run (run-level failures included)."""
    counts = collections.Counter({"infrastructure": 0, "test": 0})
    for r in results:
        counts.update((r["flaky"] or {}).get("failure_counts") or {})
        counts["infrastructure"] += bool(r.get("run_failure"))
    return dict(counts)


def probe(python: str, want_jax: bool) -> dict:
    """What the pytest interpreter holds (PROBE_MODULES) and, when asked, the GPUs its JAX sees."""
    try:
        cp = subprocess.run([python, "-c", PROBE, "1" if want_jax else "0", *PROBE_MODULES], capture_output=True,
                            text=True, timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise TierError(f"cannot run the test interpreter {python} ({e}); pass --deps-from PYTHON") from None
    if cp.returncode != 0:
        raise TierError(f"the test interpreter {python} failed to describe itself (exit {cp.returncode}): "
                        f"{cp.stderr.strip()[-400:]}")
    return json.loads(cp.stdout.strip().splitlines()[-1])


def plugin_requirements(platform: str) -> list[str]:
    """The JAX GPU plugin for a platform at the jax the test extra pins (none on the CPU)."""
    if platform == "cpu":
        return []
    from jatools.validate import wheelhouse  # packaging: only needed here

    return wheelhouse.plugin_requirements(platform, wheelhouse.test_jax_version())


def device_problem(expected: int, why: str, platform: str, seen: dict, python: str) -> str | None:
    """Why JAX cannot run this GPU tier (fewer GPUs seen than expected), with the fix; None when it can."""
    jax_seen = seen.get("jax") or {}
    found = len(jax_seen.get("gpus") or [])
    if not expected or found >= expected:
        return None
    try:
        reqs = " ".join(plugin_requirements(platform))
    except Exception as e:  # noqa: BLE001 - the message must still come out
        reqs = f"<the {platform} plugin: {e}>"
    state = jax_seen.get("error") or f"jax {jax_seen.get('version')}, default backend {jax_seen.get('backend')}"
    return (f"GPUs expected but not used: {expected} {platform} GPU(s) on this host ({why}), JAX in {python} sees "
            f"{found} ({state}). The JAX GPU plugin is missing or cannot start there. Fix: `nox -s tests` "
            f"(installs {reqs}), or `{python} -m pip install {reqs}`, or on an offline GPU host pass "
            f"--deps-from PYTHON (an interpreter that has JAX and the plugin); --expect-gpus 0 runs the "
            f"tier without them on purpose")


def unused_gpu_runs(expected: int, platform: str, results: list[dict]) -> list[str]:
    """The GPU runs that ran no GPU test on a host where GPUs are expected."""
    if not expected or platform == "cpu":
        return []
    return [f"the {r['kind']} run ({r['config']}, -m {r['expression']!r}) ran 0 GPU tests on a host with {expected} "
            "GPU(s): every GPU test was skipped or deselected (see the skip reasons above)"
            for r in results if r["kind"] != "host" and not (r["kind"] == "multi" and expected < 2)
            and not sum(((r["flaky"] or {}).get("device_tests") or {}).values())]


def _step_summary(tier: str, platform: str, results: list[dict], gpu: dict, counts: dict, rc: int) -> None:
    path = os.environ.get("GITHUB_STEP_SUMMARY")
    if not path:
        return
    lines = [f"### tier {tier} on {platform}: {'ok' if rc == 0 else f'FAILED (exit {rc})'}", "",
             f"Failures: **{counts['infrastructure']} infrastructure**, **{counts['test']} test**", "",
             "| run | config | exit | s | GPU tests per device |", "|---|---|---|---|---|"]
    for r in results:
        per = (r["flaky"] or {}).get("device_tests") or {}
        lines.append(f"| {r['kind']} | {r['config']} | {r['rc']} | {r['seconds']:.0f} | "
                     f"{', '.join(f'{k}: {v}' for k, v in per.items()) or '-'} |")
    lines += [f"- {p}" for p in gpu["problems"]]
    with open(path, "a", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n\n")


def summarize(tier: str, platform: str, why: str, results: list[dict], results_dir: Path, notes: list[str],
              gpu: dict) -> int:
    gpu = {**gpu, "problems": [*gpu["problems"], *unused_gpu_runs(gpu["expected"], platform, results)]}
    rc = 0
    print(f"\n== tier {tier} on {platform} ({why}) ==")
    for note in notes:
        print(f"note: {note}")
    per_device: collections.Counter[str] = collections.Counter()
    for r in results:
        flaky = r["flaky"] or {}
        state = "ok" if r["rc"] == 0 else ("NO TESTS SELECTED" if r["rc"] == 5 else f"FAILED (exit {r['rc']})")
        devices = flaky.get("device_tests") or {}
        per_device.update(devices)
        print(f"{r['kind']:<6} {r['config']:<10} {state:<18} {r['seconds']:>8.1f} s  flaky={flaky.get('flaky', '?')}  "
              f"device tests={sum(devices.values())}  -m {r['expression'] or '<all>'!r}")
        for f in [*(flaky.get("failures") or []), *([r["run_failure"]] if r.get("run_failure") else [])]:
            print(f"  {f['class']} ({f['reason']}): {f['nodeid']}: {f['error']}")
        rc = rc or r["rc"]
    counts = failure_counts(results)
    gpu["tests_per_device"] = dict(per_device)
    print(f"failures: {counts['infrastructure']} infrastructure, {counts['test']} test")
    if gpu["expected"]:
        print(f"GPU tests run per device: {', '.join(f'{k}: {v}' for k, v in per_device.items()) or 'none'} "
              f"({gpu['expected']} GPU(s) expected: {gpu.get('how', '')})")
    for problem in gpu["problems"]:
        print(f"FAILED: {problem}")
    if gpu["problems"] and rc == 0:
        rc = EXIT_GPU_UNUSED
    out = results_dir / f"tier-{tier}.json"
    atomic_write.write_text(out, json.dumps({"tier": tier, "platform": platform, "platform_how": why, "notes": notes,
                                             "rc": rc, "failure_counts": counts, "gpu": gpu, "runs": results},
                                            indent=1) + "\n")
    print(f"results: {out}")
    _step_summary(tier, platform, results, gpu, counts, rc)
    return rc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m jatools.testing.tiers", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    p.add_argument("--tier", default=None, help=f"{' | '.join(TIERS)} (default: ${TIER_ENV} or pr)")
    p.add_argument("--platform", default=None, help="cpu | cuda | rocm (default: detected)")
    p.add_argument("--workers", type=int, default=None, help=f"xdist workers for single-device runs (${WORKERS_ENV}; "
                   "default: one per GPU slot on a GPU host, none on the CPU)")
    p.add_argument("--reruns", type=int, default=None, help=f"retries of a failing test (${RERUNS_ENV}; default "
                   "2 on GPU hosts, 0 on the CPU); every retry is reported")
    p.add_argument("--results-dir", type=Path, default=None, help=f"where the JSON results go ({RESULTS_DIR})")
    p.add_argument("--deps-from", default=None, metavar="PYTHON",
                   help="run pytest with this interpreter and its installed packages (an offline GPU host's JAX "
                        "and GPU plugin), as `invoke validate --deps-from` does")
    p.add_argument("--expect-gpus", type=int, default=None, metavar="N",
                   help="GPUs the tier must use (default: every detected GPU on a cuda/rocm platform); 0 turns "
                        "the GPU checks off")
    p.add_argument("--plugin-requirements", action="store_true",
                   help="print the JAX GPU plugin requirements for the platform (none on the CPU or with "
                        "--deps-from) and exit; `nox -s tests` installs them")
    p.add_argument("--dry-run", action="store_true", help="print the pytest commands and exit")
    a, pytest_args = p.parse_known_args(argv)
    env = dict(os.environ)
    results_dir = (a.results_dir or REPO_ROOT / RESULTS_DIR).resolve()
    tier = a.tier or env.get(TIER_ENV) or DEFAULT_TIER
    python = a.deps_from or sys.executable
    try:
        tier_named(tier)
        gpus = gpu_slots.detect(env)
        platform, why = choose_platform(a.platform, env, gpus)
        if a.plugin_requirements:
            print("\n".join(plugin_requirements(platform) if not a.deps_from else []))
            return 0
        # the GPUs the tier must use: --expect-gpus, else every detected GPU on a GPU platform
        expect, expect_how = ((a.expect_gpus, f"--expect-gpus {a.expect_gpus}") if a.expect_gpus is not None
                              else (0, "cpu platform") if platform == "cpu" else (gpus.count, gpus.how))
        workers = a.workers if a.workers is not None else settings.from_env(WORKERS_ENV, env)
        reruns = a.reruns if a.reruns is not None else settings.from_env(RERUNS_ENV, env)
        reruns = DEFAULT_RERUNS[platform] if reruns is None else reruns
        seen = probe(python, want_jax=bool(expect) and not a.dry_run)
        have = seen["modules"]
        if a.deps_from and not (have["jax"] and have["jaxlib"]):
            raise TierError(f"--deps-from {python}: it has no jax/jaxlib installed; pass the interpreter that has "
                            "JAX and its GPU plugin, or leave --deps-from out")
        notes = [f"pytest interpreter: {python}" + (" (--deps-from: its installed packages)" if a.deps_from else "")]
        notes += [f"{what}: {pkg} is not installed for {python} (pip install {pkg}, or `pip install -e . --group test`)"
                  for what, pkg, wanted in (("retries off", "pytest-rerunfailures", reruns),
                                            ("no per-test timeout", "pytest-timeout", True))
                  if wanted and not have[pkg.replace("-", "_")]]
        runs = plan(tier, platform, gpus, pytest_args, workers, reruns, have["pytest_rerunfailures"], env,
                    python=python, results_dir=results_dir, have_timeout_plugin=have["pytest_timeout"])
    except (TagFilterError, TierError, ValueError) as e:
        print(f"tiers: {e}", file=sys.stderr)
        return 2
    if a.dry_run:
        for note in notes:
            print(f"note: {note}")
        for run in runs:
            print(f"{run.kind} {run.config}{' exclusive' if run.exclusive else ''}: {run.command_line()}")
        return 0
    if not have["pytest"]:
        print(f"tiers: pytest is not installed for {python}; run `bash scripts/run.sh nox -s tests` "
              "or pass --deps-from an interpreter with the `test` dependency group", file=sys.stderr)
        return 2
    problems = [pr for pr in [device_problem(expect, expect_how, platform, seen, python)] if pr]
    gpu = {"expected": expect, "how": expect_how, "jax": seen.get("jax"), "problems": problems}
    # with a device problem no test runs (it would run on the wrong devices)
    return summarize(tier, platform, why, [] if problems else execute(runs, gpus, REPO_ROOT), results_dir, notes, gpu)


# --- the slot speed-up measurement (ci/measure_slot_speedup.py; docs/testing.md) -----------------------
# The pr tier's GPU tests with N xdist workers (one GPU each) vs 1, with the tier's own pytest command
# (plan) and retries off: untimed warm-up rounds, then timed rounds, the N-worker run first in each (a
# warm-cache effect left favours the 1-worker run). Every worker of the N-worker run must have seen exactly
# one GPU, none shared. Each run's wall time is split by the workers' records into start (launch to the
# first test), tests (first test started to last ended) and end (last test ended to exit): start and end
# are paid once per run, so they bound the wall-time speed-up.

SPEEDUP_GOAL = 1.8


def check_pinning(records: list[dict], workers: int) -> list[str]:
    """Problems with how the workers were pinned (empty when each saw exactly one, different, GPU)."""
    problems = [f"{len(records)} worker records for {workers} workers"] if len(records) != workers else []
    gpus = [r["gpu"] for r in records]
    if len(set(gpus)) != len(gpus):
        problems.append(f"workers shared a GPU: {gpus}")
    for r in records:
        devs = r.get("jax_devices")
        if devs is None:
            problems.append(f"{r['worker']}: JAX never started (no GPU test ran there?)")
        elif len(devs) != 1:
            problems.append(f"{r['worker']}: JAX saw {len(devs)} devices ({devs}), expected exactly 1")
    return problems


def phases(records: list[dict], launched: float, ended: float) -> dict | None:
    """Split a run's wall time (time.time() at launch and exit) by its workers' first and last test; None when
    no worker recorded a test."""
    ran = [r["tests"] for r in records if (r.get("tests") or {}).get("count")]
    if not ran:
        return None
    first, last = min(t["first_start"] for t in ran), max(t["last_end"] for t in ran)
    return {"start": round(first - launched, 2), "tests": round(last - first, 2), "end": round(ended - last, 2)}


def timed_run(run: PytestRun, root: Path, records: Path) -> dict:
    env = {**os.environ, **run.env, gpu_slots.RECORD_ENV: str(records)}
    launched, start = time.time(), time.monotonic()
    proc = subprocess.run(list(run.argv), cwd=root, env=env, capture_output=True, text=True, check=False)
    seconds, ended = time.monotonic() - start, time.time()
    sys.stdout.write("\n".join(proc.stdout.splitlines()[-4:]) + "\n")
    recs = [json.loads(p.read_text()) for p in sorted(records.glob("*.json"))]
    tail = "\n".join(proc.stdout.strip().splitlines()[-3:])
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected|rerun)", tail)}
    return {"rc": proc.returncode, "seconds": round(seconds, 2), "counts": counts, "workers_seen": recs,
            "phases": phases(recs, launched, ended), "output_tail": proc.stdout[-4000:] + proc.stderr[-2000:]}


def phase_summary(timed: list[dict], workers: int) -> dict | None:
    """Median start / tests / end of the 1- and N-worker runs, the test phase's speed-up, and the bound
    start and end put on the wall-time speed-up. None unless every timed run has its phases."""
    if not timed or any(x["phases"] is None for x in timed):
        return None
    med = {n: {k: round(statistics.median(x["phases"][k] for x in timed if x["workers"] == n), 2)
               for k in ("start", "tests", "end")} for n in (1, workers)}
    one, par = med[1], med[workers]
    fixed = {n: round(med[n]["start"] + med[n]["end"], 2) for n in (1, workers)}
    return {"median_1_worker": one, f"median_{workers}_workers": par,
            "start_end_1_worker": fixed[1], f"start_end_{workers}_workers": fixed[workers],
            "test_phase_speedup": round(one["tests"] / par["tests"], 3) if par["tests"] else None,
            "wall_speedup_bound": round((fixed[1] + one["tests"]) / (fixed[1] + one["tests"] / workers), 3)}


def round_speedups(timed: list[dict], workers: int) -> list[float]:
    """Each timed round's own speed-up (its 1-worker run over its N-worker run), in round order: the
    spread shows how much of a difference between medians the host's run-to-run noise could make."""
    by_round: dict[int, dict[int, float]] = {}
    for x in timed:
        by_round.setdefault(x["round"], {})[x["workers"]] = x["seconds"]
    return [round(r[1] / r[workers], 3) for _, r in sorted(by_round.items()) if r.get(workers)]


def speedup_main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 ci/measure_slot_speedup.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    p.add_argument("--workers", type=int, default=2, help="workers of the parallel run, one GPU each (2)")
    p.add_argument("--repeats", type=int, default=1, help="rounds of (N workers, 1 worker); medians are compared")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds first, not in the medians (1)")
    p.add_argument("--tier", default="pr", help="tier whose single-device run is timed (pr)")
    p.add_argument("--platform", default=None, help="cuda | rocm (default: detected)")
    p.add_argument("--out", type=Path, default=Path("build/test-results/slot_speedup.json"))
    a, pytest_args = p.parse_known_args(argv)
    if a.repeats < 1 or a.warmup < 0 or a.workers < 2:
        p.error("--repeats must be >= 1, --warmup >= 0 and --workers >= 2")
    n_w = a.workers
    gpus = gpu_slots.detect()
    platform, why = choose_platform(a.platform, dict(os.environ), gpus)
    if platform == "cpu" or gpus.count < n_w:
        print(f"measure_slot_speedup: needs {n_w} GPUs, found {gpus.count} ({gpus.how}); run it on the GPU host",
              file=sys.stderr)
        return 2
    rounds = []
    for r in range(a.warmup + a.repeats):
        warmup = r < a.warmup
        label = f"warm-up {r + 1}" if warmup else f"round {r - a.warmup + 1}"
        for n in (n_w, 1):
            (run,) = [x for x in plan(a.tier, platform, gpus, pytest_args, workers=n, reruns=0,
                                      results_dir=REPO_ROOT / RESULTS_DIR) if x.kind == "single"]
            print(f"measure_slot_speedup: {label}, {n} worker(s): {run.command_line()}", flush=True)
            with tempfile.TemporaryDirectory(prefix="ja-slots-") as tmp:
                res = timed_run(run, REPO_ROOT, Path(tmp))
            res.update(workers=n, round=r - a.warmup + 1, warmup=warmup, label=label, command=run.command_line(),
                       pinning_problems=check_pinning(res["workers_seen"], n))
            rounds.append(res)
    timed = [x for x in rounds if not x["warmup"]]
    t_n = statistics.median(x["seconds"] for x in timed if x["workers"] == n_w)
    t_1 = statistics.median(x["seconds"] for x in timed if x["workers"] == 1)
    failures = [f"{x['workers']} worker(s), {x['label']}: exit {x['rc']}" for x in rounds if x["rc"] != 0]
    failures += [f"{x['workers']} worker(s), {x['label']}: {pr}" for x in rounds for pr in x["pinning_problems"]]
    speedup = t_1 / t_n if t_n else 0.0
    split = phase_summary(timed, n_w)
    per_round = round_speedups(timed, n_w)
    result = {"tier": a.tier, "platform": platform, "platform_how": why, "gpus": list(gpus.ids),
              "gpus_how": gpus.how, "workers": n_w, "repeats": a.repeats, "warmup": a.warmup,
              "seconds_1_worker": t_1, f"seconds_{n_w}_workers": t_n, "speedup": round(speedup, 3),
              "round_speedups": per_round, "goal": SPEEDUP_GOAL,
              "met_goal": speedup >= SPEEDUP_GOAL and not failures, "phases": split, "failures": failures,
              "runs": rounds}
    atomic_write.write_text(a.out, json.dumps(result, indent=1) + "\n")
    print(f"\n== slot speed-up, tier {a.tier} on {platform} ({gpus.how}) ==")
    for x in rounds:
        pins = ", ".join(f"{w['worker']}->GPU {w['gpu']} ({len(w.get('jax_devices') or [])} dev)"
                         for w in x["workers_seen"])
        ph = x["phases"]
        split_s = f" (start {ph['start']:.1f} + tests {ph['tests']:.1f} + end {ph['end']:.1f})" if ph else ""
        print(f"{x['workers']} worker(s) {x['label']}: {x['seconds']:.1f} s{split_s}, exit {x['rc']}, "
              f"{x['counts']}; {pins}")
    print(f"1 worker {t_1:.1f} s, {n_w} workers {t_n:.1f} s: speed-up {speedup:.2f}x (goal {SPEEDUP_GOAL}x)")
    print(f"each round's own speed-up: {', '.join(f'{r:.2f}x' for r in per_round)} "
          f"(from {min(per_round):.2f}x to {max(per_round):.2f}x)")
    if split:
        one, par = split["median_1_worker"], split[f"median_{n_w}_workers"]
        test_speedup = (f"{split['test_phase_speedup']:.2f}x" if split["test_phase_speedup"]
                        else "not measurable (test phase under 0.01 s)")
        print(f"test phase (first test started to last ended), medians: 1 worker {one['tests']:.1f} s, "
              f"{n_w} workers {par['tests']:.1f} s: {test_speedup}")
        print(f"start + end, paid once per run: {split['start_end_1_worker']:.1f} s with 1 worker, "
              f"{split[f'start_end_{n_w}_workers']:.1f} s with {n_w}; with the 1-worker start and end, a perfect "
              f"{n_w}-way split of its test phase gives at most {split['wall_speedup_bound']:.2f}x")
    for f in failures:
        print(f"FAILED: {f}")
    print(f"results: {a.out}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
