"""Wheels: the layout (wheel_layout.toml, wheel_layout.py), the deterministic zip writer (zip_writer.py), the
builder (also the PEP 517/660 build backend and the sdist: wheel_build.py), and one read of a wheel with every
check on it (RECORD, contents, ELF, symbol floor, the clients users run: wheel_checks.py).

Owns dist/*.whl; what it may import: jatools/stages.py.
"""
