"""Which backend lane the installed wheel is, and the refusal to run on another GPU backend.

A wheel is built for one backend (its lane: cuda13, rocm7, cpu; docs/wheels.md "Lanes"). Every library also
carries the CPU kernels, so any lane runs on a CPU-only JAX. On a JAX whose GPUs are another backend's, the
libraries cannot serve them (a ROCm lane's need libamdhip64, which a CUDA host lacks; a CUDA lane's have no
kernels for an AMD GPU): that is refused before anything loads, naming the lane, the backend found and the
command that installs the right lane, instead of a loader error or ops that silently run on the CPU.
Standard library only until the check asks JAX which GPU backends it has.
"""
from __future__ import annotations

GPU_BACKENDS = ("cuda", "rocm")


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


def mismatch(identity: dict | None, present: set[str]) -> str | None:
    """Why the installed lane cannot run on a JAX with GPU backends `present`, or None when it can."""
    backend = (identity or {}).get("backend")
    if backend not in GPU_BACKENDS and not present:
        return None
    if backend in present or not present:
        return None
    version = (identity or {}).get("version", "")
    want = min(present)
    lane = (identity or {}).get("lanes", {}).get(want)  # the release's lanes, baked in by the wheel build
    label = f"{lane}.full" if lane and (identity or {}).get("variant") == "full" else lane
    fix = (f"install the {lane} lane: pip install --force-reinstall 'jax-aiter=={version.split('+')[0]}+{label}' "
           "(from the index or release assets docs/wheels.md names)" if lane else f"install a build for {want}")
    return (f"jax_aiter {version} is the {lane_of(identity) or backend} lane (built for {backend}), but JAX runs on "
            f"{', '.join(sorted(present))} GPUs: its libraries have no kernels for them. To use them, {fix}; or run "
            "on the CPU (JAX_PLATFORMS=cpu)")


def check(identity: dict | None, jax) -> None:
    """WrongBackendError when the installed lane is for another GPU backend than JAX's."""
    if identity is None:  # a source checkout builds for whatever backend it is told to
        return
    why = mismatch(identity, present_gpu_backends(jax))
    if why:
        raise WrongBackendError(why)
