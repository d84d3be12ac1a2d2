"""JIT libraries: the reuse decision, fetch, verify, what a wheel expects (jit_cache), shard merge and publish (publish).

Owns build/aiter_build's record and the `jit-libs-<cache-id>` releases. May import:
jatools.native (toolchain identity), jatools.config, jatools.atomic_write,
jatools.ci (retry, GitHub outputs) and the runtime's jax_aiter.fetch/manifest/integrity.
"""
