"""CI plumbing: the environment report and the convergence-decision check.

Small services every stage uses. May import: jatools.config, jatools.atomic_write,
jatools.native (toolchain identity for the environment report).
"""
