"""Start the CUDA driver of a pinned process in the background, before JAX asks for it.

A fresh process's first GPU use spends about 0.3 s (H200 host) in two driver
calls: cuInit, then creating the device's primary context, the context XLA
retains for its client. In a pinned pytest worker that time used to sit
between collection and the first test. The GPU-slot plugin calls start() as
soon as the worker holds its slot (CUDA_VISIBLE_DEVICES already names its
GPU): a daemon thread makes the same two calls through ctypes, which releases
the GIL while the driver works, so they overlap the worker's import of JAX and
the test modules. When JAX starts its backend it finds the driver up and
retains the existing context.

- CUDA only; on ROCm nothing is started (not checked on AMD hardware).
- Same context flags as XLA: XLA creates the primary context with the flags
  named by TF_CUDA_PLATFORM_GPU_DEVICE_SCHEDULE (none by default) and logs an
  error if it finds it already active with others. With that variable set,
  only cuInit runs here.
- Failures are recorded, never raised: when the driver is missing or broken,
  JAX reports it in its own words as it starts.
- The thread's reference to the context is never released; the driver frees
  the context when the process ends.
- JA_GPU_WARMUP=0 turns it off.
"""
from __future__ import annotations

import ctypes
import threading
import time

SWITCH_ENV = "JA_GPU_WARMUP"
SCHEDULE_ENV = "TF_CUDA_PLATFORM_GPU_DEVICE_SCHEDULE"  # XLA's context-flags switch
DRIVER = "libcuda.so.1"

_result: dict = {}
_thread: threading.Thread | None = None


def wanted(platform: str, env: dict[str, str]) -> bool:
    return platform == "cuda" and env.get(SWITCH_ENV, "1") != "0"


def _warm(with_context: bool) -> None:
    start = time.monotonic()
    try:
        cuda = ctypes.CDLL(DRIVER)
    except OSError as e:
        _result.update(error=str(e))
        return
    rc = cuda.cuInit(0)
    _result["cuInit"] = rc
    if rc == 0 and with_context:
        device, ctx = ctypes.c_int(), ctypes.c_void_p()
        rc = cuda.cuDeviceGet(ctypes.byref(device), 0)  # ordinal 0: the one GPU the slot shows
        _result["context"] = rc if rc else cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), device)
    _result["seconds"] = round(time.monotonic() - start, 3)


def start(platform: str, env: dict[str, str]) -> bool:
    """Start the warm-up thread for a process pinned to one GPU of `platform`; False if not wanted."""
    global _thread
    if _thread is not None or not wanted(platform, env):
        return False
    _thread = threading.Thread(target=_warm, args=(not env.get(SCHEDULE_ENV),), name="ja-cuda-warmup", daemon=True)
    _thread.start()
    return True


def result() -> dict | None:
    """What the warm-up did (driver return codes, seconds), once it has finished; None if it never started."""
    if _thread is None:
        return None
    return dict(_result) if not _thread.is_alive() else {"running": True}
