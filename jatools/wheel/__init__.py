"""Wheels: the layout (wheel_layout.toml), the deterministic writer (also the PEP 517/660 build backend and the
sdist: wheel_build.py), and the checks (RECORD, contents, ELF, floor, the clients users run).

Owns dist/*.whl. May import: jatools.jitlibs (what a wheel pins), jatools.config,
jatools.atomic_write and the runtime's jax_aiter.integrity.
"""
