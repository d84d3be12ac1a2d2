"""The tooling benchmarks, one function each, registered in BENCHMARKS (at the end) in the issues' order.

Each times our code path against the reference's command (the anchor) on the
same data and returns a harness.Result; docs/benchmarks.md has the table.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from jatools import config
from jatools.bench.corpus import Corpus, ensure_corpus, link_tree, write_record
from jatools.bench.harness import (
    AnchorMissing,
    Context,
    Result,
    Timings,
    require,
    run_command,
    timed,
)
from jatools.jitlibs import publish
from jatools.jitlibs import record as jit_record
from jatools.native import jit_build
from jatools.validate import cleanroom_env, wheelhouse
from jatools.wheel import wheel_build
from jatools.wheel.wheel_layout import Layout
from jax_aiter import remedies
from jax_aiter.download import release, transfer
from jax_aiter.integrity import RECORD_NAME, file_entry


def corpus_of(ctx: Context, scale: float | None = None) -> Corpus:
    """The corpus at the run's scale (or `scale`), generated once and cached under the run's bench folder."""
    return ensure_corpus(ctx.corpus_root, ctx.scale if scale is None else scale, ctx.log)


def measured(name: str, t: Timings, met: bool, nbytes: int, shortfall: list[str], **kw) -> Result:
    """The Result of an alternated benchmark: its medians and every run's time, its goal from BENCHMARKS."""
    return Result(name, t.ours_s, t.anchor_s, BENCHMARKS[name].goal, met, nbytes, shortfall="; ".join(shortfall),
                  runs=t.runs, **kw)


def clear(*paths: Path) -> None:
    """Remove each folder, if it is there (a benchmark's previous output)."""
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


def single_core_rate(seconds: float = 1.0) -> float:
    """Bytes per second of one core hashing with hashlib's sha256 (OpenSSL) from memory."""
    buf = os.urandom(64 << 20)
    h = hashlib.sha256()
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        h.update(buf)
        n += len(buf)
    return n / (time.perf_counter() - start)


def bench_verify(ctx: Context) -> Result:
    """verify: sha256 of the three libraries (page cache warm) by `invoke verify`'s code path
    (jatools.jitlibs.record.verify) against `sha256sum` (what the reference's wheel script runs)."""
    require("sha256sum")
    c = corpus_of(ctx)
    folder = ctx.work("verify")
    paths = link_tree(c, folder)
    want = {f["name"]: f["sha256"] for f in write_record(folder, c, {"cache_id": "bench"})["files"]}
    out = run_command(["sha256sum", *map(str, paths)])  # warms the page cache and checks the anchor agrees
    got = {line.split()[1].rsplit("/", 1)[1]: line.split()[0] for line in out.stdout.splitlines()}
    if got != want:
        raise RuntimeError(f"sha256sum disagrees with the record: {got} vs {want}")
    rate_before = single_core_rate()
    t = ctx.alternate("verify", lambda: jit_record.verify(folder), lambda: run_command(["sha256sum", *map(str, paths)]))
    rate = (rate_before + single_core_rate()) / 2
    cores = os.cpu_count() or 1
    ours_rate = c.total_bytes / t.ours_s
    share = ours_rate / (cores * rate)
    # sha256 is sequential within a file: the largest file bounds the wall time on any number of cores
    bound = c.total_bytes / max(c.total_bytes / cores, max(c.files.values())) / cores
    speedup = t.anchor_s / t.ours_s
    short = []
    if speedup < 8:
        short.append(f"{speedup:.2f}x of the 8x goal: with {cores} cores and one file per thread the ceiling over a "
                     f"single-threaded sha256sum is about {cores * rate / (c.total_bytes / t.anchor_s):.2f}x "
                     f"(cores x the 1-core rate / sha256sum's rate)")
    if share < 0.8:
        short.append(f"{100 * share:.0f}% of cores x 1-core rate, goal 80%; per-file hashing bounds it at "
                     f"{100 * bound:.0f}% here (the largest file is one thread's work)")
    return measured("verify", t, speedup >= 8 and share >= 0.8, c.total_bytes, short,
                    ours="jatools.jitlibs.record.verify(folder) (invoke verify)", anchor="sha256sum <3 files>",
                    extra={"single_core_sha256_Bps": rate, "ours_Bps": ours_rate,
                           "anchor_Bps": c.total_bytes / t.anchor_s, "share_of_cores_x_rate": share,
                           "ceiling_share": bound})


def corpus_build(ctx: Context, name: str, scale: float) -> tuple[Corpus, Path, dict, dict, config.Settings]:
    """(corpus, jit_dir, identity, build record, settings): the corpus of `scale` as a build folder of `name`'s work,
    with this checkout's identity (CPU backend): what a real publish would carry."""
    c = corpus_of(ctx, scale)
    jit_dir = ctx.work(name) / config.BUILD_TREE["jit"]
    link_tree(c, jit_dir)
    settings = ctx.settings()
    ident = jit_build.checkout_identity(settings)[0]
    return c, jit_dir, ident, write_record(jit_dir, c, ident), settings


def bench_publish(ctx: Context) -> Result:
    """publish: compression plus round-trip verification by `invoke jit.publish`'s code path
    (jatools.jitlibs.publish.stage: zstd with the project's level/window, split, decompress and re-hash)
    against `zstd -19 --long=27` (the reference's producer), on a corpus of 1/10 scale."""
    require("zstd")
    scale = ctx.scale * ctx.publish_fraction
    c, jit_dir, ident, record, settings = corpus_build(ctx, "publish", scale)
    work = ctx.work("publish")
    comp = publish.Compression.from_settings(settings, level=ctx.publish_level)
    limit = int(settings.raw["jit_libs_asset_limit"])
    stage_root, anchor_out = work / "stage", work / "anchor"
    summary: dict = {}

    def prepare() -> None:
        clear(stage_root, anchor_out)
        anchor_out.mkdir(parents=True)

    def ours() -> None:
        manifest, _ = publish.stage(record, ident, jit_dir, stage_root, comp, limit, lambda m: None)
        summary["ours_bytes"] = sum(f["compressed"]["size"] for f in manifest["files"])

    def anchor() -> None:
        for p in c.paths:
            run_command(["zstd", "-19", f"--long={comp.window_log}", "-q", "-f", str(p), "-o",
                         str(anchor_out / (p.name + ".zst"))])
        summary["anchor_bytes"] = sum(f.stat().st_size for f in anchor_out.iterdir())

    t = ctx.alternate("publish", ours, anchor, prepare=prepare)
    share = t.ours_s / t.anchor_s
    size_ratio = summary["ours_bytes"] / summary["anchor_bytes"]
    short = []
    if share > 0.10:
        short.append(f"ours takes {100 * share:.0f}% of the anchor's time (goal 10%, {share / 0.10:.1f}x over) at "
                     f"level {comp.level} with window_log {comp.window_log}: with long-distance matching zstd "
                     "cuts each file into jobs of a few tens of MB on all cores, so the level decides the time; "
                     "weigh a lower one with --publish-level N")
    if size_ratio > 1.15:
        short.append(f"compressed size {size_ratio:.3f}x the anchor's (goal 1.15x)")
    return measured("publish", t, share <= 0.10 and size_ratio <= 1.15, c.total_bytes, short,
                    ours=f"jatools.jitlibs.publish.stage (zstd level {comp.level}, window_log {comp.window_log}, LDM, "
                         "all cores; then decompress + sha256)",
                    anchor=f"zstd -19 --long={comp.window_log} per file",
                    extra={"corpus_scale": scale, "ours_compressed_bytes": summary["ours_bytes"],
                           "anchor_compressed_bytes": summary["anchor_bytes"], "size_ratio": size_ratio,
                           "time_share": share, "level": comp.level, "window_log": comp.window_log})


FETCH_STAGE_LEVEL = 3


@contextlib.contextmanager
def http_server(folder: Path):
    """`python -m http.server` on 127.0.0.1 serving `folder` (its own process: no GIL shared with the client
    being timed); yields its base URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "--directory", str(folder),
                             str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                urllib.request.urlopen(url + "/", timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        else:
            raise RuntimeError(f"the benchmark's HTTP server on port {port} did not answer")
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def bench_fetch(ctx: Context) -> Result:
    """fetch: download (http_server), decompress, verify and install the published assets by the fetch client
    (jax_aiter.download.release.fetch_release) against `curl` + `zstd -d` + `sha256sum -c` in sequence. The release is
    staged at FETCH_STAGE_LEVEL: decompression hardly depends on the level, and 19 would take minutes."""
    require("curl", "zstd", "sha256sum")
    work = ctx.work("fetch")
    serve = work / "serve"
    _, jit_dir, ident, record, settings = corpus_build(ctx, "fetch", ctx.scale)
    comp = publish.Compression(level=FETCH_STAGE_LEVEL, window_log=int(settings.raw["jit_libs_zstd_window_log"]))
    manifest, _ = publish.stage(record, ident, jit_dir, serve, comp, int(settings.raw["jit_libs_asset_limit"]),
                                ctx.log)  # into serve/<tag>/ (reused when complete)
    tag, window_log = manifest["release_tag"], manifest["compression"]["window_log"]
    dest, anchor_dir = work / "dest", work / "anchor"
    sums = work / "SHA256SUMS"
    sums.write_text("".join(f"{f['sha256']}  {f['name']}\n" for f in manifest["files"]))
    opts = transfer.FetchOptions(progress=False)

    def prepare() -> None:
        clear(dest, anchor_dir)
        (anchor_dir / "dl").mkdir(parents=True)
        (anchor_dir / "lib").mkdir()

    with http_server(serve) as base:
        script = ["set -e", *(f"curl -sSf -o dl/{f['compressed']['name']} {base}/{tag}/{f['compressed']['name']}"
                              for f in manifest["files"]),
                  *(f"zstd -d -q --long={window_log} dl/{f['compressed']['name']} -o lib/{f['name']}"
                    for f in manifest["files"]),
                  f"cd lib && sha256sum -c --quiet {sums}"]
        t = ctx.alternate("fetch", lambda: release.fetch_release(base, ident, dest, opts=opts, log=lambda m: None),
                          lambda: run_command(["bash", "-c", "\n".join(script)], cwd=anchor_dir), prepare=prepare)
    speedup = t.anchor_s / t.ours_s
    short = []
    if speedup < 2:
        short.append(f"{speedup:.2f}x of the 2x goal: ours streams each download through zstd and sha256 (of the "
                     "parts and of the library) into the library file and fsyncs it, files in parallel; the cores "
                     f"bound it ({os.cpu_count()}, shared with the HTTP server), the anchor is bounded by curl, "
                     "zstd -d and sha256sum one after another")
    return measured("fetch", t, speedup >= 2, sum(f["size"] for f in manifest["files"]), short,
                    ours=f"jax_aiter.download.release.fetch_release ({remedies.door('jit_fetch')})",
                    anchor="curl; zstd -d --long; sha256sum -c (in sequence)",
                    extra={"compressed_bytes": sum(f["compressed"]["size"] for f in manifest["files"]),
                           "stage_level": FETCH_STAGE_LEVEL, "window_log": window_log})


WHEEL_EPOCH = 1700000000


def inflated_build(ctx: Context, build: Path) -> None:
    """build/ of this checkout under `build`: the corpus appended to each JIT library (still a valid ELF file,
    whose symbol floor is measured as before) with a build record for them; the other libraries hard links."""
    src = ctx.settings().build_dir
    layout = Layout.load()
    missing = [str(src / spec.dir / name) for name, spec in layout.libraries.items()
               if not (src / spec.dir / name).is_file()]
    if missing:
        raise AnchorMissing(f"the native CPU build is missing {', '.join(missing)}; build it with "
                            f"`export JA_BACKEND=cpu; {remedies.door('native')}`")
    c = corpus_of(ctx)
    record_src = (src / config.BUILD_TREE["jit"] / RECORD_NAME).read_text()
    stamp = build / "inflated.json"
    key = f"{c.folder}:{sorted(c.files.items())}:{hash(record_src)}"
    if stamp.is_file() and stamp.read_text() == key:
        return
    shutil.rmtree(build, ignore_errors=True)
    record = json.loads(record_src)
    for name, spec in layout.libraries.items():
        dst = build / spec.dir / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        if spec.kind != "jit":
            os.link(src / spec.dir / name, dst)
            continue
        with open(dst, "wb") as out:
            out.write((src / spec.dir / name).read_bytes())
            with open(c.folder / name, "rb") as filler:
                shutil.copyfileobj(filler, out, 16 << 20)
        entry = file_entry(dst)
        record["files"] = [entry if f["name"] == name else f for f in record["files"]]
        record["modules"][spec.module]["file"] = entry
    (build / config.BUILD_TREE["jit"] / RECORD_NAME).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    # The umbrella and shims are hard links of the linked files, so make's record of them holds as it is.
    umbrella = config.BUILD_TREE["umbrella"]
    os.link(src / umbrella / RECORD_NAME, build / umbrella / RECORD_NAME)
    stamp.write_text(key)


def bench_wheel_full(ctx: Context) -> Result:
    """wheel_full: building the full wheel by jatools.wheel.wheel_build (`nox -s wheel_full`) against
    `pip wheel <stage> --no-deps --no-build-isolation` (the reference's route) on the same staged tree, of
    production sizes without the production build (inflated_build)."""
    for module in ("pip", "setuptools"):
        if importlib.util.find_spec(module) is None:
            raise AnchorMissing(f"{module} is not installed, so `pip wheel` cannot run (install it with "
                                f"`python -m ensurepip` / `pip install {module}`; it is in the bench extra)")
    work = ctx.work("wheel_full")
    build = work / "build"
    inflated_build(ctx, build)
    settings = ctx.settings(JA_BUILD_DIR=str(build))
    ours_dist, anchor_dist = work / "dist-ours", work / "dist-anchor"
    stage = settings.path("wheel_stage") / "full"
    sizes: dict[str, int] = {}
    phases: list[dict] = []  # wheel_build's own phase times (verify, stage, pack, read_back) per run

    def ours() -> None:
        r = wheel_build.build(settings, wheel_build.BuildOptions(variant="full", dist_dir=ours_dist,
                                                                 source_date_epoch=WHEEL_EPOCH))
        sizes["ours"], sizes["in"] = r.wheel.stat().st_size, r.bytes_in
        phases.append({k: round(v, 2) for k, v in r.seconds.items()})

    def anchor() -> None:
        if not stage.is_dir():
            raise RuntimeError(f"{stage} is missing: ours stages it first")
        run_command([sys.executable, "-m", "pip", "wheel", str(stage), "--no-deps", "--no-build-isolation", "-q",
                     "-w", str(anchor_dist)], env={**os.environ, "SOURCE_DATE_EPOCH": str(WHEEL_EPOCH)})
        sizes["anchor"] = next(anchor_dist.glob("*.whl")).stat().st_size

    t = ctx.alternate("wheel_full", ours, anchor,
                      prepare=lambda: clear(ours_dist, anchor_dist, stage / "build", *stage.glob("*.egg-info")))
    speedup = t.anchor_s / t.ours_s
    size_ratio = sizes["ours"] / sizes["anchor"]
    short = []
    if speedup < 2:
        pack = sorted(p["pack"] for p in phases)[len(phases) // 2]
        short.append(f"{speedup:.2f}x of the 2x goal: deflate (level {settings.raw.get('wheel_compress_level', 6)}) "
                     f"of the JIT libraries is {pack:.1f} s of ours' {t.ours_s:.1f} s (pack phase); it runs on "
                     f"{os.cpu_count()} cores against the anchor's one, and ours also verifies the libraries and "
                     "reads the wheel back")
    if size_ratio > 1.05:
        short.append(f"size {size_ratio:.3f}x the anchor's (goal 1.05x)")
    return measured("wheel_full", t, speedup >= 2 and size_ratio <= 1.05, sizes["in"], short,
                    ours="jatools.wheel.wheel_build.build(variant=full) (nox -s wheel_full)",
                    anchor="pip wheel <stage> --no-deps --no-build-isolation",
                    extra={"ours_wheel_bytes": sizes["ours"], "anchor_wheel_bytes": sizes["anchor"],
                           "size_ratio": size_ratio, "ours_phases_s": phases})


NOOP_LIMIT_S = 1.5


def bench_noop(ctx: Context) -> Result:
    """noop: `nox -s ja_mods` when everything is up to date, reported next to `make ja_mods` alone (what is
    over `make` is nox's own start-up)."""
    require("make")
    beside = Path(sys.executable).with_name("nox")  # nox from PATH (the bench venv has it), else beside Python
    nox = ["nox"] if shutil.which("nox") else [str(beside)] if beside.is_file() else None
    if nox is None:
        raise AnchorMissing("nox is not installed (install it with `pip install nox`)")
    env = {**os.environ, "JA_BACKEND": os.environ.get("JA_BACKEND", "cpu")}
    run_command(["make", "-j2", "ja_mods"], cwd=ctx.root, env=env)  # up to date before timing (not timed)
    t = ctx.alternate("noop", lambda: run_command([*nox, "-s", "ja_mods"], cwd=ctx.root, env=env),
                      lambda: run_command(["make", "ja_mods"], cwd=ctx.root, env=env), runs=max(ctx.runs, 5))
    met = t.ours_s <= NOOP_LIMIT_S
    short = [] if met else [(f"{t.ours_s:.2f} s, {t.ours_s - NOOP_LIMIT_S:.2f} s over the 1.5 s goal; `make "
                             f"ja_mods` alone takes {t.anchor_s:.2f} s, the rest is nox's start-up (Python, plugins, "
                             "noxfile import)")]
    return measured("noop", t, met, 0, short, ours="nox -s ja_mods (up to date)",
                    anchor="make ja_mods (alone, for reference)", extra={"nox": " ".join(nox)})


INCREMENTAL_MODULE = "rmsnorm_fwd"


def instance_objects(build: Path) -> dict[str, int]:
    """{instance object: mtime_ns} of every generated instance (dispatch objects are not instances)."""
    return {str(p.relative_to(build)): p.stat().st_mtime_ns for p in build.glob("*/obj/ja_*.o")}


def bench_incremental(ctx: Context) -> Result:
    """incremental: in a scratch copy of the repository (JA_BACKEND=cpu), a cold `build_jit.py` (the anchor, timed
    once), then per run one edit to INCREMENTAL_MODULE's CPU template and a rebuild (ours), which must recompile
    only that template's instances (the object files whose mtime changed)."""
    # the checkout's test helpers: `python -m jatools.bench` runs from the root (nox's bench session installs it -e)
    from tests.build.scratch import env_for, make_scratch

    module = INCREMENTAL_MODULE
    require("make", "g++")
    scratch = ctx.work("incremental") / "repo"
    clear(scratch)
    make_scratch(scratch)
    env = env_for(scratch)
    build_jit = [sys.executable, "jax_aiter/jit/build_jit.py", "-j", "2"]
    run_command(["make", "-j2", "umbrella"], cwd=scratch, env=env)
    cold = timed(lambda: run_command(build_jit, cwd=scratch, env=env))
    build = scratch / "build" / config.BUILD_TREE["jit"]
    total = len(instance_objects(build))
    spec = json.loads((scratch / "jax_aiter/jit/optCompilerConfig.json").read_text())["modules"][module]
    template = scratch / spec["templates"]["cpu"]
    expected = sorted(k for k in instance_objects(build) if k.startswith(f"{module}/"))
    times, rebuilt_sets = [], []
    for i in range(ctx.warmup + ctx.runs):
        before = instance_objects(build)
        time.sleep(0.01)  # distinct mtimes
        with open(template, "a") as fh:
            fh.write(f"// bench edit {i}\n")
        took = timed(lambda: run_command(build_jit, cwd=scratch, env=env))
        after = instance_objects(build)
        rebuilt = sorted(k for k in after if after[k] != before.get(k))
        ctx.log(f"bench: incremental {'warm-up' if i < ctx.warmup else 'run'} {i + 1}: {took:.2f} s, "
                f"{len(rebuilt)}/{total} instances rebuilt")
        if i >= ctx.warmup:
            times.append(took)
            rebuilt_sets.append(rebuilt)
    exact = all(r == expected for r in rebuilt_sets)
    short = "" if exact else (f"rebuilt {[len(r) for r in rebuilt_sets]} instances, expected exactly the "
                              f"{len(expected)} of {module}: {rebuilt_sets[0]}")
    return Result("incremental", sorted(times)[len(times) // 2], cold, BENCHMARKS["incremental"].goal, exact, 0,
                  ours=f"edit {spec['templates']['cpu']}, build_jit.py -j 2", anchor="cold build_jit.py -j 2",
                  shortfall=short, runs={"ours": times, "anchor": [cold]},
                  extra={"instances_rebuilt": len(rebuilt_sets[-1]), "instances_total": total,
                         "rebuilt": rebuilt_sets[-1],
                         "notes": {"instances": f"{len(rebuilt_sets[-1])}/{total} rebuilt after one template edit"}})


VALIDATE_LIMIT_S = 20.0


def bench_validate(ctx: Context) -> Result:
    """validate: `invoke validate --variant lite` (engine-free, default installer) with a warm wheelhouse against
    `--installer pip` (`python -m venv` + `pip install`, same wheels and smoke tests). Untimed setup: the lite
    wheel from this checkout's CPU build, and the wheelhouse filled once if it is cold."""
    work = ctx.work("validate")
    dist = work / "dist"
    clear(dist)
    try:
        wheel = wheel_build.build(ctx.settings(), wheel_build.BuildOptions(variant="lite", dist_dir=dist)).wheel
    except (wheel_build.WheelBuildError, OSError) as e:
        raise AnchorMissing(f"cannot build the lite wheel ({e}); build the CPU libraries first") from None
    wh = wheelhouse.location(ctx.root)
    python = cleanroom_env.find_python(config.python_version(ctx.root))
    wheelhouse.ensure(wh, wheelhouse.requirements(ctx.root), python, allow_fill=True, log=ctx.log)
    env = {**os.environ, "JA_BACKEND": "cpu"}

    def route(installer: str):
        cmd = [sys.executable, "-m", "jatools.validate.cleanroom", "--engine", "none", "--installer", installer,
               "--variant", "lite", "--wheel", str(wheel), "--no-fill", "--report", str(work / f"{installer}.json")]
        return lambda: run_command(cmd, cwd=ctx.root, env=env)

    t = ctx.alternate("validate", route("auto"), route("pip"))
    speedup = t.anchor_s / t.ours_s
    short = []
    if t.ours_s > VALIDATE_LIMIT_S:
        short.append(f"{t.ours_s:.1f} s, {t.ours_s - VALIDATE_LIMIT_S:.1f} s over the 20 s goal")
    if speedup < 3:
        short.append(f"{speedup:.2f}x of the 3x goal over the venv+pip route")
    uv = shutil.which("uv")
    installer = "uv" if uv else "pip, no uv"
    return measured("validate", t, t.ours_s <= VALIDATE_LIMIT_S and speedup >= 3, wheel.stat().st_size, short,
                    ours=f"invoke validate --variant lite (engine none, installer auto: {installer})",
                    anchor="invoke validate --variant lite --installer pip (python -m venv + pip install)",
                    extra={"wheelhouse": str(wh), "uv": uv})


IMPORT_LIMIT_S = 0.010


def bench_import(ctx: Context) -> Result:
    """import: a fresh `python -c "import jax_aiter"` against a fresh `python -c "pass"` (the interpreter's own
    start); what import adds is the difference of the medians. tests/faults/test_faults_api.py guards the cause
    (which modules the import loads); this measures the cost."""
    env = {**os.environ, "PYTHONPATH": str(ctx.root)}
    runs = max(ctx.runs, 21)  # milliseconds each: many runs steady the medians
    t = ctx.alternate("import", lambda: run_command([sys.executable, "-c", "import jax_aiter"], cwd=ctx.root, env=env),
                      lambda: run_command([sys.executable, "-c", "pass"], cwd=ctx.root, env=env), runs=runs)
    added = t.ours_s - t.anchor_s
    met = added <= IMPORT_LIMIT_S
    over = (added - IMPORT_LIMIT_S) * 1e3
    short = [] if met else [(f"import adds {added * 1e3:.1f} ms to the interpreter's start, {over:.1f} ms over the "
                             "10 ms goal; `python -X importtime -c 'import jax_aiter'` names the modules")]
    return measured("import", t, met, 0, short, ours='python -c "import jax_aiter"', anchor='python -c "pass"',
                    extra={"import_added_ms": round(added * 1e3, 2)})


@dataclass(frozen=True)
class Case:
    run: Callable[[Context], Result]
    goal: str  # as the table shows it


# name -> benchmark, in the order (the order they run in)
BENCHMARKS: dict[str, Case] = {
    "verify": Case(bench_verify, ">=8x sha256sum, >=80% of cores x 1-core rate"),
    "publish": Case(bench_publish, "<=10% of zstd -19 time, <=1.15x size"),
    "fetch": Case(bench_fetch, ">=2x curl+zstd -d+sha256sum"),
    "wheel_full": Case(bench_wheel_full, ">=2x pip wheel, size <=1.05x"),
    "noop": Case(bench_noop, "<=1.5 s median"),
    "incremental": Case(bench_incremental, "rebuild only the touched template's instances"),
    "validate": Case(bench_validate, "<=20 s, >=3x venv+pip route"),
    "import": Case(bench_import, "import adds <=10 ms to python's start"),
}
