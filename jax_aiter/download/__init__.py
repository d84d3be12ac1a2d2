"""Getting the JIT libraries a lite wheel leaves out, and checking every byte of them (jax-aiter-fetch-mha,
`invoke jit.fetch`); the runtime's loader reads the same identity and trust rules. One module a concern:

- release: fetch a `jit-libs-<cache-id>` release: its manifest, the pins, every library verified, installed atomically
- transfer: the transfer of a release's files over HTTP(S), file:// or a folder: streamed, retried, resumed, verified
- manifest: the published, versioned description of one release (identity, libraries, blobs, parts)
- blob: decoding a published blob (zstd, possibly split into parts), hashed as it is written
- reuse_gate: when two JIT-library builds are interchangeable: the gated identity fields and the cache id
- trust: who else could change a folder or file the runtime loads code from, or a fetch writes into
- provenance: build provenance of fetched libraries (`gh attestation verify` where the GitHub CLI is present)
- folder_lock: an exclusive lock on a folder itself, so writers of one folder take turns
- progress: byte progress for long transfers: a live bar on a terminal, a few plain lines in CI logs

Runs at runtime, so nothing here imports JAX.
"""
