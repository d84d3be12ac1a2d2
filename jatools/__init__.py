"""Build, packaging and CI tooling for jax-aiter (not shipped in the wheel).

Each module holds one responsibility; noxfile.py, tasks.py and the ci/ scripts
wire them to the command line.
"""
