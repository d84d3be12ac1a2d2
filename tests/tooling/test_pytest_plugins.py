"""The pytest plugins in real pytest processes: xdist GPU slots, device guards, flaky-retry report,
longest-first ordering."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from jatools.testing import tag_filters

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = ["jatools.testing.pytest_plugin"]
PINNING = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "XLA_FLAGS",
           "JA_GPU_SLOT", "JA_FLAKY_JSON", "PYTEST_XDIST_WORKER", "PYTEST_ADDOPTS",
           "PYTEST_DISABLE_PLUGIN_AUTOLOAD",  # a tier run sets it; these suites load xdist as users do
           "XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION", "OPENBLAS_NUM_THREADS",
           "MKL_NUM_THREADS", "OMP_NUM_THREADS", "JA_WORKER_FAST_EXIT")

needs_xdist = pytest.mark.skipif(importlib.util.find_spec("xdist") is None, reason="pytest-xdist is not installed")
needs_rerun = pytest.mark.skipif(importlib.util.find_spec("pytest_rerunfailures") is None,
                                 reason="pytest-rerunfailures is not installed (pip install -e . --group test)")


@pytest.fixture
def suite(tmp_path):
    """A throw-away test tree wired to the plugins like tests/conftest.py, plus a fake GPU host."""
    tree = tmp_path / "suite"
    tree.mkdir()
    (tree / "pytest.ini").write_text("[pytest]\naddopts = -ra -p no:cacheprovider --strict-markers\nmarkers =\n"
                                     + "".join(f"    {m}: x\n" for m in tag_filters.MARKERS))
    (tree / "conftest.py").write_text(f"pytest_plugins = {PLUGINS!r}\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()

    def run(tests: str, *args: str, gpus: int = 0, **env: str) -> subprocess.CompletedProcess:
        (tree / "test_it.py").write_text(textwrap.dedent(tests))
        smi = bin_dir / "nvidia-smi"
        smi.write_text("#!/bin/sh\n" + "".join(f"echo 'GPU {i}: NVIDIA H200 (UUID: GPU-{i})'\n" for i in range(gpus)))
        smi.chmod(0o755)
        # no AMD GPU: rocminfo answers with no gfx agent (a probe that fails is an error, tests/faults)
        (bin_dir / "rocminfo").write_text("#!/bin/sh\necho 'ROCk module version 6.14 is loaded'\n")
        (bin_dir / "rocminfo").chmod(0o755)
        full = {k: v for k, v in os.environ.items() if k not in PINNING}
        full.update(PATH=f"{bin_dir}:{os.environ['PATH']}",
                    PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                    JA_GPU_LOCK_DIR=str(tmp_path / "locks"), **env)
        return subprocess.run([sys.executable, "-m", "pytest", str(tree), *args], cwd=tree, env=full,
                              capture_output=True, text=True, timeout=300, check=False)

    run.tree = tree
    run.tmp = tmp_path
    return run


WHO_AM_I = """
    import json, os, sys, time, pytest

    @pytest.mark.parametrize("i", range(4))
    def test_where(i):
        time.sleep(0.1)
        rec = {k: os.environ.get(k) for k in ("PYTEST_XDIST_WORKER", "CUDA_VISIBLE_DEVICES", "JA_GPU_SLOT",
                                          "XLA_PYTHON_CLIENT_PREALLOCATE", "OPENBLAS_NUM_THREADS")}
        rec["jax_imported"] = "jax" in sys.modules
        open(os.path.join(os.environ["OUT"], f"{i}.json"), "w").write(json.dumps(rec))
"""


def _records(folder: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


def _where(suite, *args: str, gpus: int = 2, **env: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """Run WHO_AM_I on `gpus` stand-in GPUs with these pytest args and environment: the run, and each test's record."""
    out = suite.tmp / "out"
    out.mkdir()
    r = suite(WHO_AM_I, *args, gpus=gpus, OUT=str(out), **env)
    assert r.returncode == 0, r.stdout + r.stderr
    return r, _records(out)


@needs_xdist
def test_xdist_workers_each_take_a_different_gpu(suite):
    _, recs = _where(suite, "-n", "2", JA_GPU_SLOT_RECORD_DIR=str(suite.tmp / "slots"))
    by_worker = {}
    for rec in recs:
        by_worker.setdefault(rec["PYTEST_XDIST_WORKER"], set()).add(rec["CUDA_VISIBLE_DEVICES"])
        assert not rec["jax_imported"]
        assert rec["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"  # no 75%-of-the-GPU reservation per worker
        assert rec["OPENBLAS_NUM_THREADS"] == "1"               # no spinning BLAS pool per worker
    assert len(recs) == 4 and set(by_worker) == {"gw0", "gw1"}
    assert all(len(g) == 1 for g in by_worker.values())           # a worker stays on one GPU
    assert set.union(*by_worker.values()) == {"0", "1"}            # the two workers on different GPUs
    slots = {s["worker"]: (s["gpu"], s["slot"]) for s in _records(suite.tmp / "slots")}
    assert sorted(slots.values()) == [("0", 0), ("1", 0)]


@needs_xdist
def test_slot_switch_off_leaves_workers_unpinned(suite):
    _, recs = _where(suite, "-n", "2", JA_GPU_SLOT="0")
    assert {rec["CUDA_VISIBLE_DEVICES"] for rec in recs} == {None}
    assert {rec["XLA_PYTHON_CLIENT_PREALLOCATE"] for rec in recs} == {None}


@needs_xdist
def test_a_preallocation_choice_of_the_caller_is_kept(suite):
    _, recs = _where(suite, "-n", "2", XLA_PYTHON_CLIENT_PREALLOCATE="true")
    assert {rec["XLA_PYTHON_CLIENT_PREALLOCATE"] for rec in recs} == {"true"}


@needs_xdist
def test_numpy_imported_before_the_slot_is_a_warning(suite):
    (suite.tree / "conftest.py").write_text(f"import numpy\npytest_plugins = {PLUGINS!r}\n")
    r, _ = _where(suite, "-n", "2")
    assert "NumPy was imported before this worker took its GPU slot" in r.stdout + r.stderr


def test_single_process_pins_itself_on_request(suite):
    _, recs = _where(suite, gpus=3, JA_GPU_SLOT="1")
    assert {rec["JA_GPU_SLOT"] for rec in recs} == {"0:0"}


GUARDED = """
    import pytest

    def test_plain():  # first: nothing marked has run yet
        import sys
        assert "jax" not in sys.modules  # the guards import JAX only for marked tests

    @pytest.mark.gpu
    def test_needs_gpu():
        pass

    @pytest.mark.cuda_only
    def test_needs_cuda():
        pass

    @pytest.mark.rocm_only
    def test_needs_rocm():
        pass

    @pytest.mark.multigpu(devices=2)
    def test_two():
        import jax
        assert len(jax.devices()) >= 2

    @pytest.mark.multigpu(devices=4)
    def test_four():
        import jax
        assert len(jax.devices()) >= 4

    @pytest.mark.multigpu(devices=8)
    def test_eight():
        pass
"""


def test_guards_skip_with_printed_reasons(suite):
    pytest.importorskip("jax", reason="the device guards ask JAX what it sees")
    r = suite(GUARDED)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 passed, 6 skipped" in r.stdout
    assert "gpu: needs a GPU; JAX has no gpu backend" in r.stdout
    assert "cuda_only: needs a CUDA GPU" in r.stdout and "rocm_only: needs a ROCm GPU" in r.stdout
    assert "multigpu: needs 2 devices, JAX sees 1 (cpu)" in r.stdout
    assert "xla_force_host_platform_device_count" in r.stdout  # the fix is named
    assert "SKIPPED [1] test_it.py:" in r.stdout  # reported at the test, not inside the plugin


def test_multigpu_tests_run_when_enough_devices_are_visible(suite):
    pytest.importorskip("jax", reason="the device guards ask JAX what it sees")
    r = suite(GUARDED, "-m", "multigpu", XLA_FLAGS="--xla_force_host_platform_device_count=4")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 passed, 1 skipped" in r.stdout and "multigpu: needs 8 devices, JAX sees 4 (cpu)" in r.stdout


@pytest.mark.parametrize("mark, error", [
    ("gpu_memory(gib='40')", "gpu_memory(gib=...) needs a positive number of GiB, got '40'"),
    ("gpu_memory(gib=0)", "needs a positive number of GiB, got 0"),
    ("gpu_memory(gib=float('nan'))", "needs a positive number of GiB, got nan"),
    ("gpu_memory()", "needs a positive number of GiB, got None"),
    ("multigpu(devices='two')", "multigpu(devices=...) needs a positive int, got 'two'")])
def test_malformed_device_marker_fails_the_run(suite, mark, error):
    r = suite(f"""
        import pytest

        @pytest.mark.{mark}
        def test_x():
            pass
    """)
    assert r.returncode != 0 and error in r.stdout + r.stderr


def test_a_memory_need_runs_where_the_device_reports_no_allocator_limit(suite):
    pytest.importorskip("jax", reason="the guard asks JAX for the device's memory limit")
    r = suite("""
        import pytest

        @pytest.mark.gpu_memory(gib=1e6)
        def test_big():
            pass
    """)
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout + r.stderr  # the CPU reports none: it runs


def test_a_memory_need_above_a_shared_gpus_share_skips_naming_the_fix():
    from jatools.testing import gpu_slots
    from jatools.testing.pytest_plugin import memory_short
    shared = {gpu_slots.PER_GPU_ENV: "4", gpu_slots.MEM_FRACTION_ENV: "0.23", gpu_slots.SLOT_ENV: "0:1"}
    why = memory_short(40, 31 * 2**30, shared)
    assert why == ("gpu_memory: needs 40 GiB of one GPU, XLA's allocator has 31.0 GiB (JA_TESTS_PER_GPU=4 gives "
                   "each worker XLA_PYTHON_CLIENT_MEM_FRACTION=0.23 of the GPU); run it on a GPU of its own "
                   "(JA_TESTS_PER_GPU=1)")
    assert memory_short(40, 40 * 2**30, shared) is None  # exactly enough
    assert memory_short(40, None, shared) is None
    assert "(XLA_PYTHON_CLIENT_MEM_FRACTION=0.2)" in memory_short(40, 2**34, {gpu_slots.MEM_FRACTION_ENV: "0.2"})
    assert "(the GPU has no more)" in memory_short(200, 139 * 2**30, {})


FLAKY = """
    import os, pytest

    def test_flaky():
        marker = os.path.join(os.environ["OUT"], "flaky-attempted")
        if not os.path.exists(marker):
            open(marker, "w").close()
            assert 1 == 2, "first attempt fails"

    def test_broken():
        assert False, "always fails"

    def test_fine():
        pass
"""


@needs_rerun
@pytest.mark.parametrize("xdist", [False, pytest.param(True, marks=needs_xdist)], ids=["serial", "xdist"])
def test_retries_are_listed_and_never_hide_a_failure(suite, xdist):
    out = suite.tmp / "out"
    out.mkdir()
    report = suite.tmp / "flaky.json"
    r = suite(FLAKY, "--reruns", "2", *(["-n", "2"] if xdist else []), OUT=str(out), JA_FLAKY_JSON=str(report))
    assert r.returncode == 1, r.stdout + r.stderr  # the always-failing test still fails the run
    assert "FLAKY (passed after retry): test_it.py::test_flaky (1 retry)" in r.stdout
    assert "FAILED after retries: test_it.py::test_broken (2 retries)" in r.stdout
    assert "first attempt fails" in r.stdout
    res = json.loads(report.read_text())
    tests = {t["nodeid"]: t for t in res["tests"]}
    assert set(tests) == {"test_it.py::test_flaky", "test_it.py::test_broken"}
    assert tests["test_it.py::test_flaky"]["flaky"] and tests["test_it.py::test_flaky"]["final"] == "passed"
    assert (tests["test_it.py::test_broken"]["final"] == "failed"
            and len(tests["test_it.py::test_broken"]["attempts"]) == 2)
    assert (res["flaky"], res["failed_after_retries"], res["retries_configured"]) == (1, 1, 2)


def test_report_is_written_when_nothing_was_retried(suite):
    report = suite.tmp / "flaky.json"
    r = suite("def test_ok():\n    pass\n", JA_FLAKY_JSON=str(report))
    assert r.returncode == 0
    res = json.loads(report.read_text())
    assert res["tests"] == [] and res["flaky"] == 0


@needs_xdist
@pytest.mark.parametrize("early, refused", [("import jax", False), ("import jax; jax.devices()", True)])
def test_worker_refuses_only_a_jax_that_already_chose_its_devices(suite, early, refused):
    """Importing JAX before the slot is harmless (image plugins do it); starting a backend is not."""
    conftest = suite.tree / "conftest.py"
    conftest.write_text(f"{early}\n" + conftest.read_text())
    r = suite("def test_ok():\n    pass\n", "-n", "1", gpus=1)
    assert (r.returncode != 0) == refused, r.stdout + r.stderr
    assert ("started its backends before this worker took its GPU slot" in r.stdout + r.stderr) == refused


def test_longest_first_order_puts_unknown_tests_at_the_mean_and_keeps_ties_in_collection_order():
    from jatools.testing.pytest_plugin import longest_first

    ids = ["a", "b", "c", "d", "new"]
    assert longest_first(ids, {}) == [0, 1, 2, 3, 4]  # nothing recorded: collection order
    # mean of the recorded ones is 0.35: "new" goes between c (0.5) and the 0.2s, which keep their order
    assert longest_first(ids, {"a": 0.2, "b": 0.2, "c": 0.5, "d": 0.5}) == [2, 3, 4, 0, 1]


def test_longest_first_for_worksteal_gives_each_worker_a_slice_of_equal_time_longest_first():
    from jatools.testing.pytest_plugin import longest_first, slice_sizes

    assert slice_sizes(149, 2) == [74, 75] and slice_sizes(10, 3) == [3, 3, 4]  # xdist worksteal's first split
    ids = list("abcdefg")
    order = longest_first(ids, {"a": 1, "b": 5, "c": 3, "d": 3, "e": 1, "f": 2, "g": 4}, parts=2)
    first, second = [ids[i] for i in order[:3]], [ids[i] for i in order[3:]]
    assert first == ["b", "d", "a"] and second == ["g", "c", "f", "e"]  # 9 s and 10 s, each longest first


TIMED = """
    import json, os, time, pytest

    SLEEP = {0: 0.05, 1: 0.0, 2: 0.6, 3: 0.0, 4: 0.3, 5: 0.0}

    @pytest.mark.parametrize("i", range(6))
    def test_t(i):
        rec = {"i": i, "start": time.monotonic(), "worker": os.environ.get("PYTEST_XDIST_WORKER")}
        time.sleep(SLEEP[i])
        open(os.path.join(os.environ["OUT"], f"{i}.json"), "w").write(json.dumps(rec))
"""


def _started(suite, *args: str) -> tuple[subprocess.CompletedProcess, list[int]]:
    """Run TIMED with the pytest cache on: the run, and its tests in the order they started."""
    out = suite.tmp / "out"
    out.mkdir(exist_ok=True)
    for old in out.glob("*.json"):
        old.unlink()
    r = suite(TIMED, "-v", *args, OUT=str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    return r, [rec["i"] for rec in sorted(_records(out), key=lambda rec: rec["start"])]


@pytest.fixture
def cached_suite(suite):
    """suite with pytest's cache on, kept in .cache_<xdist worker> (the controller's is .cache_)."""
    # pytest expands environment variables in cache_dir; only workers have PYTEST_XDIST_WORKER, so a
    # worker that read the cache itself would find none there and fall back to collection order.
    ini = (suite.tree / "pytest.ini").read_text().replace("-p no:cacheprovider ", "")
    (suite.tree / "pytest.ini").write_text(ini + "cache_dir = .cache_${PYTEST_XDIST_WORKER}\n")
    return suite


def _recorded(suite) -> dict:
    path = suite.tree / ".cache_${PYTEST_XDIST_WORKER}" / "v" / "jax_aiter" / "durations"
    return json.loads(path.read_text())


def test_longest_first_records_durations_and_runs_the_longest_first_next_time(cached_suite):
    r, order = _started(cached_suite, "--longest-first")
    assert order == [0, 1, 2, 3, 4, 5] and "--longest-first: no durations recorded yet" in r.stdout
    seconds = _recorded(cached_suite)
    assert set(seconds) == {f"test_it.py::test_t[{i}]" for i in range(6)}
    assert seconds["test_it.py::test_t[2]"] >= 0.6 and seconds["test_it.py::test_t[1]"] < 0.3
    r, order = _started(cached_suite, "--longest-first")
    assert order[:3] == [2, 4, 0] and "--longest-first: 6 recorded durations" in r.stdout
    _, order = _started(cached_suite)  # without the flag: collection order, nothing read
    assert order == [0, 1, 2, 3, 4, 5]


@needs_xdist
def test_longest_first_workers_take_the_controllers_durations(cached_suite):
    _started(cached_suite, "--longest-first", "-p", "no:xdist")  # records, as the controller would
    r, order = _started(cached_suite, "--longest-first", "-n", "1")
    assert order[:3] == [2, 4, 0], r.stdout  # the worker's own cache folder is empty: this came from the controller
    assert not list(cached_suite.tree.glob(".cache_gw*/v/jax_aiter"))  # and workers never write durations


@needs_xdist
def test_longest_first_under_worksteal_starts_each_worker_on_a_long_test(cached_suite):
    _started(cached_suite, "--longest-first", "-p", "no:xdist")  # records
    out = cached_suite.tmp / "out"
    _started(cached_suite, "--longest-first", "-n", "2", "--dist", "worksteal")
    recs = _records(out)
    firsts = {}
    for rec in sorted(recs, key=lambda rec: rec["start"]):
        firsts.setdefault(rec["worker"], rec["i"])
    # the two long tests, one per worker, each first
    assert sorted(firsts.values()) == [2, 4], sorted((r["start"], r["worker"], r["i"]) for r in recs)


def test_longest_first_steps_aside_for_failed_first_and_without_a_cache(cached_suite):
    _started(cached_suite, "--longest-first")
    r, order = _started(cached_suite, "--longest-first", "--ff")
    assert order == [0, 1, 2, 3, 4, 5] and "--longest-first: not applied, --ff/--nf order this run" in r.stdout
    r, order = _started(cached_suite, "--longest-first", "-p", "no:cacheprovider")
    assert order == [0, 1, 2, 3, 4, 5] and "the pytest cache is off" in r.stdout


AT_EXIT = """
    import atexit, os, pathlib

    OUT = pathlib.Path(os.environ["OUT"])
    WORKER = os.environ.get("PYTEST_XDIST_WORKER", "main")


    def after_jax_clean_up():  # registered before JAX is imported, so it runs after JAX's own exit handler
        bridge = __import__("jax._src.xla_bridge", fromlist=["_backends"])
        (OUT / f"backends-{WORKER}").write_text("alive" if bridge._backends else "cleared")


    atexit.register(after_jax_clean_up)
    import jax  # noqa: E402


    class Finalized:
        # A module global: deleted only when the interpreter finalizes (with what it needs bound
        # here, as module globals may already be gone by then).
        def __del__(self, _open=open, _path=str(OUT / f"finalized-{WORKER}")):
            with _open(_path, "w") as f:
                f.write("yes")


    KEEP = Finalized()


    def test_uses_jax():
        assert jax.devices()
        atexit.register(lambda: (OUT / f"atexit-{WORKER}").write_text("ran"))
"""


# In the controller, before xdist's own session end tears the workers down: is the worker's
# process already gone (exited, a zombie not yet reaped), or still waiting to be told to stop?
WATCH_THE_WORKER = """
import os, pathlib, time, pytest
pytest_plugins = {plugins!r}


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    out = pathlib.Path(os.environ["OUT"])
    stat = pathlib.Path("/proc", (out / "pid-gw0").read_text(), "stat")
    deadline, state = time.monotonic() + 8, "running"
    while time.monotonic() < deadline:
        if not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
            state = "gone"
            break
        time.sleep(0.02)
    (out / "worker-at-teardown").write_text(state)
"""


@needs_xdist
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc (Linux)")
@pytest.mark.parametrize("fast", ["1", "0"])
def test_a_pinned_worker_exits_once_reported_skipping_the_exit_handlers(suite, fast):
    """Fast exit (the default): once the worker has reported everything it ends, without waiting for the
    controller; no exit handler (JAX's backend clean-up among them) runs, nor interpreter finalization, and
    what it printed or logged is not lost. JA_WORKER_FAST_EXIT=0: the full teardown, after the controller's stop."""
    pytest.importorskip("jax", reason="the exit handler it skips is JAX's")
    out = suite.tmp / "out"
    out.mkdir()
    (suite.tree / "conftest.py").write_text(WATCH_THE_WORKER.format(plugins=PLUGINS))
    tests = AT_EXIT + textwrap.indent(textwrap.dedent("""
        import logging.handlers

        def test_pid():
            (OUT / f'pid-{WORKER}').write_text(str(os.getpid()))
            # buffered until the handler is flushed: at logging's shut-down, whichever way the process ends
            handler = logging.handlers.MemoryHandler(100, target=logging.FileHandler(OUT / f"log-{WORKER}"))
            logging.getLogger("ja-exit").addHandler(handler)
            logging.getLogger("ja-exit").warning("logged before the end")
    """), "    ")
    r = suite(tests, "-n", "1", gpus=1, OUT=str(out), **({} if fast == "1" else {"JA_WORKER_FAST_EXIT": "0"}))
    assert r.returncode == 0 and "2 passed" in r.stdout, r.stdout + r.stderr
    assert "node down" not in r.stdout + r.stderr and "crashed" not in r.stdout + r.stderr
    seen = {p.name: p.read_text() for p in out.iterdir()}
    assert seen["worker-at-teardown"] == ("gone" if fast == "1" else "running")
    assert seen["log-gw0"] == "logged before the end\n"  # flushed either way
    assert ("atexit-gw0" in seen) == (fast == "0")  # a handler a test registered runs only in the full teardown
    assert seen.get("backends-gw0") == (None if fast == "1" else "cleared")  # JAX's clean-up: likewise
    assert ("finalized-gw0" in seen) == (fast == "0")


@needs_xdist
def test_an_unpinned_worker_exits_as_usual(suite):
    pytest.importorskip("jax", reason="the exit handler in question is JAX's")
    out = suite.tmp / "out"
    out.mkdir()
    r = suite(AT_EXIT, "-n", "1", gpus=1, OUT=str(out), JA_GPU_SLOT="0")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (out / "backends-gw0").read_text() == "cleared" and (out / "finalized-gw0").exists()


# A stand-in for the NVIDIA driver (there is no GPU here): the three calls the warm-up makes, each
# logged with the calling thread, and a cuInit that takes as long as FAKE_CUDA_INIT_SECONDS says.
FAKE_DRIVER = r"""
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
static void note(const char *what, int arg) {
  FILE *f = fopen(getenv("FAKE_CUDA_LOG"), "a");
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  fprintf(f, "%s %d %ld %d %.6f\n", what, arg, (long)syscall(SYS_gettid), (int)getpid(), ts.tv_sec + ts.tv_nsec / 1e9);
  fclose(f);
}
int cuInit(unsigned flags) {
  note("cuInit", (int)flags);
  const char *s = getenv("FAKE_CUDA_INIT_SECONDS");
  if (s) usleep((useconds_t)(atof(s) * 1e6));
  return 0;
}
int cuDeviceGet(int *dev, int ordinal) { note("cuDeviceGet", ordinal); *dev = 100 + ordinal; return 0; }
int cuDevicePrimaryCtxRetain(void **ctx, int dev) { note("cuDevicePrimaryCtxRetain", dev); *ctx = (void *)1; return 0; }
"""

WAITS_FOR_THE_DRIVER = """
    import os, time

    def test_started():
        open(os.environ["OUT"] + "/test-started", "w").write(repr(time.time()))
        deadline = time.monotonic() + 20  # then let the warm-up finish, so that its calls can be checked
        log = os.environ["FAKE_CUDA_LOG"]
        while not (os.path.exists(log) and "Retain" in open(log).read()) and time.monotonic() < deadline:
            time.sleep(0.05)
"""


@pytest.fixture(scope="module")
def fake_driver(tmp_path_factory):
    """The stand-in driver, built once for the tests that load it."""
    cc = next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), None)
    if cc is None:
        pytest.skip("no C compiler (cc, gcc or clang) to build the stand-in driver")
    lib = tmp_path_factory.mktemp("driver")
    (lib / "fake_cuda.c").write_text(FAKE_DRIVER)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib / "libcuda.so.1"), str(lib / "fake_cuda.c")], check=True)
    return lib


def _driver_calls(log: Path) -> list[tuple]:
    if not log.exists():
        return []
    return [(w, int(a), int(tid), int(pid), float(t)) for w, a, tid, pid, t in
            (line.split() for line in log.read_text().splitlines())]


@needs_xdist
def test_a_pinned_cuda_worker_starts_the_driver_in_the_background(suite, fake_driver):
    """cuInit and the primary context of the worker's one GPU (ordinal 0), from a thread that the
    worker does not wait for: the test runs while the (slow, stand-in) cuInit is still busy."""
    out, log = suite.tmp / "out", suite.tmp / "driver.log"
    out.mkdir()
    r = suite(WAITS_FOR_THE_DRIVER, "-n", "1", gpus=2, OUT=str(out), LD_LIBRARY_PATH=str(fake_driver),
              FAKE_CUDA_LOG=str(log), FAKE_CUDA_INIT_SECONDS="3")
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout + r.stderr
    calls = _driver_calls(log)
    assert [(w, a) for w, a, *_ in calls] == [("cuInit", 0), ("cuDeviceGet", 0), ("cuDevicePrimaryCtxRetain", 100)]
    assert all(tid != pid for _, _, tid, pid, _ in calls)  # not the worker's main thread
    assert float((out / "test-started").read_text()) < calls[0][4] + 3  # did not wait for cuInit


@needs_xdist
def test_the_warmup_result_is_in_the_slot_record(suite, fake_driver):
    log, slots = suite.tmp / "driver.log", suite.tmp / "slots"
    r = suite("def test_it():\n    pass\n", "-n", "1", gpus=1, LD_LIBRARY_PATH=str(fake_driver),
              FAKE_CUDA_LOG=str(log), JA_GPU_SLOT_RECORD_DIR=str(slots))
    assert r.returncode == 0, r.stdout + r.stderr
    (rec,) = _records(slots)
    assert {k: rec["warmup"][k] for k in ("cuInit", "context")} == {"cuInit": 0, "context": 0}


@needs_xdist
@pytest.mark.parametrize("env, expected", [
    ({"TF_CUDA_PLATFORM_GPU_DEVICE_SCHEDULE": "spin"}, ["cuInit"]),  # XLA sets its own context flags
    ({"JA_GPU_WARMUP": "0"}, []),
    ({"JA_GPU_SLOT": "0"}, []),                                       # unpinned: which GPU would it be?
    ({"JA_GPU_COUNT": "1", "JA_BACKEND": "rocm"}, []),                # CUDA only
], ids=["xla-context-flags", "switched-off", "unpinned", "rocm"])
def test_the_warmup_steps_aside(suite, fake_driver, env, expected):
    log = suite.tmp / "driver.log"
    r = suite("def test_it():\n    pass\n", "-n", "1", gpus=1, LD_LIBRARY_PATH=str(fake_driver),
              FAKE_CUDA_LOG=str(log), JA_WORKER_FAST_EXIT="0", **env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert [w for w, *_ in _driver_calls(log)] == expected


@needs_xdist
def test_a_missing_driver_is_left_for_jax_to_report(suite):
    slots = suite.tmp / "slots"
    r = suite("def test_it():\n    pass\n", "-n", "1", gpus=1, LD_LIBRARY_PATH=str(suite.tmp),
              JA_GPU_SLOT_RECORD_DIR=str(slots))
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout + r.stderr
    (rec,) = _records(slots)
    assert "libcuda.so.1" in rec["warmup"]["error"]
