"""benchmarks/gpu/model_profile.py reads a profiler trace (XSpace) into a model step's kernel time, busy time and
idle gaps. The traces here are real XSpace files, written by jaxlib's own serializer from a text proto, as
jax.profiler.trace would leave them on a GPU host (no GPU needed)."""
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GEMM, NORM = "gemm_fusion_dot_3", "void ja::rmsnorm_fwd_kernel<ja::bf16_t, false>(JaRmsNormArgs)"


@pytest.fixture(scope="module")
def mp():
    return importlib.import_module("benchmarks.gpu.model_profile")


def _xspace(tmp_path: Path, events: list[tuple], names: tuple[str, ...] = (GEMM, NORM)) -> Path:
    """An XSpace with one GPU stream line of (metadata id, start us, duration us[, CUPTI kernel details])
    events, metadata id i + 1 naming names[i], a derived "XLA Ops" line repeating the first, and a host plane."""
    import jax

    def ev(mid, start, dur, details=None):
        stat = f'stats {{ metadata_id: 7 str_value: "{details}" }}' if details else ""
        return f"events {{ metadata_id: {mid} offset_ps: {start * 1000000} duration_ps: {dur * 1000000} {stat} }}"

    metadata = " ".join(f'event_metadata {{ key: {i + 1} value {{ id: {i + 1} name: "{n}" }} }}'
                        for i, n in enumerate(names))
    text = f"""
planes {{ id: 1 name: "/device:GPU:0"
  lines {{ id: 1 name: "Stream #13(Compute)" timestamp_ns: 0 {' '.join(ev(*e) for e in events)} }}
  lines {{ id: 2 name: "XLA Ops" timestamp_ns: 0 {ev(*events[0])} }}
  {metadata}
  stat_metadata {{ key: 7 value {{ id: 7 name: "kernel_details" }} }}
}}
planes {{ id: 2 name: "/host:CPU" lines {{ id: 1 name: "python" timestamp_ns: 0 {ev(1, 0, 50)} }}
  event_metadata {{ key: 1 value {{ id: 1 name: "host work" }} }} }}
"""
    path = tmp_path / "t.xplane.pb"
    path.write_bytes(jax.profiler.ProfileData.text_proto_to_serialized_xspace(text))
    return path


def test_a_trace_becomes_busy_idle_and_a_median_step(mp, tmp_path):
    # two steps: a 10 us gemm, then a 3 us norm that starts 1 us before the gemm ends (overlap), then 2 us idle
    events = [(1, 0, 10), (2, 9, 3), (1, 14, 10), (2, 23, 3)]
    got = mp.kernels(_xspace(tmp_path, events))
    assert [e["name"] for e in got] == [GEMM, NORM, GEMM, NORM]  # the GPU stream only: no XLA Ops, no host
    s = mp.summarize(got, steps=2)
    assert s["span_us"] == pytest.approx(13.0)        # 0 .. 26 us over two steps
    assert s["busy_us"] == pytest.approx(12.0)        # the union: 12 us a step, not 13
    assert s["idle_us"] == pytest.approx(1.0)         # the 2 us gap between the steps, per step
    assert s["kernels_per_step"] == 2
    assert s["kind_us"] == {"xla": pytest.approx(10.0), "ours": pytest.approx(3.0)}
    assert s["families"] == {"xla gemm_fusion_dot": {"us": pytest.approx(10.0), "per_step": 1.0, "launches": []},
                             "ours ja::rmsnorm_fwd_kernel": {"us": pytest.approx(3.0), "per_step": 1.0, "launches": []}}
    assert [(e["kind"], e["us"], e["gap_us"]) for e in s["sequence"]] == [
        ("xla", pytest.approx(10.0), 0.0), ("ours", pytest.approx(3.0), pytest.approx(-1.0))]


def test_steps_that_differ_have_no_median_sequence(mp, tmp_path):
    s = mp.summarize(mp.kernels(_xspace(tmp_path, [(1, 0, 10), (2, 10, 3), (2, 14, 3), (1, 17, 10)])), steps=2)
    assert "sequence" not in s and s["kernels_per_step"] == 2


def test_names(mp):
    assert mp.family("gemm_fusion_dot_16") == mp.family("gemm_fusion_dot_2") == "gemm_fusion_dot"
    assert mp.family(NORM) == "ja::rmsnorm_fwd_kernel"
    assert mp.kind(NORM) == "ours" and mp.kind("_ZN2ja7mha_gpu17mha_decode_kernel") == "ours"
    assert mp.kind("cudnn_generated_fort_native_sdpa_sm80") == mp.kind("void cudnn::fusion::lean_reduction") == "cudnn"
    assert mp.kind("loop_add_fusion_1") == "xla"


def test_launch_shapes_come_from_cuptis_kernel_details(mp, tmp_path, capsys):
    # cuDNN's decode kernel as CUPTI describes it (two launches of one shape), and a memset without details
    details = "regs:183 static_shared:16 dynamic_shared:86336 grid:8,4,8 block:128,1,1 occ_pct:12.5"
    sdpa = "cudnn_generated_fort_native_sdpa_sm80_flash_fprop_wmma_f16_knob_35_16x128x128_1x4x1_cga1x1x1_kernel0_0"
    events = [(1, 0, 5, details), (2, 6, 5), (1, 12, 5, details), (2, 18, 5)]
    got = mp.kernels(_xspace(tmp_path, events, names=(sdpa, "Memset")))
    shape = "grid 8,4,8 block 128,1,1 regs 183 smem 86352"  # static + dynamic shared memory
    assert [e["launch"] for e in got] == [shape, "", shape, ""]
    s = mp.summarize(got, steps=2)
    assert s["families"][f"cudnn {mp.family(sdpa)}"]["launches"] == [shape]
    assert s["families"]["xla Memset"]["launches"] == []
    assert mp.launch("") == "" and mp.launch("occ_pct:12.5") == ""
    mp.print_table({"workload": "decode", "steps": 2, "models": {"ours": s, "plain": s}})
    rows = [r for r in capsys.readouterr().out.splitlines() if r.endswith(shape)]
    assert len(rows) == 2 and rows[0].split()[:2] == ["ours", "cudnn"] and rows[1].split()[0] == "plain"
