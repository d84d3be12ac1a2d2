"""Which backend lane the installed wheel is, and the refusal to run on another GPU backend.

A wheel is built for one backend (its lane: cuda13, rocm7, cpu; docs/wheels.md "Lanes"). Every library also
carries the CPU kernels, so any lane runs on a CPU-only JAX. On a JAX whose GPUs are another backend's, the
libraries cannot serve them (a ROCm lane's need libamdhip64, which a CUDA host lacks; a CUDA lane's have no
kernels for an AMD GPU): that is refused before anything loads, naming the lane, the backend found and the
command that installs the right lane, instead of a loader error or ops that silently run on the CPU.
`python -m jax_aiter info` says the same without JAX, from the GPUs the host's tools list (`host_mismatch`), and
also flags GPUs of the lane's backend whose archs none of its code runs on.
Standard library only until the check asks JAX which GPU backends it has.
"""
from __future__ import annotations

import re

GPU_BACKENDS = ("cuda", "rocm")
# Each lane's index root in a store of releases (docs/wheels.md, "Lanes"): the artifact index writes it there, and
# the wrong-lane message names it.
INDEX_ROOT = "{store}/{lane}/simple"


class WrongBackendError(RuntimeError):
    """The installed lane is for another GPU backend than the one JAX runs on."""


def lane_of(identity: dict | None) -> str | None:
    """The lane the wheel's build identity names (None: a source checkout or a wheel from before lanes)."""
    return (identity or {}).get("lane")


def present_gpu_backends(jax) -> set[str]:
    """The GPU backends this JAX has devices of (cuda, rocm)."""
    found = set()
    for backend in GPU_BACKENDS:
        try:
            if jax.devices(backend):
                found.add(backend)
        except RuntimeError:  # no such backend in this JAX (no plugin, or its runtime failed to start)
            pass
    return found


def mismatch(identity: dict | None, present: set[str], seen: str = "JAX runs on") -> str | None:
    """Why the installed lane cannot run on a JAX with GPU backends `present`, or None when it can (`seen`: where
    those GPUs were seen, for the message)."""
    backend = (identity or {}).get("backend")
    if backend not in GPU_BACKENDS and not present:
        return None
    if backend in present or not present:
        return None
    version = (identity or {}).get("version", "")
    want = min(present)
    lane = (identity or {}).get("lanes", {}).get(want)  # the release's lanes, baked in by the wheel build
    label = f"{lane}.full" if lane and (identity or {}).get("variant") == "full" else lane
    fix = (f"install the {lane} lane: pip install --force-reinstall "
           f"--extra-index-url {INDEX_ROOT.format(store='<store>', lane=lane)} "
           f"'jax-aiter=={version.split('+')[0]}+{label}' (docs/wheels.md, Lanes)" if lane
           else f"install a build for {want}")
    return (f"jax_aiter {version} is the {lane_of(identity) or backend} lane (built for {backend}), but {seen} "
            f"{', '.join(sorted(present))} GPUs: its libraries have no kernels for them. To use them, {fix}; or run "
            "on the CPU (JAX_PLATFORMS=cpu)")


def check(identity: dict | None, jax) -> None:
    """WrongBackendError when the installed lane is for another GPU backend than JAX's."""
    if identity is None:  # a source checkout builds for whatever backend it is told to
        return
    why = mismatch(identity, present_gpu_backends(jax))
    if why:
        raise WrongBackendError(why)


def covers(built: str, gpu: str) -> bool:
    """Whether device code built for arch `built` runs on a GPU of arch `gpu`: a CUDA cubin on its own and later
    minor versions of one major (sm_80 on sm_86 and sm_89; sm_90a, with arch-specific instructions, on sm_90
    only); a ROCm code object on its own gfx only."""
    b, g = (re.fullmatch(r"sm_(\d+)(\d)([af]?)", a) for a in (built, gpu))
    if b and g:
        same_major = b.group(1) == g.group(1)
        return same_major and (g.group(2) == b.group(2) if b.group(3) else int(g.group(2)) >= int(b.group(2)))
    return built.split(":")[0] == gpu.split(":")[0]  # gfx950 (a ROCm target id may add :xnack- and such)


def host_mismatch(identity: dict | None, gpus: dict[str, tuple[str, ...]]) -> str | None:
    """Why the installed lane does not fit this host's GPUs ({backend: archs}, as jax_aiter.host_gpus lists them):
    another backend's GPUs (as `mismatch`), or GPUs of its backend whose archs none of its code runs on; None when
    it fits (or it is a source checkout, built for whatever it was told)."""
    if identity is None:
        return None
    if why := mismatch(identity, set(gpus), seen="this host has"):
        return why
    backend, built = identity.get("backend"), list(identity.get("gpu_archs") or [])
    uncovered = [a for a in gpus.get(backend, ()) if not any(covers(b, a) for b in built)]
    if not uncovered:
        return None
    return (f"jax_aiter {identity.get('version', '')} has {backend} code for {', '.join(built) or 'no GPU arch'}, "
            f"but this host's {backend} GPUs are {', '.join(uncovered)}, which none of it runs on: ops would fail on "
            "them. Build for them from the sdist (GPU_ARCHS=" + ";".join(uncovered) + " pip install "
            "jax_aiter-<version>.tar.gz; docs/wheels.md, Source builds), or run on the CPU (JAX_PLATFORMS=cpu)")
