"""JIT libraries after the build: the record and verify (record), what a wheel expects (expect), the reuse
decision (decide), fetch (download), shard merge (merge), publish (publish), and the command-line errors (errors).

Owns build/aiter_build's record and the `jit-libs-<cache-id>` releases. What each module may import:
jatools/stages.py.
"""
