"""Wheels: the layout (wheel_layout.toml), the deterministic writer, and the checks (RECORD, contents, ELF, floor).

Owns dist/*.whl. May import: jatools.jitlibs (what a wheel pins), jatools.config,
jatools.atomic_write and the runtime's jax_aiter.integrity.
"""
