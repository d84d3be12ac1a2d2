"""The steps of one wheel's clean-room validation, as data: the same list runs locally and in a container.

A step is an argument vector plus what it proves (its check name and phase).
The engine-free path runs each vector as it is, with the room's scrubbed
environment; the container path runs the same vectors through
`<engine> exec` inside the validation image. Paths are as the room's processes
see them (a `Layout`), so one plan describes both.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from jatools.validate.cleanroom_env import Installer

PORT = "{port}"  # filled in with the release server's port once it listens
SMOKE_SCRIPT = "cleanroom_smoke.py"
HOST_DEPS_PTH = "ja-host-deps.pth"  # cleanroom_smoke.py names it too (it imports no jatools)
# Appends the given folders to the venv's sys.path (after its own site-packages, so the wheel's
# jax_aiter still comes first) through a .pth file in its site-packages.
_HOST_DEPS_CODE = ("import sys, sysconfig, pathlib; pathlib.Path(sysconfig.get_paths()['purelib'], "
                   f"{HOST_DEPS_PTH!r}).write_text(''.join(p + chr(10) for p in sys.argv[1:]))")
RECORD_COPY = "wheel-RECORD"


@dataclass(frozen=True)
class Layout:
    """Where things are, as seen from inside the clean room."""

    python: str       # the base interpreter the venv is made from
    venv: str
    work: str         # working directory of every step (outside the checkout)
    smoke: str        # folder with the smoke script, reference.py and the wheel's RECORD
    out: str          # folder the smoke steps write their results to
    wheel: str
    wheelhouse: str
    release: str | None  # folder served as the release (lite only)
    checkout: str     # the source tree that must stay unreachable
    pycache: str | None = None  # -X pycache_prefix for the smoke step (dependencies' bytecode kept between rooms)
    gpu: str | None = None      # cuda | rocm: the host has such a GPU and the wheel is built for it
    host_deps: tuple[str, ...] = ()  # site-packages folders whose installed packages serve as the dependencies


@dataclass(frozen=True)
class Step:
    name: str
    phase: str                      # environment | install | smoke
    argv: tuple[str, ...]
    results: str | None = None      # smoke steps: their JSON results, as the room sees the path
    background: bool = False        # the release server: runs while the later steps run
    needs_port: bool = False        # argv holds PORT


@dataclass(frozen=True)
class Plan:
    variant: str
    steps: tuple[Step, ...] = field(default_factory=tuple)


def build(layout: Layout, installer: Installer, variant: str, pins: list[str]) -> Plan:
    """Every step for one wheel. `pins` (e.g. jax==0.11.0) keep the resolver at the versions under test.

    With `layout.host_deps` the venv sees those folders' installed packages (an offline GPU host's JAX
    and its plugin), and the installer adds only the wheel and what they lack.

    A lite wheel's smoke step fetches from the release server the step before starts.
    """
    steps = [Step("venv", "environment", tuple(installer.create(layout.python, layout.venv)))]
    if layout.host_deps:
        steps.append(Step("host-deps", "environment", (f"{layout.venv}/bin/python", "-I", "-c", _HOST_DEPS_CODE,
                                                       *layout.host_deps)))
    steps.append(Step("install", "install", tuple(installer.install(layout.venv, layout.wheelhouse,
                                                                    [f"{layout.wheel}[fetch]", *pins]))))
    extra: tuple[str, ...] = ()
    if variant == "lite":
        if layout.release is None:
            raise ValueError("a lite wheel needs a release folder to fetch the attention libraries from")
        steps.append(Step("release-server", "smoke", (f"{layout.venv}/bin/python", "-I", "-u", "-m", "http.server",
                                                      "0", "--bind", "127.0.0.1", "--directory", layout.release),
                          background=True))
        extra = ("--fetch-url", f"http://127.0.0.1:{PORT}")
    out = f"{layout.out}/smoke.json"
    prefix = ("-X", f"pycache_prefix={layout.pycache}") if layout.pycache else ()
    extra += ("--expect-gpu", layout.gpu) if layout.gpu else ()
    steps.append(Step("smoke", "smoke", (f"{layout.venv}/bin/python", "-I", *prefix, f"{layout.smoke}/{SMOKE_SCRIPT}",
                                         "--variant", variant, "--checkout", layout.checkout, "--record",
                                         f"{layout.smoke}/{RECORD_COPY}", *extra, "--out", out),
                      results=out, needs_port=variant == "lite"))
    return Plan(variant, tuple(steps))
