"""Clean-room smoke tests: shipped into a fresh environment and run there, never imported by the repo.

The clean room (jatools/validate/cleanroom.py) copies this file, next to tests/ops/reference.py
(the op tests' float64 references), into a folder outside the checkout and runs it in isolated
mode (`python -I`) from outside the checkout. It imports only the standard library, NumPy, JAX
and the *installed* jax_aiter, so it proves what a user of the wheel gets.

In order: isolation, installed bytes, identity, each library loading on its own,
the core ops on every device; then attention. A lite wheel must first refuse it
naming `jax-aiter-fetch-mha`, then runs that command against the release folder
it is handed (--release, served on 127.0.0.1 from a thread) and runs attention in
this process, as a user who fetches after the first error would. Last, where each
jax-aiter library in the process was mapped from (/proc/self/maps): only the
install and the fetch cache are allowed.

Results go to --out as JSON, a list of {check, ok, seconds, message}; the exit
status is 0 when every check passed.
"""
from __future__ import annotations

import argparse
import base64
import contextlib
import csv
import functools
import http.server
import importlib.util
import io
import json
import os
import subprocess
import sys
import sysconfig
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HOST_DEPS_PTH = "ja-host-deps.pth"  # jatools.validate.cleanroom writes it for --deps-from (no jatools import here)

DIST = "jax-aiter"
FETCH_COMMAND = "jax-aiter-fetch-mha"

# Loads one library as the first of ours in a fresh process, then lists every
# file the process has mapped: the loader must find the library's dependencies
# through its own RUNPATH, and we see where it found them.
LOAD_ALONE = r"""
import ctypes, json, sys
try:
    ctypes.CDLL(sys.argv[1])
    err = None
except OSError as e:
    err = str(e)
maps = sorted({l.split(None, 5)[5].strip() for l in open('/proc/self/maps') if len(l.split(None, 5)) == 6})
print(json.dumps({"error": err, "maps": [m for m in maps if m.startswith('/')]}))
"""


class CheckFailed(AssertionError):
    """A smoke check that ran and found a problem; the message names it."""


def _inside(path: Path, root: Path | None) -> bool:
    return root is not None and path.resolve().is_relative_to(root.resolve())


class Smoke:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.checkout = Path(args.checkout).resolve() if args.checkout else None
        self.purelib = Path(sysconfig.get_paths()["purelib"]).resolve()
        self.platlib = Path(sysconfig.get_paths()["platlib"]).resolve()
        self.results: list[dict] = []
        self.fetch_url = ""  # lite: set once the release is served

    # --- bookkeeping -------------------------------------------------------------------

    def run(self, name: str, fn, *a) -> bool:
        start = time.perf_counter()
        try:
            ok, message = True, fn(*a) or ""
        except CheckFailed as e:
            ok, message = False, str(e)
        except Exception as e:  # noqa: BLE001  (an unexpected error is a failure that names itself)
            ok, message = False, self.explain(e)
        self.results.append({"check": name, "ok": ok, "seconds": round(time.perf_counter() - start, 3),
                             "message": message})
        print(f"smoke: {'ok  ' if ok else 'FAIL'} {name} {message}".rstrip(), file=sys.stderr, flush=True)
        return ok

    def explain(self, e: BaseException) -> str:
        """One line for an unexpected exception, plus what it means for a wheel."""
        text = f"{type(e).__name__}: {e}"
        if isinstance(e, ModuleNotFoundError) and (e.name or "").startswith("jax_aiter"):
            rel = Path(*e.name.split("."))
            in_checkout = self.checkout and ((self.checkout / rel).is_dir() or
                                             (self.checkout / rel).with_suffix(".py").is_file())
            text += (f"; the installed wheel lacks module {e.name}" +
                     (" although the checkout has it, so the wheel only works where the checkout is on "
                      "sys.path: add it to the wheel's packages" if in_checkout else ""))
        tb = traceback.extract_tb(e.__traceback__)
        if tb:
            text += f" (at {Path(tb[-1].filename).name}:{tb[-1].lineno})"
        return text

    # --- where things come from ----------------------------------------------------------

    def packaged_libraries(self) -> list[Path]:
        from jax_aiter import _loader

        return sorted(_loader.PACKAGED_LIB_DIR.glob("*.so*"))

    def our_library_names(self) -> set[str]:
        from jax_aiter import _loader

        return {_loader.UMBRELLA, *_loader.MHA_JIT_LIBS, *(p.name for p in self.packaged_libraries()),
                *(lib for spec in _loader.OPS.values() for lib in (spec.shim, *spec.jit))}

    def check_origins(self, mapped: list[str], context: str) -> list[str]:
        """Where each of our libraries in `mapped` came from, when that is not the install or the fetch cache."""
        from jax_aiter import _loader

        ours = self.our_library_names()
        roots = [self.purelib, self.platlib, _loader.fetch_cache_dir()]
        where = {True: f"the checkout {self.checkout}", False: "outside the install and the fetch cache"}
        return [f"{p.name} was loaded from {p} ({where[_inside(p, self.checkout)]}){context}"
                for p in map(Path, mapped) if p.name in ours and not any(_inside(p, r) for r in roots)]

    # --- checks --------------------------------------------------------------------------

    def isolation(self) -> str:
        problems = [] if sys.flags.isolated else ["the interpreter is not in isolated mode (run it with `python -I`)"]
        if _inside(cwd := Path.cwd(), self.checkout):
            problems.append(f"the working directory {cwd} is inside the checkout")
        problems += [f"sys.path holds {entry}, inside the checkout{self.pth_source(entry)}" for entry in sys.path
                     if entry and _inside(Path(entry), self.checkout)]
        import jax_aiter

        where = Path(jax_aiter.__file__).resolve()
        if _inside(where, self.checkout):
            problems.append(f"jax_aiter resolves to {where}, inside the checkout: the wheel only works because "
                            "the checkout is on sys.path")
        elif not (_inside(where, self.purelib) or _inside(where, self.platlib)):
            problems.append(f"jax_aiter resolves to {where}, not into this environment's site-packages "
                            f"({self.purelib})")
        if problems:
            raise CheckFailed("; ".join(problems))
        return f"jax_aiter from {where.parent}"

    def pth_source(self, entry: str) -> str:
        for pth in sorted(self.purelib.glob("*.pth")):
            if entry in pth.read_text(errors="replace"):
                if pth.name == HOST_DEPS_PTH:
                    return (f" (added by {pth.name}: the --deps-from interpreter's site-packages are inside the "
                            "checkout; use an interpreter installed outside it)")
                return f" (added by {pth.name}, which the wheel installed)"
        return ""

    def installed_bytes(self) -> str:
        """Every file the wheel's RECORD lists is installed with exactly those bytes."""
        from importlib import metadata

        from jax_aiter.integrity import sha256_files

        dist = metadata.distribution(DIST)
        want: dict[Path, str] = {}
        for row in csv.reader(io.StringIO(Path(self.args.record).read_text())):
            if len(row) < 3 or not row[1]:
                continue  # RECORD lists itself without a hash
            if row[0].split("/", 1)[0].endswith(".data"):
                continue  # scripts/data are rewritten by the installer
            algo, _, b64 = row[1].partition("=")
            if algo != "sha256":
                raise CheckFailed(f"RECORD entry {row[0]} uses {algo}, not sha256")
            want[Path(dist.locate_file(row[0]))] = base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4)).hex()
        missing = [str(p) for p in want if not p.is_file()]
        if missing:
            raise CheckFailed(f"{len(missing)} file(s) of the wheel were not installed: {', '.join(missing[:5])}")
        got = sha256_files(list(want))
        wrong = [f"{p.name} (sha256 {got[str(p)][:12]}..., RECORD says {h[:12]}...)"
                 for p, h in want.items() if got[str(p)] != h]
        if wrong:
            raise CheckFailed(f"installed bytes differ from the wheel's RECORD: {', '.join(wrong[:5])}")
        return f"{len(want)} files match the wheel's RECORD"

    def identity(self) -> str:
        from importlib import metadata

        import jax_aiter
        from jax_aiter import _loader

        ident = _loader.build_identity()
        if not ident:
            raise CheckFailed(f"the wheel has no {_loader.IDENTITY_FILE.name}; its build identity is unknown")
        version = metadata.version(DIST)
        problems = [f"{k} is missing" for k in ("version", "variant", "cache_id") if not ident.get(k)]
        if ident.get("variant") and ident["variant"] != self.args.variant:
            problems.append(f"variant is {ident['variant']!r}, but the wheel is named as {self.args.variant!r}")
        if ident.get("version") and version.split("+")[0] != str(ident["version"]).split("+")[0]:
            problems.append(f"version {ident['version']} differs from the installed distribution's {version}")
        if (derived := jax_aiter.__version__) != version:  # derived from the identity: one home, pyproject.toml
            problems.append(f"jax_aiter.__version__ is {derived}, the installed distribution {version}")
        if problems:
            raise CheckFailed(f"{_loader.IDENTITY_FILE.name}: " + "; ".join(problems))
        return f"{version} {ident['variant']} cache_id={ident['cache_id']} backend={ident.get('backend', '?')}"

    def load_alone(self) -> str:
        """Each packaged library loads as the first of ours in a fresh process, deps found inside the install."""
        from jax_aiter import _loader

        libs = self.packaged_libraries()
        if not libs:
            raise CheckFailed(f"the wheel ships no libraries in {_loader.PACKAGED_LIB_DIR}")
        packaged = {p.name for p in libs}
        # In a lite wheel the MHA shims need the fetched MHA libraries; nothing else may be absent.
        fetched = set(_loader.MHA_JIT_LIBS) if self.args.variant == "lite" else set()
        deferred = {spec.shim for spec in _loader.OPS.values()
                    if set(spec.jit) - packaged and set(spec.jit) - packaged <= fetched}
        todo = [p for p in libs if p.name not in deferred]

        def one(p: Path) -> list[str]:
            out = subprocess.run([sys.executable, "-I", "-c", LOAD_ALONE, str(p)], check=False, capture_output=True,
                                 text=True)
            if out.returncode != 0:
                return [f"{p.name}: the load probe crashed ({out.stderr.strip()[-300:]})"]
            res = json.loads(out.stdout)
            if res["error"]:
                return [(f"{p.name} does not load on its own: {res['error']} "
                         "(its RUNPATH must reach the libraries it needs through $ORIGIN)")]
            return self.check_origins(res["maps"], f" when {p.name} was loaded on its own (check its RUNPATH)")

        with ThreadPoolExecutor(max_workers=min(4, len(todo))) as pool:
            problems = [msg for msgs in pool.map(one, todo) for msg in msgs]
        if problems:
            raise CheckFailed("; ".join(problems))
        later = f" ({', '.join(sorted(deferred))} need the fetched libraries; the attention check covers them)"
        return f"{len(todo)} libraries" + (later if deferred else "")

    def library_origins(self) -> str:
        with open("/proc/self/maps") as f:
            fields = [line.split(None, 5) for line in f]
        mapped = sorted({x[5].strip() for x in fields if len(x) == 6 and x[5].startswith("/")})
        used = [m for m in mapped if Path(m).name in self.our_library_names()]
        if not used:
            raise CheckFailed("no jax-aiter library is loaded in this process; the ops cannot have run through them")
        bad = self.check_origins(mapped, "")
        if bad:
            raise CheckFailed("; ".join(bad))
        return ", ".join(sorted({str(Path(m).parent) for m in used}))

    # --- ops -----------------------------------------------------------------------------

    def reference(self):
        spec = importlib.util.spec_from_file_location("ja_reference", Path(__file__).with_name("reference.py"))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    def core_ops(self, device) -> str:
        import jax
        import jax.numpy as jnp

        import jax_aiter as ja

        ref = self.reference()
        done = []
        with jax.default_device(device):
            for dtype in (jnp.float32, jnp.bfloat16):
                x, r, w, h = (ref.random(shape, dtype, seed) for seed, shape in
                              enumerate(((4, 256), (4, 256), (256,), (4, 2 * 128)), 1))
                what = f"{jnp.dtype(dtype).name} on {device.platform}"
                rms = jax.jit(lambda x, w: ja.rms_norm(x, w, 1e-6))(x, w)
                ref.assert_close(rms, ref.rms_norm_ref(x, w, 1e-6), dtype, what=f"rms_norm {what}")
                out, summed = jax.jit(lambda x, r, w: ja.rms_norm_with_add(x, r, w, 1e-6))(x, r, w)
                ref.assert_close(summed, ref.f64(x) + ref.f64(r), dtype, what=f"rms_norm_with_add (sum) {what}")
                ref.assert_close(out, ref.rms_norm_ref(jnp.asarray(summed), w, 1e-6), dtype,
                                 what=f"rms_norm_with_add {what}")
                ref.assert_close(jax.jit(ja.silu_and_mul)(h), ref.silu_and_mul_ref(h), dtype,
                                 what=f"silu_and_mul {what}")
                done.append(jnp.dtype(dtype).name)
        return f"rms_norm, rms_norm_with_add, silu_and_mul match the references ({', '.join(done)})"

    def attention(self, device) -> str:
        import jax
        import jax.numpy as jnp
        import numpy as np

        import jax_aiter as ja

        ref = self.reference()
        rng = np.random.default_rng(0)
        worst = 0.0
        with jax.default_device(device):
            for causal in (False, True):
                # grouped-query (4 query heads on 2 kv heads), seq_q != seq_k, head_dim 64
                shapes = [(1, 40, 4, 64), (1, 72, 2, 64), (1, 72, 2, 64), (1, 40, 4, 64)]
                q, k, v, do = (jnp.asarray(rng.standard_normal(s, np.float32)) for s in shapes)
                out, vjp = jax.vjp(lambda q, k, v, c=causal: ja.flash_attn_func(q, k, v, causal=c), q, k, v)
                want_o, want_grads = ref.attention_ref(*(np.asarray(a, np.float64) for a in (q, k, v, do)),
                                                       causal, 64 ** -0.5)
                for name, got, want in zip(("out", "dq", "dk", "dv"), (out, *vjp(do)), (want_o, *want_grads)):
                    err = ref.rel_err(got, want)
                    worst = max(worst, err)
                    if not err <= ref.ATTENTION_RTOL["float32"]:
                        raise CheckFailed(f"flash_attn_func causal={causal} on {device.platform}: {name} relative "
                                          f"error {err:.3g} exceeds {ref.ATTENTION_RTOL['float32']} (float32)")
        return f"forward and backward match the float64 reference, causal and not (worst error {worst:.2g})"

    def attention_needs_fetch(self) -> str:
        import jax
        import jax.numpy as jnp

        try:
            import jax_aiter as ja

            q = jnp.zeros((1, 8, 1, 64), jnp.float32)
            jax.block_until_ready(ja.flash_attn_func(q, q, q))
        except Exception as e:  # noqa: BLE001  (whatever it raises, its message must name the fix)
            msg = f"{type(e).__name__}: {e}"
            if FETCH_COMMAND not in msg:
                raise CheckFailed(f"the attention API failed without naming `{FETCH_COMMAND}`: {msg}") from None
            return f"fails as it should: {msg[:160]}"
        raise CheckFailed("the attention API ran before any fetch: this lite wheel already finds the MHA "
                          f"libraries ({self.mha_origin()}), so `{FETCH_COMMAND}` is not what provides them")

    def mha_origin(self) -> str:
        from jax_aiter import _loader

        found = []
        for name in _loader.MHA_JIT_LIBS:
            with contextlib.suppress(_loader.LibraryNotFoundError):
                found.append(str(_loader.find_library(name)))
        return ", ".join(found) or "found nowhere the loader looks"

    def devices(self) -> list:
        """(tag, device): the CPU, plus the first GPU when JAX sees one (required with --expect-gpu)."""
        import jax

        try:
            gpus = [d for d in jax.devices() if d.platform != "cpu"]
        except RuntimeError:
            gpus = []
        return [("cpu", jax.devices("cpu")[0]), *(("gpu", g) for g in gpus[:1])]

    def gpu_visible(self) -> str:
        import jax

        from jax_aiter import (
            remedies,  # the installed wheel's: this script imports nothing from jatools
        )

        gpus = [d for d in jax.devices() if d.platform != "cpu"]
        if not gpus:
            raise CheckFailed(f"this host has a {self.args.expect_gpu} GPU, but JAX sees only {jax.devices()}; the "
                              f"JAX {self.args.expect_gpu} plugin is missing or failed to start (refill the wheelhouse "
                              f"with `{remedies.door('wheelhouse')} --gpu {self.args.expect_gpu}`)")
        return f"{gpus[0].device_kind} ({gpus[0].platform}); the op checks run on it too"

    # --- the run -------------------------------------------------------------------------

    def serve_release(self) -> str:
        """The release folder over HTTP on 127.0.0.1 (a port the system picks), from a thread of this process."""
        handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=self.args.release)
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self.fetch_url = f"http://127.0.0.1:{server.server_address[1]}"
        return f"serving {self.args.release} on {self.fetch_url}"

    def fetch(self) -> str:
        """`jax-aiter-fetch-mha --base-url URL`, the console script the wheel installed."""
        script = Path(sys.executable).with_name(FETCH_COMMAND)
        out = subprocess.run([str(script), "--base-url", self.fetch_url], check=False, capture_output=True, text=True)
        text = " | ".join((out.stdout + out.stderr).strip().splitlines()[-4:])
        if out.returncode != 0:
            raise CheckFailed(f"`{FETCH_COMMAND} --base-url {self.fetch_url}` failed (exit {out.returncode}): {text}")
        return out.stdout.strip().splitlines()[-1] if out.stdout.strip() else text

    def run_all(self) -> None:
        if self.args.variant == "lite" and not self.run("release-server", self.serve_release):
            return
        if not self.run("isolation", self.isolation):
            return  # everything after would test the checkout, not the wheel
        self.run("installed-bytes", self.installed_bytes)
        self.run("identity", self.identity)
        self.run("load-alone", self.load_alone)
        os.environ["JA_POISON_OUTPUTS"] = "1"  # unwritten outputs show as NaN
        os.environ["JA_KERNEL_MIN_BYTES"] = "0"  # the kernels at the smoke's small sizes, not jax.numpy's forms
        if self.args.expect_gpu:
            self.run("gpu-visible", self.gpu_visible)
        devices = self.devices()
        for tag, dev in devices:
            self.run(f"core-ops[{tag}]", self.core_ops, dev)
        if self.args.variant == "lite":
            self.run("attention-needs-fetch", self.attention_needs_fetch)
            if not self.run("fetch", self.fetch):
                self.run("library-origin", self.library_origins)
                return
        for tag, dev in devices:
            self.run(f"attention[{tag}]", self.attention, dev)
        self.run("library-origin", self.library_origins)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variant", choices=("lite", "full"), required=True)
    p.add_argument("--release", help="lite: the release folder jax-aiter-fetch-mha fetches from (served here)")
    p.add_argument("--expect-gpu", choices=("cuda", "rocm"), help="the host has a GPU of this backend: JAX must see it")
    p.add_argument("--checkout", help="the source checkout, which must not be reachable")
    p.add_argument("--record", help="the wheel's RECORD, to compare the installed bytes with")
    p.add_argument("--out", required=True, help="where to write the results (JSON)")
    args = p.parse_args(argv)
    if args.variant == "lite" and not args.release:
        p.error("a lite wheel needs --release (the folder it fetches the attention libraries from)")
    smoke = Smoke(args)
    try:
        smoke.run_all()
    finally:
        tmp = Path(args.out).with_suffix(".tmp")
        tmp.write_text(json.dumps(smoke.results, indent=1))
        os.replace(tmp, args.out)
    return 0 if all(r["ok"] for r in smoke.results) else 1


if __name__ == "__main__":
    sys.exit(main())
