"""Where a model_bench workload's step time goes, kernel by kernel: ours against plain JAX.

    python3 -m benchmarks.gpu.model_profile "decode b8 kv8k" [--steps 16] [--out build/bench/profile]

Each model is compiled and run twice untimed, then `steps` back-to-back steps run inside
jax.profiler.trace (CUPTI, in jaxlib: no Nsight needed), one trace per model. The GPU's kernel events
are read back with jax.profiler.ProfileData. Per step: the span from the first kernel's start to the
last one's end, the GPU's busy time (the union of the kernels' intervals; kernels may overlap, e.g.
under programmatic dependent launch) and its idle time inside the span, and kernel time by kind (ours:
the ja namespace; cuDNN; XLA's fusions and library calls) and by kernel family (the name without
template arguments or XLA's numbering, so the same kernel in two programs is one row), with each family's
launch shapes (grid, block, registers, shared memory: CUPTI's kernel details) for ours and cuDNN's. Where every
step launched the same kernels, the median step is listed kernel by kernel with the idle gap before
each (negative: it started before the previous one ended). Inside XLA's command buffers the kernels
carry no HLO instruction name, so names are what is compared. The JSON (and each model's .xplane.pb,
for TensorBoard or Perfetto) go to --out.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import warnings
from collections import defaultdict
from pathlib import Path

import jax

from benchmarks.gpu import llama, model_bench
from jatools import config

ROOT = Path(__file__).resolve().parents[2]


def launch(details: str) -> str:
    """CUPTI's kernel details ("regs:183 static_shared:0 dynamic_shared:86336 grid:8,4,8 block:128,1,1 ...")
    as a launch shape: "grid 8,4,8 block 128,1,1 regs 183 smem 86336" (static + dynamic shared bytes); ""
    without them (memcpy, memset)."""
    f = dict(kv.split(":", 1) for kv in details.split() if ":" in kv)
    if "grid" not in f:
        return ""
    smem = int(f.get("static_shared", 0)) + int(f.get("dynamic_shared", 0))
    return f"grid {f['grid']} block {f.get('block', '?')} regs {f.get('regs', '?')} smem {smem}"


def kernels(xplane: Path) -> list[dict]:
    """Every kernel (and memcpy/memset) event on the GPU planes, by start: name, start_ns, end_ns, launch."""
    data = jax.profiler.ProfileData.from_file(str(xplane))
    out = []
    with warnings.catch_warnings():  # jaxlib 0.11's event stats iterator warns of its own __module__
        warnings.simplefilter("ignore", DeprecationWarning)
        for plane in data.planes:
            if not plane.name.startswith("/device:GPU:"):
                continue
            for line in plane.lines:
                if line.name.startswith(("XLA", "Launch", "Steps", "Source", "TensorFlow")):
                    continue  # derived lines (ops, modules) repeat the kernels' time
                for ev in line.events:
                    if ev.duration_ns > 0:
                        details = dict(ev.stats).get("kernel_details", "")
                        out.append({"name": ev.name, "start_ns": ev.start_ns, "end_ns": ev.end_ns,
                                    "launch": launch(str(details))})
    return sorted(out, key=lambda k: k["start_ns"])


def stem(workload: str) -> str:
    """A workload's name in the files under --out: spaces as underscores (decode_b8_kv8k)."""
    return workload.replace(" ", "_")


def kind(name: str) -> str:
    """ours (our kernels: the ja namespace), cudnn, or xla (XLA's fusions and library calls)."""
    if "ja::" in name or name.startswith("_ZN2ja"):
        return "ours"
    return "cudnn" if "cudnn" in name.lower() else "xla"


def family(name: str) -> str:
    """A kernel's name without template arguments, parameters or XLA's numbering (gemm_fusion_dot_16 ->
    gemm_fusion_dot): the same kernel in two programs under one name."""
    name = name.split("<")[0].split("(")[0].removeprefix("void ").strip()
    return re.sub(r"(_\d+)+$", "", name)


def summarize(events: list[dict], steps: int) -> dict:
    """Per step: span, busy (union of intervals), idle, kernel count, kernel time per kind and per kernel
    family; and, where every step launched the same kernels, the median step's sequence (kernel, time,
    the idle gap before it)."""
    busy, end = 0.0, None
    for e in events:
        s, t = e["start_ns"], e["end_ns"]
        if end is None or s >= end:
            busy += t - s
            end = t
        elif t > end:
            busy += t - end
            end = t
    span = max(e["end_ns"] for e in events) - events[0]["start_ns"]
    per_kind: dict[str, float] = defaultdict(float)
    per_family: dict[str, list] = defaultdict(lambda: [0.0, 0, set()])
    for e in events:
        d = (e["end_ns"] - e["start_ns"]) / 1e3 / steps
        k = kind(e["name"])
        per_kind[k] += d
        f = per_family[f"{k} {family(e['name'])}"]
        f[0] += d
        f[1] += 1 / steps
        if e.get("launch"):
            f[2].add(e["launch"])
    us = 1e3 * steps
    out = {"span_us": span / us, "busy_us": busy / us, "idle_us": (span - busy) / us,
           "kernels_per_step": len(events) / steps, "kind_us": dict(per_kind),
           "families": {k: {"us": v[0], "per_step": round(v[1], 3), "launches": sorted(v[2])}
                        for k, v in sorted(per_family.items(), key=lambda kv: -kv[1][0])}}
    n = len(events) // steps
    runs = [events[i * n:(i + 1) * n] for i in range(steps)]
    if n * steps == len(events) and all([e["name"] for e in r] == [e["name"] for e in runs[0]] for r in runs):
        seq = []
        for i in range(n):
            gaps = [r[i]["start_ns"] - r[i - 1]["end_ns"] for r in runs] if i else [0.0]
            seq.append({"name": runs[0][i]["name"][:160], "kind": kind(runs[0][i]["name"]),
                        "us": statistics.median(r[i]["end_ns"] - r[i]["start_ns"] for r in runs) / 1e3,
                        "gap_us": statistics.median(gaps) / 1e3})
        out["sequence"] = seq
    return out


def profile(w: model_bench.Workload, steps: int, out: Path) -> dict:
    impl, _ = model_bench.plain_attention(w)
    key = jax.random.key(0)
    params = llama.init_params(w.cfg, jax.random.fold_in(key, 7))
    result = {"workload": w.name, "steps": steps, "plain_attention": impl or "default", "models": {}}
    for name, ops in (("ours", llama.our_ops()), ("plain", llama.plain_ops(impl))):
        step, state, _ = model_bench.build(w, ops, params, key)
        for _ in range(2):
            state = step(state)
        jax.block_until_ready(state)
        with tempfile.TemporaryDirectory() as tmp:
            with jax.profiler.trace(tmp):
                for _ in range(steps):
                    state = step(state)
                jax.block_until_ready(state)
            xplane, = Path(tmp).rglob("*.xplane.pb")
            out.mkdir(parents=True, exist_ok=True)
            kept = out / f"{stem(w.name)}.{name}.xplane.pb"
            kept.write_bytes(xplane.read_bytes())
        events = kernels(kept)
        if not events:
            planes = {pl.name: [ln.name for ln in pl.lines]
                      for pl in jax.profiler.ProfileData.from_file(str(kept)).planes}
            raise SystemExit(f"model_profile: no GPU kernel events in the trace of {name} "
                             f"(planes and lines: {planes}); "
                             "the profiler needs CUPTI (the nvidia-cuda-cupti package of JAX's CUDA plugin)")
        result["models"][name] = summarize(events, steps)
        del step, state
    return result


def print_table(r: dict) -> None:
    o, p = r["models"]["ours"], r["models"]["plain"]
    print(f"{r['workload']}: per step, {r['steps']} steps traced (us)")
    print(f"{'':<40}{'ours':>10}{'plain':>10}{'ours-plain':>12}")
    rows = [(k, o.get(k, 0.0), p.get(k, 0.0)) for k in ("span_us", "busy_us", "idle_us", "kernels_per_step")]
    rows += [(f"kind {k}", o["kind_us"].get(k, 0.0), p["kind_us"].get(k, 0.0))
             for k in sorted(set(o["kind_us"]) | set(p["kind_us"]))]
    fams = sorted(set(o["families"]) | set(p["families"]),
                  key=lambda k: -max(o["families"].get(k, {"us": 0})["us"], p["families"].get(k, {"us": 0})["us"]))
    rows += [((f"{k[:34]} x{o['families'].get(k, {}).get('per_step', 0):g}"
               f"/{p['families'].get(k, {}).get('per_step', 0):g}"),
              o["families"].get(k, {}).get("us", 0.0), p["families"].get(k, {}).get("us", 0.0)) for k in fams]
    for k, a, b in rows:
        print(f"{k:<40}{a:>10.1f}{b:>10.1f}{a - b:>12.1f}")
    print("launch shapes of ours and cuDNN's kernels (grid, block, registers, shared memory bytes)")
    for label, m in (("ours", o), ("plain", p)):
        for k, f in m["families"].items():
            if not k.startswith("xla "):
                for shape in f["launches"]:
                    print(f"  {label:<6}{k[:60]:<62}{shape}")
    for label, m in (("ours", o), ("plain", p)):
        if "sequence" in m:
            print(f"{label}: the median step, kernel by kernel (us: idle gap before it, kernel time)")
            for e in m["sequence"]:
                print(f"  {e['gap_us']:>6.2f} {e['us']:>8.2f}  {e['kind']:<6}{e['name'][:90]}")


def main(argv: list[str]) -> int:
    names = {w.name: w for w in model_bench.WORKLOADS}
    ap = argparse.ArgumentParser(prog="python3 -m benchmarks.gpu.model_profile", description=__doc__.splitlines()[0])
    ap.add_argument("workload", choices=names)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--out", type=Path, default=ROOT / config.build_path("bench") / "profile")
    a = ap.parse_args(argv)
    r = profile(names[a.workload], a.steps, a.out)
    (a.out / f"{stem(a.workload)}.json").write_text(json.dumps(r, indent=1))
    print_table(r)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
