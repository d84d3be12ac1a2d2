"""Testing: the tiers and their tag filters, GPU slots, and the pytest plugins the tier runs load.

Owns how tests are selected, pinned to GPUs and run. May import: jatools.config, jax_aiter.settings,
jatools.atomic_write. The pytest plugins import only the standard library and
their siblings here, so they load fast in every xdist worker.
"""
