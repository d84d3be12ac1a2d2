"""The failures the JIT-library command-line front ends (invoke jit.*, verify) turn into a message and exit 1."""
from __future__ import annotations

from jatools.jitlibs import publish
from jatools.jitlibs.record import JitCacheError
from jatools.native import toolchain
from jax_aiter.download import manifest as mf
from jax_aiter.download import transfer
from jax_aiter.download.blob import BlobError
from jax_aiter.integrity import IntegrityError

CLI_ERRORS: tuple[type[BaseException], ...] = (
    JitCacheError, publish.PublishError, transfer.FetchError, mf.ManifestError,
    toolchain.ToolchainError, IntegrityError, BlobError, OSError, ValueError)
