"""Project defaults from pyproject.toml ``[tool.jax-aiter]``, overridden by the environment.

Precedence: command-line flags > environment > pyproject defaults. Callers pass
flags explicitly; this module resolves the other two layers in one place.
"""
from __future__ import annotations

import json
import os
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

VALID_BACKENDS = ("auto", "cpu", "cuda", "rocm")
VALID_SANITIZERS = ("address", "undefined", "leak", "thread")


def repo_root() -> Path:
    """The checkout root: JA_ROOT_DIR when set, else the folder holding this package."""
    env = os.environ.get("JA_ROOT_DIR")
    return Path(env).resolve() if env else REPO_ROOT


@cache
def _pyproject_defaults(root: str) -> dict:
    with open(Path(root) / "pyproject.toml", "rb") as f:
        return dict(tomllib.load(f)["tool"]["jax-aiter"])


def defaults(root: Path | None = None) -> dict:
    """The raw ``[tool.jax-aiter]`` table."""
    return dict(_pyproject_defaults(str(root or repo_root())))


def project_version(root: Path | None = None) -> str:
    with open((root or repo_root()) / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["version"]


def split_archs(value: str) -> list[str]:
    """GPU_ARCHS accepts ';' or ',' separated lists; blanks are dropped, order kept, no repeats."""
    out: list[str] = []
    for part in value.replace(";", ",").split(","):
        part = part.strip()
        if part and part not in out:
            out.append(part)
    return out


def truthy(value: object) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class Settings:
    root: Path
    backend: str  # requested: auto|cpu|cuda|rocm
    gpu_archs: tuple[str, ...] | None  # None: use the backend's default
    symbol_visible: bool
    umbrella_dir: Path
    jit_dir: Path
    build_dir: Path
    kernel_source_dir: Path
    jit_config: Path
    ffi_include_dir: Path
    toolchain_strict: bool
    raw: dict
    sanitize: tuple[str, ...] = ()  # JA_SANITIZE, e.g. address,undefined (CPU backend only)

    def default_archs(self, backend: str) -> tuple[str, ...]:
        key = {"rocm": "gpu_archs_rocm", "cuda": "gpu_archs_cuda"}.get(backend)
        return tuple(split_archs(self.raw[key])) if key else ()


def load(backend: str | None = None, gpu_archs: str | None = None, root: Path | None = None,
         env: dict[str, str] | None = None) -> Settings:
    """Resolve settings: explicit arguments (flags) > environment > pyproject."""
    env = os.environ if env is None else env
    root = root or repo_root()
    raw = defaults(root)
    chosen_backend = (backend or env.get("JA_BACKEND") or raw["backend"]).strip().lower()
    if chosen_backend not in VALID_BACKENDS:
        raise ValueError(
            f"JA_BACKEND={chosen_backend!r} is not a backend; use one of {', '.join(VALID_BACKENDS)}"
        )
    archs_text = gpu_archs if gpu_archs is not None else env.get("GPU_ARCHS")
    archs = tuple(split_archs(archs_text)) if archs_text else None
    sanitize = tuple(split_archs(env.get("JA_SANITIZE", "")))
    unknown = [s for s in sanitize if s not in VALID_SANITIZERS]
    if unknown or {"address", "thread"} <= set(sanitize):
        raise ValueError(
            f"JA_SANITIZE={env.get('JA_SANITIZE')!r}: use a comma list of {', '.join(VALID_SANITIZERS)} "
            "(address and thread exclude each other), e.g. JA_SANITIZE=address,undefined"
        )
    sym = env.get("AITER_SYMBOL_VISIBLE")
    build_dir = root / (env.get("JA_BUILD_DIR") or raw["build_dir"])
    return Settings(
        root=root,
        backend=chosen_backend,
        gpu_archs=archs or None,
        symbol_visible=truthy(sym) if sym is not None else bool(raw.get("symbol_visible", False)),
        umbrella_dir=build_dir / "jax_aiter_build",
        jit_dir=build_dir / "aiter_build",
        build_dir=build_dir,
        kernel_source_dir=root / raw["kernel_source_dir"],
        jit_config=root / raw["jit_config"],
        ffi_include_dir=root / (env.get("JA_FFI_INCLUDE_DIR") or raw["ffi_include_dir"]),
        toolchain_strict=truthy(env.get("JA_TOOLCHAIN_STRICT", raw.get("toolchain_strict", False))),
        raw=raw,
        sanitize=sanitize,
    )


def jit_libraries(settings: Settings) -> list[str]:
    """The JIT libraries the op table names (each module of the JIT config, its `library`), in its order."""
    try:
        modules = json.loads(settings.jit_config.read_text())["modules"]
        return [m["library"] for m in modules.values()]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{settings.jit_config} does not give each module's library ({e!r}); fix the op table") from None
