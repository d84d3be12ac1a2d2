"""The runner of a test tier (which tests each tier runs: tag_filters.py).

    python3 -m jatools.testing.tiers --tier pr [--platform cuda] [--workers N] [--reruns N] [pytest args]
    JA_TEST_TIER=nightly bash ci/test.sh

Owns the tier runner (docs/testing.md): xdist workers pinned to GPU slots, multi-device runs, each run's
report, tier-<tier>.json, the GPU checks, exit 7 when GPUs go unused. The tiers and tag filters it runs are
tag_filters.py; the slot speed-up measurement (python3 -m jatools.testing.speedup) is speedup.py.

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
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from jatools import atomic_write
from jatools.config import REPO_ROOT, build_path
from jatools.testing import gpu_slots
from jatools.testing.tag_filters import (
    DEFAULT_TIER,
    PLATFORMS,
    TIER_ENV,
    TIERS,
    TagFilterError,
    tier_named,
    tier_runs,
)
from jax_aiter import settings

# --- the runner ---------------------------------------------------------------------------------

WORKERS_ENV = "JA_TEST_WORKERS"
RERUNS_ENV = "JA_TEST_RERUNS"
REPORT_ENV = "JA_FLAKY_JSON"  # where a pytest process writes its run report (the plugin's RunReport)
AUTOLOAD_ENV = "PYTEST_DISABLE_PLUGIN_AUTOLOAD"  # pytest's own switch; set to empty, every installed plugin loads
RESULTS_DIR = build_path("test_results")  # relative to the checkout
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
         have_timeout_plugin: bool = True, installed: bool = False) -> list[PytestRun]:
    """The pytest processes a tier runs on a platform, in order. `installed`: the tests import the jax_aiter
    installed for `python` (a wheel), never the checkout's: `-P` keeps the working folder off sys.path, the
    checkout's pythonpath setting is emptied and pytest appends the root (for tests/ and jatools) after
    site-packages."""
    env = dict(os.environ if env is None else env)
    runs = []
    slots = gpus.count * gpu_slots.tests_per_gpu(env)
    timeout_s = tier_named(tier).timeout_s
    for kind, config, flt in tier_runs(tier, platform):
        if flt.contradiction():
            raise TierError(f"tier {tier} on {platform}: {config} selects nothing ({flt.contradiction()})")
        expr = flt.expression()
        argv = [python, *INSTALLED_PYTHON_FLAGS * installed, "-m", "pytest",
                *INSTALLED_PYTEST_FLAGS * installed, *(["-m", expr] if expr else [])]
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
        pinned = gpu_slots.held(env)  # a process pinned already (python3 -m ci.parallel_gpu_execute) keeps its slot
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
            if n:  # our plugin is named too, so --longest-first is known whatever paths the run is given; not
                # when installed: -P and the emptied pythonpath leave jatools unimportable until tests/conftest.py
                # (which loads the plugin) has the root appended after site-packages
                argv += [*([] if autoload else ["-p", "xdist.plugin"]), "-n", str(n), "--dist", "worksteal",
                         *([] if installed else ["-p", PLUGIN]), "--longest-first"]
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


INSTALLED_PYTHON_FLAGS = ("-P",)  # never the working folder (the checkout) first on sys.path
INSTALLED_PYTEST_FLAGS = ("-o", "pythonpath=", "--import-mode=append")
_INSTALLED = ("import json, jax_aiter; from jax_aiter import _loader; i = _loader.build_identity() or {}; "
              "print(json.dumps({'file': jax_aiter.__file__, 'version': i.get('version'), 'lane': i.get('lane'), "
              "'variant': i.get('variant'), 'cache_id': i.get('cache_id')}))")


def installed_package(python: str) -> dict:
    """Where the tests' jax_aiter comes from under --installed: an installed wheel (its file outside the checkout,
    its build identity); TierError when it would be the checkout's or no wheel's."""
    cp = subprocess.run([python, *INSTALLED_PYTHON_FLAGS, "-c", _INSTALLED], cwd=REPO_ROOT, capture_output=True,
                        text=True, timeout=300, check=False)
    if cp.returncode != 0:
        raise TierError(f"--installed: {python} cannot import an installed jax_aiter ({cp.stderr.strip()[-300:]}); "
                        "install the lane's wheel into it first (ci/gpu/h200_ci_jobs.sh does)")
    found = json.loads(cp.stdout.strip().splitlines()[-1])
    if Path(found["file"]).resolve().is_relative_to(REPO_ROOT.resolve()) or not found["version"]:
        raise TierError(f"--installed: {python} imports jax_aiter from {found['file']}, not from an installed wheel")
    return found


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


def _parser() -> argparse.ArgumentParser:
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
    p.add_argument("--installed", action="store_true",
                   help="test the jax_aiter installed for the pytest interpreter (a lane's wheel), not the checkout's")
    p.add_argument("--dry-run", action="store_true", help="print the pytest commands and exit")
    return p


def main(argv: list[str] | None = None) -> int:
    a, pytest_args = _parser().parse_known_args(argv)
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
        package = installed_package(python) if a.installed else None
        if package:
            notes.append(f"testing the installed jax_aiter {package['version']} (lane {package['lane']}, "
                         f"{package['variant']}) from {package['file']}, not the checkout's")
        runs = plan(tier, platform, gpus, pytest_args, workers, reruns, have["pytest_rerunfailures"], env,
                    python=python, results_dir=results_dir, have_timeout_plugin=have["pytest_timeout"],
                    installed=a.installed)
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
    gpu = {"expected": expect, "how": expect_how, "jax": seen.get("jax"), "problems": problems,
           "installed": package}
    # with a device problem no test runs (it would run on the wrong devices)
    return summarize(tier, platform, why, [] if problems else execute(runs, gpus, REPO_ROOT), results_dir, notes, gpu)


if __name__ == "__main__":
    sys.exit(main())
