"""The commands an error message names to make what is missing: one table, naming the doors.

The doors are the ones docs/architecture.md lists (`nox -s jit` builds the JIT libraries, `invoke jit.fetch`
fetches published ones). The runtime and the tooling both word their remedies through `door`, and the
runtime cannot import the tooling, so the table lives here.
"""
from __future__ import annotations

from collections.abc import Iterable

DOORS = {
    "jit": "nox -s jit",                # build the JIT libraries (the producer)
    "jit_fetch": "invoke jit.fetch",    # fetch this checkout's published JIT libraries (a consumer)
    "jit_publish": "invoke jit.publish",
    "verify": "invoke verify",          # the JIT libraries against their build record (the release's stage too)
    # every library of a build tree, in order, through make alone (an unpacked sdist has no noxfile.py)
    "native": "make && make jit && make ja_mods",
    # fill the clean room's offline wheelhouse from the package index (`--gpu cuda|rocm` adds the JAX plugin)
    "wheelhouse": "invoke wheelhouse",
}


def door(action: str, modules: Iterable[str] = ()) -> str:
    """The command for `action` (a key of DOORS); for "jit", `modules` limits the build to those modules."""
    if action not in DOORS:
        raise KeyError(f"no door for {action!r}; the actions are {', '.join(DOORS)}")
    names = ",".join(modules)
    return f"{DOORS[action]} -- --module {names}" if names and action == "jit" else DOORS[action]


def build_or_fetch(modules: Iterable[str] = ()) -> str:
    """The remedy for missing or stale JIT libraries: build them, or fetch the published ones."""
    return f"build the JIT libraries with `{door('jit', modules)}` or fetch published ones with `{door('jit_fetch')}`"
