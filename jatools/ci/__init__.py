"""CI plumbing: the environment report, the convergence-decision check, GitHub outputs, retries.

Small services every stage uses. May import: jatools.config, jatools.atomic_write,
jatools.native (toolchain identity for the environment report).
"""
