"""Testing: the tiers and their tag filters (tag_filters), the tier runner (tiers), GPU slots (gpu_slots), the
pytest plugin the runs load (pytest_plugin) and the slot speed-up measurement (speedup).

Owns how tests are selected, pinned to GPUs and run; what it may import: jatools/stages.py.
The plugin imports only the standard library and the stdlib-only modules here,
so it loads fast in every xdist worker.
"""
