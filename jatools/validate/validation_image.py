"""The clean-room validation image: its tag, reference and the docker commands that build and publish it.

The tag is derived from the recipe, never typed: ``v`` + the first 12 hex of the
sha256 of ``docker/validation/Dockerfile.lite``, plus ``-<variant>`` for a
variant. Editing the Dockerfile therefore names a new image, and the
validation-image workflow publishes it on the next push instead of validating
against a stale environment. Variants are the Dockerfile's ``base-<variant>``
stages, read from the file itself so the list cannot drift from the recipe.

``ci/validation_image_id.sh`` prints the tag; the validation tooling calls
:func:`image_ref` and :func:`build_command` to pull or build the same image.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from jatools import config
from jax_aiter.integrity import sha256_file

DOCKERFILE = Path("docker/validation/Dockerfile.lite")
TAG_HEX = 12
DEFAULT_REPOSITORY = "ghcr.io/rocm/jax-aiter-validate"


class ImageError(RuntimeError):
    """The image recipe or a docker step failed; the message names the fix."""


def dockerfile(root: Path | None = None) -> Path:
    path = (root or config.repo_root()) / DOCKERFILE
    if not path.is_file():
        raise ImageError(f"{path} is missing; restore it with `git checkout -- {DOCKERFILE}`")
    return path


def recipe_hash(root: Path | None = None) -> str:
    """First 12 hex of the Dockerfile's sha256 (the whole recipe lives in that one file)."""
    return sha256_file(dockerfile(root))[:TAG_HEX]


def variants(root: Path | None = None) -> tuple[str, ...]:
    """The variants the Dockerfile defines, as its ``FROM ... AS base-<variant>`` stages."""
    text = dockerfile(root).read_text()
    found = tuple(re.findall(r"^FROM\s+\S+\s+AS\s+base-([a-z0-9]+)\s*$", text, re.MULTILINE | re.IGNORECASE))
    if not found:
        raise ImageError(f"{DOCKERFILE} defines no `FROM <image> AS base-<variant>` stage")
    return found


def _check_variant(variant: str, root: Path | None) -> None:
    known = variants(root)
    if variant not in known:
        raise ImageError(f"unknown validation image variant {variant!r}; {DOCKERFILE} defines {', '.join(known)}")


def image_tag(variant: str | None = None, root: Path | None = None) -> str:
    """``v<hash12>`` (the recipe) or ``v<hash12>-<variant>`` (one built image)."""
    if variant is None:
        return f"v{recipe_hash(root)}"
    _check_variant(variant, root)
    return f"v{recipe_hash(root)}-{variant}"


def repository(root: Path | None = None, env: dict[str, str] | None = None) -> str:
    """Image repository: JA_VALIDATION_IMAGE, else pyproject's ``validation_image``."""
    env = os.environ if env is None else env
    return env.get("JA_VALIDATION_IMAGE") or config.defaults(root).get("validation_image", DEFAULT_REPOSITORY)


def image_ref(variant: str, root: Path | None = None, env: dict[str, str] | None = None) -> str:
    return f"{repository(root, env)}:{image_tag(variant, root)}"


def build_command(variant: str, root: Path | None = None, env: dict[str, str] | None = None) -> list[str]:
    """The `docker build` that makes one variant locally (also the validation tooling's fallback)."""
    path = dockerfile(root)
    return ["docker", "build", "--build-arg", f"VARIANT={variant}", "--tag", image_ref(variant, root, env),
            "--file", str(path), str(path.parent)]


def publish_plan(variant: str, push: bool, root: Path | None = None,
                 env: dict[str, str] | None = None) -> list[list[str]]:
    """Commands that publish one variant: skip when the registry has the tag, else build (and push)."""
    ref = image_ref(variant, root, env)
    plan = [build_command(variant, root, env)]
    if push:
        plan.append(["docker", "push", ref])
    return plan


def publish(variant: str, push: bool, dry_run: bool = False, root: Path | None = None,
            run: Callable[[Sequence[str]], int] | None = None,
            log: Callable[[str], None] = print) -> str:
    """Build (and push) one variant unless the registry already holds its tag; return what happened."""
    run = run or (lambda a: subprocess.call(list(a)))
    ref = image_ref(variant, root)
    plan = publish_plan(variant, push, root)
    if dry_run:
        for cmd in plan:
            log("would run: " + " ".join(cmd))
        return "dry-run"
    if push and run(["docker", "manifest", "inspect", ref]) == 0:
        log(f"{ref} is already published; nothing to do (the tag is the recipe hash)")
        return "present"
    rc = run(plan[0])
    if rc != 0:
        raise ImageError(f"`{' '.join(plan[0])}` failed (exit {rc}); see the docker output above")
    if push:
        rc = run(plan[1])  # docker retries each layer's upload itself: one retry layer
        if rc != 0:
            raise ImageError(f"`docker push {ref}` failed (exit {rc}); "
                             "check `docker login ghcr.io` and the job's packages: write permission")
    log(f"{'published' if push else 'built'} {ref}")
    return "published" if push else "built"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="ci/validation_image_id.sh", description=__doc__.splitlines()[0])
    p.add_argument("--variant", help="print the tag of this variant (default: the recipe tag v<hash12>)")
    p.add_argument("--ref", action="store_true", help="print the full image reference (needs --variant)")
    p.add_argument("--list-variants", action="store_true", help="print the variants the Dockerfile defines")
    args = p.parse_args(argv)
    try:
        if args.list_variants:
            print("\n".join(variants()))
        elif args.ref:
            if not args.variant:
                p.error("--ref needs --variant (one of: " + ", ".join(variants()) + ")")
            print(image_ref(args.variant))
        else:
            print(image_tag(args.variant))
    except ImageError as e:
        print(f"validation_image: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
