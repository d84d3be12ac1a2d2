"""The JAX versions jax-aiter declares and tests (docs/ci.md, "JAX versions").

    python3 -m jatools.testing.jax_versions                        # the declared range and the versions tested
    python3 -m jatools.testing.jax_versions --requirements newest  # pip requirements of one end of the range

The range is pyproject.toml's `jax` and `jaxlib` requirements (its one home): a floor and an upper bound, the
same for both. jax-aiter builds on private JAX APIs (jax._src: the exported sharded ops, the plugin hook) that
change between minor releases, so a release past the bound is one no lane ran and is not offered to users.
What runs inside the range: every tier at the `test` group's pin; the clean room at the floor; and
`nox -s jax_range`, the export round trip on the floor and on the newest release inside the bound, each in a
fresh venv (`floor`: jax==FLOOR; `newest`: the range itself, which pip resolves to its newest release).
"""
from __future__ import annotations

import argparse
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from jatools import config
from jatools.validate import wheelhouse

PACKAGES = ("jax", "jaxlib")
ENDS = ("floor", "newest")


class JaxRangeError(ValueError):
    """pyproject.toml does not declare a JAX range this tooling can test; the message names the fix."""


@dataclass(frozen=True)
class JaxRange:
    specifier: SpecifierSet  # e.g. >=0.11.0,<0.13
    floor: str               # the lowest version it admits (its >= or == bound)
    bound: str               # the upper bound (its < bound), excluded

    def requirements(self, end: str) -> list[str]:
        """pip requirements of jax and jaxlib at one end: `floor` pinned, `newest` the range (pip takes the newest)."""
        if end not in ENDS:
            raise JaxRangeError(f"unknown end {end!r}; one of {', '.join(ENDS)}")
        return [f"{p}=={self.floor}" if end == "floor" else f"{p}{self.specifier}" for p in PACKAGES]


def declared(root: Path | None = None) -> JaxRange:
    """The JAX range of pyproject.toml's dependencies, checked: jax and jaxlib have the same floor and upper bound,
    and the `test` group's pin (what every tier runs) lies inside it."""
    path = (root or config.repo_root()) / "pyproject.toml"
    with open(path, "rb") as f:
        deps = tomllib.load(f).get("project", {}).get("dependencies", [])
    reqs = {r.name.lower(): r for r in map(Requirement, deps) if r.name.lower() in PACKAGES}
    fix = f'write `"jax>=X,<Y", "jaxlib>=X,<Y"` in [project] dependencies of {path}'
    if set(reqs) != set(PACKAGES):
        raise JaxRangeError(f"{path}: [project] dependencies name {sorted(reqs)}, not both of {list(PACKAGES)}; {fix}")
    specs = {name: req.specifier for name, req in reqs.items()}
    if specs["jax"] != specs["jaxlib"]:
        raise JaxRangeError(f"{path}: jax is required as {specs['jax']} and jaxlib as {specs['jaxlib']}; JAX "
                            f"releases them together, so declare one range for both: {fix}")
    spec = specs["jax"]
    floors = [s.version for s in spec if s.operator in (">=", "==", "~=")]
    bounds = [s.version for s in spec if s.operator == "<"]
    if not floors or not bounds:
        raise JaxRangeError(f"{path}: jax is required as {spec or 'any version'}, without "
                            f"{'a floor' if not floors else 'an upper bound'}: jax-aiter uses private JAX APIs that "
                            f"change between releases, so it declares the range it tests; {fix}")
    pin = wheelhouse.test_jax_version(root)
    if Version(pin) not in spec:
        raise JaxRangeError(f"{path}: the `test` group pins jax=={pin}, outside the declared range {spec}: every "
                            "tier would test a JAX users are not offered; move the pin or the range")
    return JaxRange(spec, floors[0], bounds[0])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m jatools.testing.jax_versions", description=__doc__.split("\n")[0])
    ap.add_argument("--requirements", choices=ENDS, help="print the pip requirements of one end of the range")
    args = ap.parse_args(argv)
    try:
        jr = declared()
    except (JaxRangeError, wheelhouse.WheelhouseError) as e:
        print(f"jax_versions: {e}", file=sys.stderr)
        return 2
    if args.requirements:
        print(" ".join(jr.requirements(args.requirements)))
    else:
        print(f"declared: jax{jr.specifier} (floor {jr.floor}, below {jr.bound}); every tier: "
              f"jax=={wheelhouse.test_jax_version()}; jax_range: {jr.requirements('floor')[0]} and "
              f"{jr.requirements('newest')[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
