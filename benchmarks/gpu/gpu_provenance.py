"""The GPU's provenance for bench_gpu.py's JSON, read by nvidia-smi before and after a run."""
from __future__ import annotations

import os
import subprocess
import time

# nvidia-smi --query-gpu fields recorded before and after the run: two runs compare
# honestly only on the same driver, clocks, power limit and ECC mode, with the GPU to
# themselves (the compute-apps list shows anyone else's processes on it).
GPU_FIELDS = ("name", "uuid", "pci.bus_id", "driver_version", "vbios_version", "persistence_mode",
              "ecc.mode.current", "power.limit", "power.default_limit", "power.max_limit", "power.draw",
              "clocks.sm", "clocks.mem", "clocks.max.sm", "clocks.max.mem", "clocks.applications.graphics",
              "clocks.applications.memory", "clocks_event_reasons.active", "temperature.gpu",
              "memory.total", "memory.used", "utilization.gpu", "compute_mode", "mig.mode.current")


def _smi(args: list[str]) -> tuple[list[list[str]], str | None]:
    """Rows of `nvidia-smi ARGS --format=csv,noheader,nounits`, or ([], why) when it cannot run."""
    try:
        proc = subprocess.run(["nvidia-smi", *args, "--format=csv,noheader,nounits"], capture_output=True,
                              text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return [], f"nvidia-smi: {e}"
    if proc.returncode != 0:
        return [], f"nvidia-smi {' '.join(args)}: exit {proc.returncode}: {(proc.stderr or proc.stdout).strip()[:300]}"
    return [[c.strip() for c in line.split(",")] for line in proc.stdout.splitlines() if line.strip()], None


def gpu_provenance() -> dict:
    """Driver, clocks, power limit, ECC, and every process using a GPU, read by nvidia-smi.

    A field the driver does not know is retried alone and listed under "unsupported";
    on a host without nvidia-smi (ROCm) the reason is recorded instead.
    """
    out: dict = {"read_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    fields = list(GPU_FIELDS)
    rows, err = _smi([f"--query-gpu={','.join(fields)}"])
    if err:  # an older driver rejects a field it does not know: query one at a time, keep what answers
        rows, fields, unsupported = [], [], []
        for f in GPU_FIELDS:
            r, e = _smi([f"--query-gpu={f}"])
            if e:
                unsupported.append(f)
                continue
            fields.append(f)
            for i, row in enumerate(r):
                rows.extend([] for _ in range(i + 1 - len(rows)))
                rows[i].append(row[0])
        if not fields:
            return {**out, "error": err}
        out["unsupported"] = unsupported
    out["gpus"] = [dict(zip(fields, row)) for row in rows]
    apps, err = _smi(["--query-compute-apps=gpu_uuid,pid,process_name,used_memory"])
    own = str(os.getpid())
    out["compute_apps"] = [{"gpu_uuid": a[0], "pid": a[1], "process_name": a[2], "used_memory_MiB": a[3],
                            "this_benchmark": a[1] == own} for a in apps if len(a) >= 4]
    out["other_processes"] = sum(1 for a in out["compute_apps"] if not a["this_benchmark"])
    if err:
        out["compute_apps_error"] = err
    return out


def build_provenance() -> dict:
    """What a run timed: every native library the loader would load (as `python -m jax_aiter info --verify` checks
    it) with its sha256, and the identity of the build that wrote the JIT libraries (an installed wheel's, else the
    build record beside them: kernel source revision, whether the tree was dirty, toolchain). Two runs' times of
    one kernel compare only when they timed the same bytes; a slowdown across runs of one device is put on a
    build, or ruled out, from this."""
    from pathlib import Path

    from jax_aiter import _loader, integrity

    libraries = _loader.library_report(verify=True)  # each row found carries the sha256 it was verified by
    identity, source = _loader.build_identity(), "installed wheel"
    if identity is None:  # a checkout: the first record beside a library that names its build
        source = "no build record names one"
        for folder in dict.fromkeys(Path(r["path"]).parent for r in libraries if r["path"]):
            if found := _loader.record_identity(folder):
                identity, source = found, str(folder / integrity.RECORD_NAME)
                break
    return {"libraries": libraries, "identity": identity, "identity_from": source}
