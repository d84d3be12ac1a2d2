"""pytest plugin: each xdist worker takes a GPU slot before JAX is imported.

A worker (PYTEST_XDIST_WORKER set) takes the first free (gpu, slot) lock from
jatools.testing.gpu_slots in pytest_configure, which runs before test modules are
collected and so before JAX starts, and pins itself to that GPU through the
environment. N workers thus spread over the GPUs, slot 0 on every GPU first.
The lock is held until the worker exits.

Switches: JA_GPU_SLOT=0 never pins (the multigpu tier runs unpinned and
exclusive); JA_GPU_SLOT=1 pins a run without xdist too; a process already
pinned by ci/parallel_gpu_execute.py (JA_GPU_SLOT_HELD set) is left alone.
JA_GPU_SLOT_RECORD_DIR: each pinned process writes <worker>.json there (its
slot, the devices JAX saw, and when its first test started and its last one
ended), which the slot speed-up measurement checks and splits its times by.

A pinned worker also gets gpu_slots.pinned_env's process settings: no GPU
memory preallocation and one BLAS thread (each unless already set). On CUDA it
then starts the driver and its GPU's primary context in a background thread
(jatools.testing.cuda_warmup; JA_GPU_WARMUP=0 turns that off), overlapping JAX's import.

A pinned xdist worker ends without tearing its GPU backend down, as soon as
it has reported everything: at the end of its pytest_unconfigure (the last
hook; xdist has sent the controller "workerfinished" before it), it runs
every exit handler except JAX's backend clean-up, then ends at once
(os._exit). It does not wait for the controller to tell it to stop, and it
skips destroying hundreds of loaded executables and the CUDA context, pytest's
last clean-ups, execnet's shut-down and interpreter finalization: about a
second, later half a second, that the controller used to wait for. The
driver releases the same resources when the process ends.
JA_WORKER_FAST_EXIT=0 keeps the full teardown (to look for leaks or errors
at exit). A worker's exit status is not read: xdist takes the results from
the worker's messages, and one that ends after "workerfinished" is not a
crash to it.
"""
from __future__ import annotations

import atexit
import json
import os
import sys
import time
from pathlib import Path

import pytest

from jatools import atomic_write
from jatools.testing import cuda_warmup, gpu_slots

SWITCH_ENV = "JA_GPU_SLOT"
RECORD_ENV = "JA_GPU_SLOT_RECORD_DIR"
FAST_EXIT_ENV = "JA_WORKER_FAST_EXIT"

_held: gpu_slots.Slot | None = None
_tests = {"count": 0, "first_start": None, "last_end": None}  # wall clock (time.time), for the record


def _wants_slot(env: dict[str, str]) -> bool:
    switch = env.get(SWITCH_ENV, "")
    if switch == "0" or env.get(gpu_slots.HELD_ENV):
        return False
    return switch == "1" or bool(env.get("PYTEST_XDIST_WORKER"))


def _jax_backends_started() -> bool:
    """True once JAX has initialised a backend (reading the visible devices then).

    Importing JAX alone is harmless: some images' pytest plugins (jaxtyping,
    chex) import it at start-up, before this hook runs.
    """
    bridge = sys.modules.get("jax._src.xla_bridge")
    return bool(getattr(bridge, "_backends", None))


def pytest_configure(config: pytest.Config) -> None:
    global _held
    if not _wants_slot(dict(os.environ)):
        return
    try:
        gpus = gpu_slots.detect()
        per_gpu, timeout = gpu_slots.tests_per_gpu(), gpu_slots.timeout_from_env()
    except ValueError as e:  # a broken GPU probe, a bad pool or setting: say so, no traceback
        raise pytest.UsageError(f"jatools.testing.pytest_gpu_slot: {e}") from None
    if gpus.count == 0:
        return  # nothing to pin; the gpu-marked tests skip with their reason
    if _jax_backends_started():
        raise pytest.UsageError(
            "jatools.testing.pytest_gpu_slot: JAX started its backends before this worker took its GPU slot, so "
            "the worker could see every GPU; create no arrays and query no devices in conftest.py or "
            "plugins")
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    try:
        _held = gpu_slots.acquire(gpus, per_gpu, timeout=timeout, note=f"pid {os.getpid()}: pytest worker {worker}")
    except (gpu_slots.SlotTimeout, gpu_slots.GpuSlotError) as e:
        raise pytest.UsageError(f"jatools.testing.pytest_gpu_slot ({worker}): {e}") from e
    # pinned_env is this environment with the slot's settings applied (and what they
    # replace removed): make it this process's own, before anything imports JAX or NumPy.
    pinned = gpu_slots.pinned_env(_held, per_gpu)
    for key in set(os.environ) - set(pinned):
        del os.environ[key]
    os.environ.update(pinned)
    cuda_warmup.start(_held.platform, pinned)
    if "numpy" in sys.modules:
        config.issue_config_time_warning(pytest.PytestConfigWarning(
            f"jatools.testing.pytest_gpu_slot ({worker}): NumPy was imported before this worker took its GPU slot, so "
            f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')} does not reach its BLAS; import "
            "NumPy inside tests or fixtures, not in conftest.py or plugins"), stacklevel=2)


def _record(worker: str) -> None:
    folder = os.environ.get(RECORD_ENV)
    if not folder or _held is None:
        return
    rec = {"worker": worker, "pid": os.getpid(), "platform": _held.platform, "gpu": _held.gpu,
           "slot": _held.slot, "env": {k: os.environ.get(k) for k in
                                       ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")},
           "warmup": cuda_warmup.result(), "tests": dict(_tests)}
    if "jax" in sys.modules:  # only report what the tests already initialised
        jax = sys.modules["jax"]
        rec["jax_devices"] = [str(d) for d in jax.devices()]
    atomic_write.write_text(Path(folder) / f"{worker}.json", json.dumps(rec, indent=1))


def _exit_without_backend_teardown() -> None:
    """Run the exit handlers (JAX's clean-up excepted), flush, and end the process now."""
    api = sys.modules.get("jax._src.api")
    if api is not None and callable(getattr(api, "clean_up", None)):
        atexit.unregister(api.clean_up)
    atexit._run_exitfuncs()  # every remaining handler, in the order a normal exit runs them
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(0)


def pytest_runtest_logstart(nodeid: str, location: tuple) -> None:
    if _tests["first_start"] is None:
        _tests["first_start"] = time.time()


def pytest_runtest_logfinish(nodeid: str, location: tuple) -> None:
    _tests["count"] += 1
    _tests["last_end"] = time.time()


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    global _held
    if _held is not None:
        worker = os.environ.get("PYTEST_XDIST_WORKER")
        _record(worker or "main")
        _held.release()
        _held = None
        if worker and os.environ.get(FAST_EXIT_ENV, "1") != "0" and hasattr(atexit, "_run_exitfuncs"):
            _exit_without_backend_teardown()
