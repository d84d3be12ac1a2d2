"""Wheels: the layout (wheel_layout.toml, wheel_layout.py), the deterministic zip writer (zip_writer.py), the
builder (wheel_build.py: the libraries checked and staged by wheel_stage.py, the dist-info from dist_metadata.py),
the PEP 517/660 build backend (build_backend.py) and the sdist (sdist.py), and one read of a wheel (wheel_scan.py)
with every check on it (wheel_checks.py: the content policy and ELF rules in wheel_contents.py, the symbol floor in
wheel_floor.py, the clients users run in wheel_clients.py).

Owns dist/*.whl; what it may import: jatools/stages.py.
"""
