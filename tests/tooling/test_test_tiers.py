"""The tier runner: plans derived from the tag-filter table, and real pytest runs of a small tree."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from jatools.testing import gpu_slots, tag_filters, tiers

ROOT = Path(__file__).resolve().parents[2]
CPU = gpu_slots.Gpus("cpu", (), "none")
TWO_CUDA = gpu_slots.Gpus("cuda", ("0", "1"), "nvidia-smi -L: 2 GPUs")


def _plan(tier, platform, gpus, **kw):
    return tiers.plan(tier, platform, gpus, [], env=kw.pop("env", {}), python="py", **kw)


def test_pr_on_the_cpu_is_one_in_process_run_with_the_tables_expression():
    (run,) = _plan("pr", "cpu", CPU)
    assert run.expression == tag_filters.tier_runs("pr", "cpu")[0][2].expression()
    timeout = str(tag_filters.tier_named("pr").timeout_s)
    assert run.argv == ("py", "-m", "pytest", "-m", run.expression, "-p", "pytest_timeout", "--timeout", timeout)
    assert "-n" not in run.argv and not run.exclusive
    (bare,) = _plan("pr", "cpu", CPU, have_timeout_plugin=False)
    assert "--timeout" not in bare.argv


def test_pr_on_a_gpu_host_runs_one_xdist_worker_per_slot():
    (run,) = _plan("pr", "cuda", TWO_CUDA)
    xdist = ("-n", "2", "--dist", "worksteal", "-p", "jatools.testing.pytest_plugin", "--longest-first")
    assert run.argv[-len(xdist):] == xdist and run.config == "single_gpu"
    (run,) = _plan("pr", "cuda", TWO_CUDA, env={"JA_TESTS_PER_GPU": "2"})
    assert ("-n", "4") in zip(run.argv, run.argv[1:])
    (run,) = _plan("pr", "cuda", TWO_CUDA, workers=0)
    assert "-n" not in run.argv and run.env["JA_GPU_SLOT"] == "1"  # one process, pinned itself


def test_a_process_pinned_already_keeps_its_slot():
    """Under python3 -m ci.parallel_gpu_execute (JA_GPU_SLOT=<gpu>:<slot>) the tier neither pins again nor unpins."""
    held = {"JA_GPU_SLOT": "1:0"}
    (single,) = _plan("pr", "cuda", TWO_CUDA, workers=0, env=held)
    (multi,) = _plan("multigpu", "cuda", TWO_CUDA, env=held)
    assert "JA_GPU_SLOT" not in single.env and "JA_GPU_SLOT" not in multi.env


def test_more_workers_than_slots_is_refused_before_anything_runs():
    with pytest.raises(tiers.TierError, match="3 workers but only 2 GPU slots"):
        _plan("pr", "cuda", TWO_CUDA, workers=3)


def test_multigpu_runs_unpinned_exclusive_on_gpus_and_on_forced_cpu_devices():
    (gpu,) = _plan("multigpu", "cuda", TWO_CUDA)
    assert gpu.exclusive and gpu.env["JA_GPU_SLOT"] == "0" and "XLA_FLAGS" not in gpu.env
    (cpu,) = _plan("multigpu", "cpu", CPU, env={"XLA_FLAGS": "--xla_dump_to=/tmp/x"})
    assert cpu.env["XLA_FLAGS"] == "--xla_dump_to=/tmp/x --xla_force_host_platform_device_count=4"
    assert not cpu.exclusive


def test_nightly_on_a_gpu_host_is_the_whole_suite_the_cpu_device_tests_included():
    runs = _plan("nightly", "rocm", gpu_slots.Gpus("rocm", ("0",), "x"))
    assert [(r.kind, r.expression) for r in runs] == [
        ("single", "gpu and not cuda_only and not multigpu"),
        ("host", "not cuda_only and not gpu and not multigpu"),  # the CPU-parameterised cases, slow ones too
        ("multi", "multigpu and not cuda_only")]
    assert [r.kind for r in _plan("nightly", "cpu", CPU)] == ["single", "multi"]  # host == single on the CPU
    assert {r.argv[r.argv.index("--timeout") + 1] for r in runs} == {str(tag_filters.tier_named("nightly").timeout_s)}


def test_retries_only_when_the_plugin_is_there():
    (run,) = _plan("pr", "cuda", TWO_CUDA, reruns=2)
    assert "--reruns" in run.argv
    (run,) = _plan("pr", "cuda", TWO_CUDA, reruns=2, have_rerun_plugin=False)
    assert "--reruns" not in run.argv


def test_only_the_plugins_a_run_uses_are_loaded_unless_autoload_is_asked_for():
    (run,) = _plan("pr", "cuda", TWO_CUDA, reruns=2)
    assert run.env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] == "1"
    assert ("-p", "xdist.plugin") in zip(run.argv, run.argv[1:])
    assert ("-p", "pytest_rerunfailures") in zip(run.argv, run.argv[1:])
    (cpu,) = _plan("pr", "cpu", CPU)
    assert cpu.env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] == "1"
    assert [b for a, b in zip(cpu.argv, cpu.argv[1:]) if a == "-p"] == ["pytest_timeout"]  # no xdist, no retries
    # Autoload asked for (pytest's own switch set to empty): every installed plugin loads, only ours is named.
    (run,) = _plan("pr", "cuda", TWO_CUDA, reruns=2, env={"PYTEST_DISABLE_PLUGIN_AUTOLOAD": ""})
    named = [b for a, b in zip(run.argv, run.argv[1:]) if a == "-p"]
    assert "PYTEST_DISABLE_PLUGIN_AUTOLOAD" not in run.env and named == ["jatools.testing.pytest_plugin"]
    assert "--reruns" in run.argv and "-n" in run.argv
    # Autoload switched off by the caller: kept, and the plugins the run needs are still named.
    (run,) = _plan("pr", "cuda", TWO_CUDA, reruns=2, env={"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "true"})
    assert "PYTEST_DISABLE_PLUGIN_AUTOLOAD" not in run.env
    assert ("-p", "xdist.plugin") in zip(run.argv, run.argv[1:])
    assert ("-p", "pytest_rerunfailures") in zip(run.argv, run.argv[1:])


def test_platform_choice_precedence():
    assert tiers.choose_platform("rocm", {"JA_BACKEND": "cuda"}, CPU)[0] == "rocm"
    assert tiers.choose_platform(None, {"JA_BACKEND": "cuda"}, CPU)[0] == "cuda"
    assert tiers.choose_platform(None, {"JA_BACKEND": "auto"}, TWO_CUDA)[0] == "cuda"
    with pytest.raises(tiers.TierError, match="use one of cpu, cuda, rocm"):
        tiers.choose_platform("tpu", {}, CPU)


TREE = """
    import pytest

    def test_plain():
        pass

    @pytest.mark.slow
    def test_slow():
        pass

    @pytest.mark.gpu
    def test_gpu():
        pass

    @pytest.mark.multigpu(devices=4)
    def test_sharded():
        import jax
        assert len(jax.devices()) == 4
"""


def _tier(tmp_path, *args, tests=TREE, extra_env=None):
    tree = tmp_path / "tree"
    tree.mkdir(exist_ok=True)
    (tree / "pytest.ini").write_text("[pytest]\naddopts = -ra -p no:cacheprovider --strict-markers\nmarkers =\n"
                                     + "".join(f"    {m}: x\n" for m in tag_filters.MARKERS))
    (tree / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text().replace(
        "Path(__file__).resolve().parent.parent", repr(str(ROOT))))
    (tree / "test_tree.py").write_text(textwrap.dedent(tests))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JA_", "XLA_FLAGS", "PYTEST_"))}
    env.update(JA_GPU_COUNT="0", PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    env.update(extra_env or {})
    r = subprocess.run([sys.executable, "-m", "jatools.testing.tiers", "--results-dir", str(tmp_path / "res"),
                        *args, str(tree)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    return r, tmp_path / "res"


def test_nightly_runs_the_single_and_the_multi_device_run(tmp_path):
    pytest.importorskip("jax", reason="the multi-device run asks JAX for its forced CPU devices")
    r, res = _tier(tmp_path, "--tier", "nightly")
    assert r.returncode == 0, r.stdout + r.stderr
    result = json.loads((res / "tier-nightly.json").read_text())
    assert [(x["kind"], x["rc"]) for x in result["runs"]] == [("single", 0), ("multi", 0)]
    assert "2 passed, 2 deselected" in r.stdout  # single: plain + slow; gpu and multigpu deselected
    assert "1 passed, 3 deselected" in r.stdout  # multi: the sharded test on 4 forced CPU devices
    assert result["runs"][0]["flaky"]["tests"] == []


def test_pr_leaves_out_slow_tests(tmp_path):
    r, _ = _tier(tmp_path, "--tier", "pr")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 passed, 3 deselected" in r.stdout


def test_a_failing_test_fails_the_tier_and_every_run_still_runs(tmp_path):
    pytest.importorskip("jax", reason="the multi-device run asks JAX for its forced CPU devices")
    r, res = _tier(tmp_path, "--tier", "nightly", tests=TREE + "\n    def test_bad():\n        assert 0\n")
    assert r.returncode == 1
    result = json.loads((res / "tier-nightly.json").read_text())
    assert [x["rc"] for x in result["runs"]] == [1, 0] and "FAILED (exit 1)" in r.stdout


def test_a_gpu_host_run_loads_xdist_and_retries_itself(tmp_path):
    """The pr tier as a 2-GPU host runs it (stand-in GPU count): xdist workers and retries, no autoload."""
    pytest.importorskip("xdist", reason="pytest-xdist is not installed")
    pytest.importorskip("pytest_rerunfailures", reason="pytest-rerunfailures is not installed")
    flaky = TREE + """
    def test_flaky_once(tmp_path_factory):
        import os, pathlib
        mark = pathlib.Path(os.environ["FLAKY_MARK"])
        if not mark.exists():
            mark.write_text("failed once")
            assert 0, "first attempt fails"
"""
    # The stand-in host has no GPU JAX can see, so the last -m (it wins) selects the CPU tests.
    r, res = _tier(tmp_path, "--tier", "pr", "--platform", "cuda", "--expect-gpus", "0",
                   "-m", "not gpu and not slow and not multigpu", tests=flaky,
                   extra_env={"JA_GPU_COUNT": "2", "JA_GPU_LOCK_DIR": str(tmp_path / "locks"),
                              "FLAKY_MARK": str(tmp_path / "flaky.mark")})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1" in r.stdout and "-p xdist.plugin -n 2" in r.stdout
    assert "created: 2/2 workers" in r.stdout
    flaky_json = json.loads((res / "tier-pr.json").read_text())["runs"][0]["flaky"]
    assert [t["nodeid"].split("::")[-1] for t in flaky_json["tests"]] == ["test_flaky_once"]


def test_unknown_tier_lists_the_valid_ones(tmp_path):
    r, _ = _tier(tmp_path, "--tier", "weekly")
    assert r.returncode == 2 and "valid tiers: pr, nightly, multigpu" in r.stderr


def test_ci_test_sh_takes_the_tier_from_the_environment(tmp_path):
    env = {**{k: v for k, v in os.environ.items() if k != "JA_BACKEND"},  # a CPU host: the tier picks cpu
           "JA_TEST_TIER": "multigpu", "PYTHON": sys.executable, "JA_GPU_COUNT": "0"}
    r = subprocess.run(["bash", str(ROOT / "ci" / "test.sh"), "--dry-run"], env=env, capture_output=True, text=True,
                       check=False)
    assert r.returncode == 0, r.stderr
    assert "--xla_force_host_platform_device_count=4" in r.stdout and "-m 'multigpu and not gpu" in r.stdout
    bad = subprocess.run(["bash", str(ROOT / "ci" / "test.sh")], env={**env, "JA_TEST_TIER": "smoke"},
                         capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and "valid tiers: pr, nightly, multigpu" in bad.stderr


def test_slot_speedup_pinning_check_names_each_problem():
    from jatools.testing.speedup import check_pinning

    good = [{"worker": "gw0", "gpu": "0", "jax_devices": ["cuda:0"]},
            {"worker": "gw1", "gpu": "1", "jax_devices": ["cuda:0"]}]
    assert check_pinning(good, 2) == []
    shared = [{**good[0]}, {**good[1], "gpu": "0"}]
    assert any("shared a GPU" in p for p in check_pinning(shared, 2))
    wide = [{**good[0], "jax_devices": ["cuda:0", "cuda:1"]}, good[1]]
    assert any("saw 2 devices" in p for p in check_pinning(wide, 2))
    assert any("1 worker records for 2 workers" in p for p in check_pinning(good[:1], 2))


def test_slot_speedup_splits_each_run_into_start_tests_and_end():
    from jatools.testing.speedup import phase_summary, phases

    recs = [{"worker": "gw0", "tests": {"count": 3, "first_start": 110.5, "last_end": 118.0}},
            {"worker": "gw1", "tests": {"count": 2, "first_start": 110.7, "last_end": 118.4}},
            {"worker": "gw2", "tests": {"count": 0, "first_start": None, "last_end": None}}]
    assert phases(recs, 108.0, 118.9) == {"start": 2.5, "tests": 7.9, "end": 0.5}
    assert phases(recs[2:], 108.0, 118.9) is None and phases([{"worker": "gw0"}], 1.0, 2.0) is None
    one = {"workers": 1, "phases": {"start": 2.0, "tests": 16.0, "end": 0.5}}
    two = {"workers": 2, "phases": {"start": 2.1, "tests": 8.4, "end": 0.5}}
    s = phase_summary([one, two], 2)
    assert s["median_1_worker"] == one["phases"] and s["median_2_workers"] == two["phases"]
    assert s["test_phase_speedup"] == pytest.approx(16.0 / 8.4, abs=1e-3)
    assert s["wall_speedup_bound"] == pytest.approx(18.5 / 10.5, abs=1e-3)  # start + end stay, tests halve
    assert (s["start_end_1_worker"], s["start_end_2_workers"]) == (2.5, 2.6)
    assert phase_summary([one, {**two, "phases": None}], 2) is None


def test_slot_speedup_gives_each_rounds_own_speedup_in_round_order():
    from jatools.testing.speedup import round_speedups

    timed = [{"round": 2, "workers": 2, "seconds": 10.0}, {"round": 2, "workers": 1, "seconds": 15.0},
             {"round": 1, "workers": 2, "seconds": 9.0}, {"round": 1, "workers": 1, "seconds": 18.0}]
    assert round_speedups(timed, 2) == [2.0, 1.5]


def test_slot_speedup_runs_warm_ups_first_and_leaves_them_out_of_the_medians(tmp_path):
    """The whole measurement on a stand-in 2-GPU host: real pytest runs, real slots, a tiny tree."""
    pytest.importorskip("xdist", reason="pytest-xdist is not installed")
    pytest.importorskip("jax", reason="the workers record the devices JAX showed them")
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider --strict-markers\nmarkers =\n"
                                     + "".join(f"    {m}: x\n" for m in tag_filters.MARKERS))
    (tree / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text().replace(
        "Path(__file__).resolve().parent.parent", repr(str(ROOT))))
    (tree / "test_tree.py").write_text("import pytest\n\n\n@pytest.mark.parametrize('i', range(4))\n"
                                       "def test_sees_jax(i):\n    import jax\n    assert jax.devices()\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JA_", "XLA_", "PYTEST_", "CUDA_"))}
    env.update(JA_GPU_COUNT="2", JA_GPU_LOCK_DIR=str(tmp_path / "locks"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    out = tmp_path / "speedup.json"
    r = subprocess.run([sys.executable, "-m", "jatools.testing.speedup", "--platform", "cuda",
                        "--repeats", "2", "--out", str(out), "-m", "not slow", str(tree)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(out.read_text())
    assert [(x["label"], x["workers"]) for x in res["runs"]] == [
        ("warm-up 1", 2), ("warm-up 1", 1), ("round 1", 2), ("round 1", 1), ("round 2", 2), ("round 2", 1)]
    timed_n = sorted(x["seconds"] for x in res["runs"][2:] if x["workers"] == 2)
    assert res["seconds_2_workers"] == pytest.approx(sum(timed_n) / 2)  # the median of the two timed runs
    assert res["warmup"] == 1 and res["failures"] == []
    assert all(x["counts"] == {"passed": 4} for x in res["runs"])
    gpus = {w["worker"]: w["gpu"] for w in res["runs"][2]["workers_seen"]}
    assert sorted(gpus.values()) == ["0", "1"]  # each worker of the 2-worker run held its own GPU slot
    for x in res["runs"]:  # every test is in some worker's record; start + tests + end is the run's wall time
        assert sum(w["tests"]["count"] for w in x["workers_seen"]) == 4
        ph = x["phases"]
        assert ph["start"] > 0 and ph["tests"] >= 0 and ph["end"] >= 0
        assert ph["start"] + ph["tests"] + ph["end"] == pytest.approx(x["seconds"], abs=0.1)
    assert set(res["phases"]) == {"median_1_worker", "median_2_workers", "start_end_1_worker", "start_end_2_workers",
                                  "test_phase_speedup", "wall_speedup_bound"}
    assert len(res["round_speedups"]) == 2 and all(x > 0 for x in res["round_speedups"])
    assert "test phase (first test started to last ended)" in r.stdout and "each round's own speed-up" in r.stdout
    bad = subprocess.run([sys.executable, "-m", "jatools.testing.speedup", "--repeats", "0"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 2 and "--repeats must be >= 1" in bad.stderr


# --- a GPU run must use its GPUs; failures are classified ------------------------------------------

# A stand-in for what JAX sees on a host with one GPU (this machine has none): the tier's probe,
# the device guards and the tests import it in place of JAX. Only the device view is stood in.
STANDIN_JAX = """
__version__ = "standin"

class Device:
    def __init__(self, platform, i):
        self.platform, self.id = platform, i

    def __str__(self):
        return f"{self.platform}:{self.id}"

def devices(backend=None):
    if backend == "cpu":
        return [Device("cpu", 0)]
    return [Device("gpu", 0)]

def default_backend():
    return "gpu"
"""


def _standin_gpu_host(tmp_path) -> dict:
    site = tmp_path / "standin"
    (site / "jax").mkdir(parents=True)
    (site / "jax" / "__init__.py").write_text(STANDIN_JAX)
    return {"PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]), "JA_GPU_COUNT": "1",
            "JA_GPU_LOCK_DIR": str(tmp_path / "locks")}


def test_a_gpu_host_whose_jax_sees_no_gpu_fails_before_any_test_and_names_the_plugin(tmp_path):
    """The issue's reproduction: a ROCm host (JA_BACKEND=rocm, one GPU) whose JAX has no GPU plugin."""
    pytest.importorskip("jax", reason="the probe asks the real JAX what it sees")
    pytest.importorskip("packaging", reason="the plugin requirements are read with packaging")
    r, res = _tier(tmp_path, "--tier", "pr", extra_env={"JA_BACKEND": "rocm", "JA_GPU_COUNT": "1"})
    assert r.returncode == tiers.EXIT_GPU_UNUSED, r.stdout + r.stderr
    result = json.loads((res / "tier-pr.json").read_text())
    assert result["runs"] == [] and result["gpu"]["expected"] == 1  # no test ran on the wrong devices
    (problem,) = result["gpu"]["problems"]
    plugins = tiers.plugin_requirements("rocm")
    assert "JAX in" in problem and "sees 0" in problem and " ".join(plugins) in problem
    assert "FAILED: GPUs expected but not used" in r.stdout


def test_plugin_requirements_are_the_validation_plugins_at_the_tests_jax_pin(tmp_path):
    pytest.importorskip("packaging", reason="the plugin requirements are read with packaging")
    import tomllib

    py = tomllib.loads((ROOT / "pyproject.toml").read_text())
    jax_pin = next(r for r in py["dependency-groups"]["test"] if isinstance(r, str) and r.startswith("jax=="))
    for platform in ("cuda", "rocm"):
        r, _ = _tier(tmp_path, "--plugin-requirements", "--platform", platform)
        want = [f"{name}=={jax_pin.split('==')[1]}"
                for name in py["tool"]["jax-aiter"][f"validation_plugins_{platform}"]]
        assert r.returncode == 0 and r.stdout.split() == want, r.stderr
    r, _ = _tier(tmp_path, "--plugin-requirements", "--platform", "cpu")
    assert r.returncode == 0 and r.stdout.strip() == ""
    r, _ = _tier(tmp_path, "--plugin-requirements", "--platform", "cuda", "--deps-from", sys.executable)
    assert r.returncode == 0 and r.stdout.strip() == ""  # the given interpreter brings its own plugin


def test_deps_from_runs_pytest_with_that_interpreter_and_refuses_one_without_jax(tmp_path):
    pytest.importorskip("jax", reason="--deps-from needs an interpreter with JAX")
    r, _ = _tier(tmp_path, "--tier", "pr", "--deps-from", sys.executable, "--dry-run")
    assert r.returncode == 0, r.stderr
    assert (f"{sys.executable} -m pytest" in r.stdout
            and f"pytest interpreter: {sys.executable} (--deps-from" in r.stdout)
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    r, _ = _tier(tmp_path, "--tier", "pr", "--deps-from", str(bare / "bin" / "python"), "--dry-run")
    assert r.returncode == 2 and "has no jax/jaxlib installed" in r.stderr


GPU_TREE = """
    import pytest

    def test_plain():
        pass

    @pytest.mark.gpu
    def test_on_gpu():
        pass
"""


def test_gpu_tests_are_counted_per_device_and_a_run_of_none_fails(tmp_path):
    env = _standin_gpu_host(tmp_path)
    r, res = _tier(tmp_path, "--tier", "pr", "--platform", "cuda", "--workers", "1", tests=GPU_TREE, extra_env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    result = json.loads((res / "tier-pr.json").read_text())
    assert result["gpu"]["tests_per_device"] == {"gpu0": 1} and result["gpu"]["problems"] == []
    assert "GPU tests run per device: gpu0: 1" in r.stdout
    # The same host with every GPU test deselected: the run is green by pytest's count, red by the tier's.
    r, res = _tier(tmp_path, "--tier", "pr", "--platform", "cuda", "--workers", "1", "-m", "not gpu",
                   tests=GPU_TREE, extra_env=env)
    assert r.returncode == tiers.EXIT_GPU_UNUSED, r.stdout + r.stderr
    (problem,) = json.loads((res / "tier-pr.json").read_text())["gpu"]["problems"]
    assert "ran 0 GPU tests on a host with 1 GPU(s)" in problem
    r, _ = _tier(tmp_path, "--tier", "pr", "--platform", "cuda", "--workers", "1", "--expect-gpus", "0",
                 "-m", "not gpu", tests=GPU_TREE, extra_env=env)
    assert r.returncode == 0, r.stdout + r.stderr  # on purpose: said on the command line


FAILING_TREE = """
    import os, signal, time

    def test_hangs():
        time.sleep(30)

    def test_out_of_memory():
        raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 8589934592 bytes.")

    def test_crashes_its_worker():
        os.kill(os.getpid(), signal.SIGKILL)

    def test_wrong_answer():
        assert 1 + 1 == 3

    def test_fine():
        pass
"""


def test_each_failure_is_classified_infrastructure_or_test(tmp_path):
    pytest.importorskip("xdist", reason="a worker crash needs pytest-xdist")
    pytest.importorskip("pytest_timeout",
                        reason="the timeout class needs pytest-timeout (pip install -e . --group test)")
    summary = tmp_path / "step-summary.md"
    r, res = _tier(tmp_path, "--tier", "pr", "--workers", "1", "--timeout", "2", tests=FAILING_TREE,
                   extra_env={"GITHUB_STEP_SUMMARY": str(summary)})
    assert r.returncode == 1, r.stdout + r.stderr
    result = json.loads((res / "tier-pr.json").read_text())
    got = {f["nodeid"].split("::")[-1]: (f["class"], f["reason"]) for f in result["runs"][0]["flaky"]["failures"]}
    assert got == {"test_hangs": ("infrastructure", "timeout"),
                   "test_out_of_memory": ("infrastructure", "device lost or out of memory"),
                   "test_crashes_its_worker": ("infrastructure", "worker crash"),
                   "test_wrong_answer": ("test", "test failure")}
    assert result["failure_counts"] == {"infrastructure": 3, "test": 1}
    assert "failures: 3 infrastructure, 1 test" in r.stdout
    assert "**3 infrastructure**, **1 test**" in summary.read_text()


def test_a_collection_error_and_a_lock_wait_are_infrastructure(tmp_path):
    pytest.importorskip("jax", reason="the multi-device run's tests ask JAX for devices")
    r, res = _tier(tmp_path, "--tier", "pr", tests="import not_a_module_anywhere\n\ndef test_x():\n    pass\n")
    assert r.returncode == 2, r.stdout + r.stderr
    result = json.loads((res / "tier-pr.json").read_text())
    (f,) = result["runs"][0]["flaky"]["failures"]
    assert (f["class"], f["reason"]) == ("infrastructure", "collection/import error")
    assert result["failure_counts"] == {"infrastructure": 1, "test": 0}
    # The multigpu tier's exclusive hold of every GPU, while another process holds one: the wait runs out.
    locks = tmp_path / "locks"
    stale = tmp_path / "res" / "flaky-multigpu-multi.json"  # an earlier run's report, with GPU tests in it
    stale.write_text(json.dumps({"device_tests": {"gpu0": 9}, "failure_counts": {"infrastructure": 0, "test": 0}}))
    held = gpu_slots.acquire(gpu_slots.Gpus("cuda", ("0",), "stand-in"), folder=locks, note="another job")
    try:
        r, res = _tier(tmp_path, "--tier", "multigpu", "--platform", "cuda", "--expect-gpus", "0",
                       extra_env={"JA_GPU_COUNT": "1", "JA_GPU_LOCK_DIR": str(locks), "JA_GPU_SLOT_TIMEOUT": "0.5"})
    finally:
        held.release()
    assert r.returncode == gpu_slots.EXIT_NO_SLOT, r.stdout + r.stderr
    result = json.loads((res / "tier-multigpu.json").read_text())
    assert result["runs"][0]["run_failure"]["reason"] == "lock wait exceeded"
    assert result["runs"][0]["flaky"] is None and not stale.exists()  # the stale report counts for nothing
    assert result["failure_counts"] == {"infrastructure": 1, "test": 0}
